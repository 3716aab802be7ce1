"""The native frame builder's IPv4 checksum, computed from the header's fields instead of
read back from the written header, against optireduce/ubt.py byte for byte: addresses and
lengths whose one's-complement sums carry, and a parse of each frame (checksum verified)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from optireduce import ubt
from optireduce.host.native import _engine

PORT = 17017
HEADER = ubt.UbtHeader(
    version=1, msg_type=1, flags=0, exponent=-3, job_id=1, sender=0, op_id=5, pkt_index=0,
    count=0, contributors=0, t_c_us=100, op_len=64, world=4, reserved=0,
)  # fmt: skip
# ip_len = 60 + 4 count must fit its 16-bit field
MAX_COUNT = (0xFFFF - ubt.IP_LEN - ubt.UDP_LEN - ubt.HEADER_LEN) // 4


@settings(max_examples=200, deadline=None)
@given(
    ip_base=st.one_of(
        st.sampled_from([0, 0xFFFF0000, 0xFFFFFFF0, 0xFFFEFFF0, 0x0A00FFF8, 0xC6120000]),
        st.integers(0, 2**32 - 64),
    ),
    src=st.integers(0, 7),
    dst=st.integers(0, 7),
    count=st.one_of(st.sampled_from([0, 1, MAX_COUNT]), st.integers(0, MAX_COUNT)),
)
def test_checksum_from_fields_equals_the_model(ip_base, src, dst, count):
    a = ubt.Addressing(ip_base=ip_base)
    h = HEADER._replace(count=count)
    values = np.arange(count, dtype=np.int32) * 7919 - 3
    want = ubt.build_frame(h, ubt.payload_bytes(values), src=src, dst=dst, port=PORT, addressing=a)
    got = _engine.wire_build_frame(tuple(h), values, src, dst, PORT, a.mac_base, a.ip_base)
    assert got == want
    ip = got[ubt.ETH_LEN : ubt.ETH_LEN + ubt.IP_LEN]
    assert ubt.ipv4_checksum(ip) == 0  # a header with a good checksum sums to 0
