"""UDP GSO and GRO in the native transport (src/transport.cpp): the live NIC puts several
datagrams to one peer in one GSO message and takes coalesced (GRO) messages apart again.

Rank 1 here is the Python model (NicModel) behind a plain socket with UDP_GRO on, which
sends its frames as GSO messages: the datagrams rank 0 sends arrive coalesced and, cut at
the segment size, are exactly the model's frames; rank 0 cuts rank 1's coalesced messages
back into datagrams, and both ranks' results equal the virtual cluster's bit for bit. With
OPTIREDUCE_UDP_GSO=0 every datagram travels alone and the results are the same. In a
keyed job (docs/security.md) every datagram of a GSO message carries its own tag: the fake
rank checks and strips them with hashlib after the GRO split, and tags its own.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.nic_model import NicModel
from optireduce.host.model.quantize import agree_exponent, propose_exponent
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.host.native.nic import NativeNic
from optireduce.host.transport import UdpTransport
from optireduce.params import NicParams

SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
L2_L4 = 14 + 20 + 8  # a model frame's Ethernet, IPv4 and UDP headers


def kernel_has_gso() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.getsockopt(SOL_UDP, UDP_SEGMENT)
            s.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            return False
    return True


def receive(sock: socket.socket, want: int, timeout_s: float = 20,
            key: bytes | None = None) -> tuple[list[bytes], int]:  # fmt: skip
    """`want` datagrams, GRO messages cut at their segment size (with a key: each one's tag
    checked and cut off); and how many messages held more than one."""
    out: list[bytes] = []
    coalesced = 0
    end = time.monotonic() + timeout_s
    while len(out) < want:
        assert time.monotonic() < end, f"{len(out)} of {want} datagrams arrived"
        sock.settimeout(max(0.01, end - time.monotonic()))
        data, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4))
        seg = len(data)
        for level, kind, value in anc:
            if level == SOL_UDP and kind == UDP_GRO:
                seg = struct.unpack("i", value[:4])[0]
        parts = [data[o : o + seg] for o in range(0, len(data), seg)]
        if key is not None:
            assert all(d[-ubt.TAG_LEN :] == ubt.header_tag(key, d[: -ubt.TAG_LEN]) for d in parts)
            parts = [d[: -ubt.TAG_LEN] for d in parts]
        coalesced += len(parts) > 1
        out += parts
    return out, coalesced


def send_gso(sock: socket.socket, to, datagrams: list[bytes], key: bytes | None = None) -> None:
    """Runs of equal-length datagrams in messages of up to 3 (< 64 KiB), one segment size each
    (with a key: each datagram tagged)."""
    if key is not None:
        datagrams = [d + ubt.header_tag(key, d) for d in datagrams]
    i = 0
    while i < len(datagrams):
        run = [datagrams[i]]
        while i + len(run) < len(datagrams) and len(run) < 3:
            if len(datagrams[i + len(run)]) != len(run[0]):
                break
            run.append(datagrams[i + len(run)])
        anc = [(SOL_UDP, UDP_SEGMENT, struct.pack("H", len(run[0])))] if len(run) > 1 else []
        sock.sendmsg([b"".join(run)], anc, 0, to)
        i += len(run)


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("gso", ["1", "0"], ids=["gso on", "gso off"])
def test_coalesced_datagrams_are_the_models_frames_both_ways(gso, keyed, monkeypatch):
    assert kernel_has_gso(), (
        "this kernel has no UDP GSO/GRO (Linux < 5.0): the engine falls back to plain sends, "
        "but this test needs a kernel >= 5.0 to check the coalesced path"
    )
    monkeypatch.setenv("OPTIREDUCE_UDP_GSO", gso)  # read when the native socket is set up
    p = NicParams(p=4096, b=16384, c=262144, t_b_us=5_000_000, t_c_min_us=5_000_000)
    n = 100_000  # 7 blocks of 16384: 28 packets, 14 owned by each rank
    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(2)]
    exponent = agree_exponent([propose_exponent(x, p) for x in xs])
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)

    fake = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # rank 1
    fake.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # 14 datagrams of 16 KiB
    fake.bind(("127.0.0.1", 0))
    fake.setsockopt(SOL_UDP, UDP_GRO, 1)
    key = bytes(range(32)) if keyed else None
    tr0 = UdpTransport(0, key=key)
    tr0.connect([tr0.address, fake.getsockname()])
    nic0 = NativeNic(p, 0, 2, tr0, lambda props: [max(e, exponent) for e in props])
    got0: list = []
    worker = threading.Thread(target=lambda: got0.append(nic0.allreduce(xs[0])))
    try:
        worker.start()
        model = NicModel(p, 1, 2)
        model.start_op(0, 0, xs[1], exponent)
        own = [t.frame[L2_L4:] for t in model.poll_tx()]  # its scatter packets for rank 0
        scatter, coalesced_scatter = receive(fake, 14, key=key)
        expected = NicModel(p, 0, 2)
        expected.start_op(0, 0, xs[0], exponent)
        assert sorted(scatter) == sorted(t.frame[L2_L4:] for t in expected.poll_tx())
        for d in scatter:
            model.receive_datagram(0, d)
        gathers = [t.frame[L2_L4:] for t in model.poll_tx()]  # phase 1 complete: its means
        assert len(own) == len(gathers) == 14
        send_gso(fake, tr0.address, own + gathers, key=key)
        rank0_gathers, coalesced_gather = receive(fake, 14, key=key)
        for d in rank0_gathers:
            model.receive_datagram(0, d)
        worker.join(timeout=30)
        assert not worker.is_alive()
        counters = nic0.counters()
    finally:
        nic0.close()
        tr0.close()
        fake.close()
    (out0, stats0), (res1,) = got0[0], model.poll_results()
    np.testing.assert_array_equal(out0, want[0])
    np.testing.assert_array_equal(res1.data, want[1])
    assert stats0[0].phase1_reason == stats0[0].phase2_reason == "complete"
    assert counters["rx_datagrams"] == counters["rx_scatter"] + counters["rx_gather"] == 28
    assert counters["tx_datagrams"] == 28 and counters["tx_resent"] == 0
    assert counters["not_member"] == counters["rx_oversize"] == counters["bad_tag"] == 0
    assert sum(counters[k] for k in ubt.DROP_REASONS) == 0
    if gso == "1":  # 14 datagrams to one peer: messages of 3 (49 KiB), so some coalesced
        assert coalesced_scatter > 0 and coalesced_gather > 0
    else:
        assert coalesced_scatter == coalesced_gather == 0
