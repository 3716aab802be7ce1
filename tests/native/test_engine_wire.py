"""The native wire layer (host/native/src/wire.cpp) against optireduce/ubt.py and
optireduce/frame_checks.py: frames byte for byte, every parse and check decision equal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optireduce import frame_checks, ubt
from optireduce.host.native import _engine
from optireduce.params import NicParams

P = NicParams(p=8, b=32, c=128, n_max=8, ops_in_flight=2)
A = ubt.DEFAULT_ADDRESSING
WIRE = (A.mac_base, A.ip_base)
MSG_TYPES = (ubt.MSG_SCATTER, ubt.MSG_GATHER)

# Field ranges that reach every check: small values around the valid ones, and the extremes.
U8, U16, U32 = 0xFF, 0xFFFF, 0xFFFFFFFF


def near(valid: list[int], top: int) -> st.SearchStrategy[int]:
    """Mostly one of `valid`, sometimes anything in 0..top."""
    pick = st.tuples(st.integers(0, 15), st.sampled_from(valid), st.integers(0, top))
    return pick.map(lambda t: t[2] if t[0] == 15 else t[1])


headers = st.builds(
    ubt.UbtHeader,
    version=near([1], U8),
    msg_type=near([1, 2, 3], U8),
    flags=near([0, 1, 2], U8),
    exponent=st.integers(-128, 127),
    job_id=near([P.job_id, 0], U16),
    sender=near([0, 1, 2, 3, 9], U16),
    op_id=near([0, 1, 2, 3, 4, 5], U32),
    pkt_index=near(list(range(20)), U32),
    count=near([P.p, P.p - 1, 0], U16),
    contributors=near([0, 1, 3, 4], U16),
    t_c_us=near([0, 1, 500], U32),
    op_len=near([1, 31, 32, 33, 128, 129, 0], U32),
    world=near([4, 3], U16),
    reserved=near([0, 0, 1], U16),
)


def model_parse(r: ubt.ParsedFrame | str) -> object:
    return r if isinstance(r, str) else (tuple(r.header), bytes(r.payload))


@settings(max_examples=300, deadline=None)
@given(h=headers, src=st.integers(0, 7), dst=st.integers(0, 7), seed=st.integers(0, 2**32 - 1))
def test_frames_are_built_byte_for_byte(h, src, dst, seed):
    count = h.count % 64  # keep payloads small
    h = h._replace(count=count)
    values = np.random.default_rng(seed).integers(-(2**31), 2**31, count, dtype=np.int32)
    want = ubt.build_frame(h, ubt.payload_bytes(values), src=src, dst=dst, port=P.udp_port)
    got = _engine.wire_build_frame(tuple(h), values, src, dst, P.udp_port, *WIRE)
    assert got == want


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A frame to rank 1: built right, then perhaps made wrong in one way."""
    h = draw(headers)
    values = np.arange(h.count % 40, dtype=np.int32) - 7
    if draw(st.integers(0, 3)):  # mostly a count that agrees with the payload
        h = h._replace(count=len(values))
    if draw(st.integers(0, 3)) and h.msg_type in MSG_TYPES:  # mostly consistent counts
        h = h._replace(contributors=0 if h.msg_type == ubt.MSG_SCATTER else 1, world=4)
    src, dst = draw(st.integers(0, 5)), draw(st.sampled_from([1] * 6 + [2]))
    port = draw(st.sampled_from([P.udp_port] * 6 + [53]))
    f = bytearray(ubt.build_frame(h, ubt.payload_bytes(values), src=src, dst=dst, port=port))
    how = draw(st.sampled_from(["as built"] * 3 + ["overwrite", "overwrite+csum", "cut", "grow"]))
    if how.startswith("overwrite"):
        for _ in range(draw(st.integers(1, 2))):
            pos = draw(st.integers(0, ubt.L2_L4_LEN + 3))  # mostly the L2-L4 headers
            f[pos] = draw(st.integers(0, 255))
        if how.endswith("csum"):  # a right IPv4 checksum, so the later checks are reached
            f[24:26] = b"\0\0"
            f[24:26] = ubt.ipv4_checksum(bytes(f[14:34])).to_bytes(2, "big")
    elif how == "cut":
        f = f[: draw(st.sampled_from([0, 13, 33, 41, 42, 73, 74, len(f) - 1]))]
    elif how == "grow":
        f += bytes(draw(st.sampled_from([1, 4])))
    return bytes(f)


