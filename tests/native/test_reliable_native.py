"""The native reliable baselines (host/native/reliable.py, src/reliable_live.cpp): several
ranks in this process, each with its engine thread and a real UDP socket on 127.0.0.1.

Lossless, native ring and TAR equal the Python baselines (experiments/baselines.py over
host/reliable.py) bit for bit, and both equal the documented summation order computed here
with numpy; impaired (loss, duplication, reordering, ACKs included), the bits stay the lossless
ones and the layer reports the retransmissions it needed; a dead peer ends in a bounded
TimeoutError naming the rank and the step; datagrams from outside the job, or malformed ones
from a member, are counted and change nothing.
"""

from __future__ import annotations

import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from optireduce.experiments.baselines import reliable_ring_allreduce, reliable_tar_allreduce
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.native.reliable import NativeReliable
from optireduce.host.reliable import ReliableEndpoint
from optireduce.host.transport import UdpTransport

HEADER = struct.Struct("!2sBBIIIIIII")  # host/reliable.py's


def inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def documented(xs: list[np.ndarray], algo: str) -> np.ndarray:
    """baselines.py's order: ring chunk c summed over ranks c, c+1, ..., c-1; TAR chunk j
    over ranks 0..N-1; float32 throughout, then divided by N."""
    world, n = len(xs), xs[0].size
    edges = [n * k // world for k in range(world + 1)]
    out = np.empty(n, np.float32)
    for c in range(world):
        a, b = edges[c], edges[c + 1]
        order = [(c + k) % world for k in range(world)] if algo == "ring" else range(world)
        s = None
        for r in order:
            s = xs[r][a:b].copy() if s is None else (s + xs[r][a:b]).astype(np.float32)
        out[a:b] = s / np.float32(world)
    return out


def transports(world: int, impairment: ImpairmentSpec | None = None, seed: int = 0):
    trs = [
        UdpTransport(r, bind=("127.0.0.1", 0), impairment=impairment, seed=seed * 100 + r)
        for r in range(world)
    ]
    for t in trs:
        t.connect([u.address for u in trs])
    return trs


def run_all(world: int, fn, timeout_s: float = 120):
    """fn(rank) on every rank at once (one thread each); their results by rank."""
    with ThreadPoolExecutor(world) as pool:
        futs = [pool.submit(fn, r) for r in range(world)]
        return [f.result(timeout=timeout_s) for f in futs]


def python_baselines(xs: list[np.ndarray]):
    world = len(xs)
    trs = transports(world)
    try:
        eps = [ReliableEndpoint(t) for t in trs]
        ring = run_all(world, lambda r: reliable_ring_allreduce(eps[r], r, world, xs[r]))
        tar = run_all(world, lambda r: reliable_tar_allreduce(eps[r], r, world, xs[r]))
        run_all(world, lambda r: eps[r].settle(timeout=20, quiet_s=0.2))
    finally:
        for t in trs:
            t.close()
    return ring, tar


class NativeWorld:
    def __init__(self, world: int, impairment: ImpairmentSpec | None = None, seed: int = 0):
        self.trs = transports(world, impairment, seed)
        self.nodes = [NativeReliable(r, world, self.trs[r]) for r in range(world)]

    def run(self, fn):
        return run_all(len(self.nodes), lambda r: fn(r, self.nodes[r]))

    def close(self, settle: bool = True) -> None:
        try:
            if settle:
                self.run(lambda r, n: n.settle(timeout=20, quiet_s=0.2))
        finally:
            for n in self.nodes:
                n.close(settle=False)
            for t in self.trs:
                t.close()


@pytest.mark.parametrize(
    ("world", "n"),
    [(3, 100_003), (4, 300_001), (4, 2)],
    ids=["3 ranks", "4 ranks, several datagrams per chunk", "4 ranks, 2 elements"],
)
def test_lossless_native_equals_python_baselines_bit_for_bit(world, n):
    xs = inputs(world, n, seed=world * 7 + n % 5)
    py_ring, py_tar = python_baselines(xs)
    w = NativeWorld(world)
    try:
        ring = w.run(lambda r, node: node.ring_allreduce(xs[r]))
        tar = w.run(lambda r, node: node.tar_allreduce(xs[r]))
        again = w.run(lambda r, node: node.ring_allreduce(xs[r]))  # tags reused, seq in order
        counters = [node.counters() for node in w.nodes]
    finally:
        w.close()
    want_ring, want_tar = documented(xs, "ring"), documented(xs, "tar")
    for r in range(world):
        np.testing.assert_array_equal(py_ring[r], want_ring)
        np.testing.assert_array_equal(py_tar[r], want_tar)
        assert ring[r].tobytes() == py_ring[r].tobytes()
        assert tar[r].tobytes() == py_tar[r].tobytes()
        assert again[r].tobytes() == py_ring[r].tobytes()
    for c in counters:
        # retransmissions may happen (a rank descheduled past the 10 ms RTO floor on the
        # loaded machine); without impairment nothing is lost, so every one is a duplicate
        assert c["duplicates"] <= sum(k["retransmissions"] for k in counters)
        assert c["impairment_lost"] == c["impairment_duplicated"] == 0
        assert c["foreign"] == c["malformed"] == c["not_member"] == 0
        assert c["collectives"] == 3
        # ring: 2(N-1) messages per call, TAR: 2(N-1)
        assert c["messages_sent"] == c["messages_delivered"] == 3 * 2 * (world - 1)


def test_impaired_native_gives_the_lossless_bits_and_retransmits():
    world, n = 4, 400_000
    xs = inputs(world, n, seed=11)
    spec = ImpairmentSpec(median_us=300, p99_ratio=3.0, loss=0.05, duplicate=0.05, reorder=0.1)
    w = NativeWorld(world, spec, seed=3)
    try:
        got = {
            algo: w.run(lambda r, node, a=algo: getattr(node, f"{a}_allreduce")(xs[r]))
            for algo in ("ring", "tar")
        }
        counters = [node.counters() for node in w.nodes]
    finally:
        w.close()
    for algo in ("ring", "tar"):
        want = documented(xs, algo)
        for r in range(world):
            assert got[algo][r].tobytes() == want.tobytes(), (algo, r)
    total = {k: sum(c[k] for c in counters) for k in counters[0]}
    assert total["impairment_lost"] > 0 and total["impairment_duplicated"] > 0
    assert total["impairment_reordered"] > 0
    assert total["retransmissions"] > 0
    assert total["duplicates"] > 0  # the impairment's copies, dropped by the layer
    assert total["malformed"] == total["foreign"] == 0


@pytest.mark.parametrize("algo", ["ring", "tar"])
def test_dead_peer_ends_in_a_bounded_timeout_error(algo):
    world, n, timeout = 3, 30_000, 0.5
    xs = inputs(world, n, seed=2)
    trs = transports(world)  # rank 2's socket exists and nobody reads it
    nodes = [NativeReliable(r, world, trs[r]) for r in range(2)]
    try:

        def one(r: int):
            t0 = time.monotonic()
            try:
                getattr(nodes[r], f"{algo}_allreduce")(xs[r], timeout=timeout)
            except TimeoutError as e:
                return str(e), time.monotonic() - t0
            return None, time.monotonic() - t0

        res = run_all(2, one)
    finally:
        for node in nodes:
            node.close(settle=False)
        for t in trs:
            t.close()
    for r, (msg, dt) in enumerate(res):
        assert msg is not None, f"rank {r} did not time out"
        assert f"rank {r} waited" in msg and "from rank" in msg, msg
        assert dt < 4 * timeout + 2, dt  # bounded: a few steps at most, never a hang
    msg0 = res[0][0]
    if algo == "ring":  # rank 0's left neighbour is the dead rank 2
        assert "reduce-scatter step 0" in msg0 and "from rank 2" in msg0, msg0
    else:  # rank 0 owns chunk 0 and waits for rank 2's part of it
        assert "scatter" in msg0 and "from rank 2" in msg0, msg0


def _malformed(rank: int) -> list[bytes]:
    """Datagrams a member could send that are ours by magic but inconsistent."""
    ok = dict(src=rank, tag=0x52000000, msg=12345, seq=0, frag=0, nfrags=1, ts=0)

    def data(body: bytes = b"", **kw: int) -> bytes:
        f = {**ok, **kw}
        return HEADER.pack(b"RM", 0, 1, f["src"], f["tag"], f["msg"], f["seq"], f["frag"],
                           f["nfrags"], f["ts"]) + body  # fmt: skip

    return [
        data(nfrags=0),
        data(frag=5, nfrags=5),
        data(b"x" * 10, frag=0, nfrags=2),  # a fragment before the last must be full
        data(nfrags=1 << 30),
        HEADER.pack(b"RM", 1, 1, rank, 0, 0, 0, 0, 1, 0) + struct.pack("!II", 7, 4096),  # cut
    ]


def test_outsider_and_malformed_datagrams_are_counted_and_change_nothing():
    world, n = 3, 200_000
    xs = inputs(world, n, seed=4)
    w = NativeWorld(world)
    outsider = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    outsider.bind(("127.0.0.1", 0))
    rng = np.random.default_rng(0)
    sent_outside = 0
    try:
        addrs = [t.address for t in w.trs]
        # from outside the job: garbage and well-formed headers naming a member
        for a in addrs:
            for k in range(20):
                body = rng.integers(0, 256, int(rng.integers(0, 2000)), dtype=np.uint8).tobytes()
                if k % 2:
                    body = HEADER.pack(b"RM", 0, 1, 0, 0x52000000, 0, 0, 0, 1, 0) + body
                outsider.sendto(body, a)
                sent_outside += 1
        # from member 1's own socket (the Python transport's, shared with its engine thread)
        # (bytes 6..7 name the sender when a datagram is that long: admission checks them)
        member = b"\x00" * 6 + b"\x00\x01"
        foreign = [
            b"",
            b"junk",
            member + b"\x00" * 32,
            b"RM\x00\x07\x00\x00\x00\x01" + b"\x00" * 60,
        ]
        for dst in (0, 2):
            for d in _malformed(1) + foreign:
                w.trs[1].sock.sendto(d, addrs[dst])
        ring = w.run(lambda r, node: node.ring_allreduce(xs[r]))
        tar = w.run(lambda r, node: node.tar_allreduce(xs[r]))
        counters = [node.counters() for node in w.nodes]
    finally:
        outsider.close()
        w.close()
    for r in range(world):
        assert ring[r].tobytes() == documented(xs, "ring").tobytes()
        assert tar[r].tobytes() == documented(xs, "tar").tobytes()
    assert sum(c["not_member"] for c in counters) == sent_outside
    for r in (0, 2):
        assert counters[r]["malformed"] == len(_malformed(1)), counters[r]
        assert counters[r]["foreign"] == len(foreign), counters[r]
    assert counters[1]["malformed"] == counters[1]["foreign"] == 0


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="rank 3"):
        NativeReliable(3, 3)
    tr = transports(2)
    nodes = [NativeReliable(r, 2, tr[r]) for r in range(2)]
    try:
        with pytest.raises(ValueError, match="empty"):
            nodes[0].ring_allreduce(np.zeros(0, np.float32))
        with pytest.raises(ValueError, match="timeout"):
            nodes[0].tar_allreduce(np.zeros(4, np.float32), timeout=0)
        with pytest.raises(ValueError, match="addresses"):
            nodes[0].connect([("127.0.0.1", 1)])
        from optireduce.host.native import _engine

        live = _engine.ReliableLive(0, 2)
        try:
            with pytest.raises(ValueError, match="algo"):
                live.allreduce("tree", np.zeros(4, np.float32), np.zeros(4, np.float32))
            x = np.zeros(8, np.float32)
            with pytest.raises(ValueError, match="overlap"):
                live.allreduce("ring", x, x)
            with pytest.raises(ValueError, match="connect"):
                live.allreduce("ring", x, np.zeros(8, np.float32))
        finally:
            live.stop()
        with pytest.raises(ValueError, match="max_datagram"):
            _engine.ReliableLive(0, 2, max_datagram=10)
        # ranks reducing different lengths: the mismatch is named, nobody hangs
        xs = [np.ones(1000, np.float32), np.ones(1200, np.float32)]

        def one(r: int):
            try:
                nodes[r].ring_allreduce(xs[r], timeout=1.0)
            except (ValueError, TimeoutError) as e:
                return type(e).__name__, str(e)
            return None

        res = run_all(2, one)
        assert any(x and x[0] == "ValueError" and "same length" in x[1] for x in res), res
    finally:
        for node in nodes:
            node.close(settle=False)
        for t in tr:
            t.close()