@st.composite
def check_cases(draw: st.DrawFn) -> tuple[ubt.UbtHeader, int, int, int]:
    """(header, rank, world, base) with fields near the edges of every receiver check."""
    world = draw(st.integers(2, 5))
    rank = draw(st.integers(0, world - 1))
    base = draw(st.integers(0, 6))
    msg = draw(st.sampled_from([ubt.MSG_SCATTER, ubt.MSG_GATHER]))
    op_len = draw(near([1, 31, 32, 33, 64, 128, 129, 0], U32))
    n_packets = P.packets_for(min(max(op_len, 1), P.c))
    h = ubt.UbtHeader(
        version=1, msg_type=msg, flags=0, exponent=0,
        job_id=draw(near([P.job_id], U16)),
        sender=draw(near(list(range(world + 1)), U16)),
        op_id=draw(near(list(range(max(0, base - 1), base + 2 * P.ops_in_flight + 1)), U32)),
        pkt_index=draw(near(list(range(n_packets + 1)), U32)),
        count=draw(near([P.p], U16)), contributors=0 if msg == ubt.MSG_SCATTER else 1,
        t_c_us=100, op_len=op_len, world=draw(near([world], U16)), reserved=0,
    )  # fmt: skip
    return h, rank, world, base


@settings(max_examples=700, deadline=None)
@given(f=frames())
def test_parse_frame_decides_as_the_model(f):
    want = model_parse(ubt.parse_frame(f, port=P.udp_port, rank=1))
    assert _engine.wire_parse_frame(f, P.udp_port, 1, *WIRE) == want


@settings(max_examples=300, deadline=None)
@given(f=frames(), inband=st.booleans())
def test_parse_ubt_decides_as_the_model(f, inband):
    d = f[ubt.L2_L4_LEN :]
    want = model_parse(ubt.parse_ubt(d, inband=inband))
    assert _engine.wire_parse_ubt(d, inband=inband) == want


@pytest.mark.parametrize("word", [0, 1, 0x8001, 0x7F01, 0xEC01, 0x0100, 0x0003, 0x0080, 0xFFFF])
def test_proposal_words_parse_as_the_model(word):
    h = ubt.UbtHeader(1, ubt.MSG_SCATTER, 0, -3, P.job_id, 0, 0, 0, P.p, 0, 7, 1, 2, word)
    frame = ubt.build_frame(h, bytes(4 * P.p), src=0, dst=1, port=P.udp_port)
    for inband in (False, True):
        want = model_parse(ubt.parse_frame(frame, port=P.udp_port, rank=1, inband=inband))
        assert _engine.wire_parse_frame(frame, P.udp_port, 1, *WIRE, inband=inband) == want
        ok = word == 0 or (inband and word & 0xFF == 1)
        assert (want == "malformed_header") != ok, (hex(word), inband)


@settings(max_examples=700, deadline=None)
@given(case=check_cases())
def test_receiver_checks_decide_as_the_model(case):
    h, rank, world, base = case
    want = frame_checks.check_peer(h, P, rank, world) or frame_checks.check_op(
        h, P, rank, world, base
    )
    assert _engine.wire_check(tuple(h), P, rank, world, base) == want


def test_every_drop_reason_and_counter_has_the_model_name():
    from optireduce.counters import COUNTERS

    assert tuple(_engine.counter_names()) == COUNTERS


def with_ip(frame: bytes, offset: int, data: bytes) -> bytes:
    """frame with IPv4 header bytes replaced and the checksum made right again."""
    f = bytearray(frame)
    f[14 + offset : 14 + offset + len(data)] = data
    f[24:26] = b"\0\0"
    f[24:26] = ubt.ipv4_checksum(bytes(f[14:34])).to_bytes(2, "big")
    return bytes(f)


def test_known_frames_give_known_reasons():
    # Each row: a frame made wrong in one way, and the reason the spec gives for it.
    h = ubt.UbtHeader(1, ubt.MSG_SCATTER, 0, -3, P.job_id, 0, 2, 1, P.p, 0, 400, 100, 4, 0)
    good = ubt.build_frame(h, bytes(4 * P.p), src=0, dst=1, port=P.udp_port)
    bad_csum = bytearray(good)
    bad_csum[24] ^= 1
    cases = {
        "truncated": good[:41],
        "not_ipv4": good[:12] + b"\x86\xdd" + good[14:],
        "bad_ip_checksum": bytes(bad_csum),
        "wrong_address": ubt.build_frame(h, bytes(4 * P.p), src=0, dst=2, port=P.udp_port),
        "wrong_port": ubt.build_frame(h, bytes(4 * P.p), src=0, dst=1, port=9),
        "bad_version": ubt.build_frame(
            h._replace(version=2), bytes(4 * P.p), src=0, dst=1, port=P.udp_port
        ),
        "bad_length": ubt.build_frame(h, bytes(4 * P.p - 4), src=0, dst=1, port=P.udp_port),
        "ip_fragment": with_ip(good, 6, b"\x20\x00"),  # more fragments
        "not_udp": with_ip(good, 9, b"\x06"),
        "bad_udp_length": good[:38] + (len(good) - 33).to_bytes(2, "big") + good[40:],
        "bad_ip_header": with_ip(good, 0, b"\x46"),
    }
    for reason, f in cases.items():
        assert _engine.wire_parse_frame(f, P.udp_port, 1, *WIRE) == reason
    hdr, payload = _engine.wire_parse_frame(good, P.udp_port, 1, *WIRE)
    assert hdr == tuple(h) and payload == bytes(4 * P.p)