def test_native_and_python_ranks_share_one_wire_format():
    # ranks 0 and 1 native, rank 2 Python: the same header, ACKs and rules on the wire
    world, n = 3, 150_000
    xs = inputs(world, n, seed=6)
    trs = transports(world)
    nodes = [NativeReliable(r, world, trs[r]) for r in range(2)]
    ep = ReliableEndpoint(trs[2])
    try:

        def one(r: int, algo: str) -> np.ndarray:
            if r < 2:
                return getattr(nodes[r], f"{algo}_allreduce")(xs[r], timeout=20)
            fn = reliable_ring_allreduce if algo == "ring" else reliable_tar_allreduce
            return fn(ep, r, world, xs[r], timeout=20)

        got = {a: run_all(world, lambda r, a=a: one(r, a)) for a in ("ring", "tar")}
        run_all(
            world,
            lambda r: nodes[r].settle(20, 0.2) if r < 2 else ep.settle(timeout=20, quiet_s=0.2),
        )
    finally:
        for node in nodes:
            node.close(settle=False)
        for t in trs:
            t.close()
    for algo in ("ring", "tar"):
        for r in range(world):
            assert got[algo][r].tobytes() == documented(xs, algo).tobytes(), (algo, r)


def test_world_of_one_returns_a_copy():
    with NativeReliable(0, 1) as node:
        x = np.arange(5, dtype=np.float32)
        for out in (node.ring_allreduce(x), node.tar_allreduce(x)):
            assert out.tobytes() == x.tobytes() and out is not x


def test_bench_uses_native_baselines_with_the_native_engine(caplog):
    from optireduce.experiments.bench_collective import _baselines

    trs = transports(2)
    try:
        native, why = _baselines("native", trs[0], 0, 2, 16408)
        assert native.implementation == "native" and why == ""
        assert native.cfg.max_datagram == 16408  # OptiReduce's datagram length
        assert isinstance(native, NativeReliable)
        native.close(settle=False)
        with caplog.at_level("INFO", logger="optireduce"):
            python, why = _baselines("software", trs[1], 1, 2, 16408)
        assert python.implementation == "python" and "software" in why
        assert python.ep.cfg.max_datagram == 16408
        assert [r.getMessage() for r in caplog.records] == [
            f"optireduce rank 1: Python reliable baselines ({why})"
        ]
    finally:
        for t in trs:
            t.close()
