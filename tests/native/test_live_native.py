"""The live native NIC (host/native/nic.py, src/live.cpp): several ranks in this process,
each with its engine thread and a real UDP socket on 127.0.0.1.

Lossless, the results equal host/model/virtual_cluster.py's simulate_allreduce on the same
inputs and params bit for bit; impaired, every op ends within its bound and the injected
loss is what the ops report missing; datagrams from outside the job are counted and change
nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.host.native.nic import NativeNic
from optireduce.host.transport import UdpTransport
from optireduce.params import NicParams

LOOPBACK = {"p": 4096, "b": 16384, "c": 262144}  # 16 KiB datagrams, as the bench runs


class ThreadAgreement:
    """The max of every rank's exponent proposals, ranks being threads of this process."""

    def __init__(self, world: int) -> None:
        self.lists: list[list[int]] = [[] for _ in range(world)]
        self.barrier = threading.Barrier(world, timeout=60)

    def rank(self, r: int):
        def agree(proposals: list[int]) -> list[int]:
            self.lists[r] = list(proposals)
            self.barrier.wait()
            out = [max(v) for v in zip(*self.lists, strict=True)]
            self.barrier.wait()
            return out

        return agree


def inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def make_world(world: int, p: NicParams, impairment: ImpairmentSpec | None = None, seed: int = 0):
    """world NativeNics on the driver's path: each adopts a connected UdpTransport."""
    trs = [UdpTransport(r, impairment=impairment, seed=seed * 100 + r) for r in range(world)]
    for t in trs:
        t.connect([u.address for u in trs])
    agreement = ThreadAgreement(world)
    nics = [NativeNic(p, r, world, trs[r], agreement.rank(r)) for r in range(world)]
    return nics, trs


def close_world(nics, trs) -> None:
    for n in nics:
        n.close()
    for t in trs:
        t.close()


def run_all(nics, fn, timeout_s: float = 120):
    """fn(rank, nic) on every rank at once (one thread each); their results by rank."""
    with ThreadPoolExecutor(len(nics)) as pool:
        futs = [pool.submit(fn, r, nic) for r, nic in enumerate(nics)]
        return [f.result(timeout=timeout_s) for f in futs]


@pytest.mark.parametrize(
    ("world", "n", "params"),
    [(3, 40_000, {}), (4, 600_000, LOOPBACK)],
    ids=["3 ranks, 1 KiB packets", "4 ranks, 16 KiB packets"],
)
def test_lossless_live_equals_the_virtual_cluster_bit_for_bit(world, n, params):
    # t_C floored at t_B: a phase ends only when complete, so a rank the shared cores
    # deschedule costs time, not data
    p = NicParams(**params, t_b_us=5_000_000, t_c_min_us=5_000_000)
    xs = inputs(world, n, seed=5)
    nics, trs = make_world(world, p)
    try:
        got = run_all(nics, lambda r, nic: nic.allreduce(xs[r]))
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)
    n_ops = -(-n // p.c)
    assert n_ops == 3  # more ops than the window holds: K = 2 in flight, then the third
    for (out, stats), w, c in zip(got, want, counters, strict=True):
        np.testing.assert_array_equal(out, w)
        assert [s.op_id for s in stats] == list(range(n_ops))
        assert all(s.phase1_reason == s.phase2_reason == "complete" for s in stats)
        assert c["ops_completed"] == n_ops and c["not_member"] == 0
        assert c["rx_datagrams"] == c["rx_scatter"] + c["rx_gather"]
        assert c["tx_datagrams"] == c["tx_scatter"] + c["tx_gather"]


def test_torch_tensors_in_and_out_in_place():
    import torch  # a dependency of the test extras: missing means a broken install

    world, p = 3, NicParams(t_b_us=5_000_000, t_c_min_us=5_000_000)
    xs = inputs(world, 20_000, seed=8)
    nics, trs = make_world(world, p)
    try:
        ts = [torch.from_numpy(x.copy()) for x in xs]
        in_place = run_all(nics, lambda r, nic: nic.allreduce(ts[r], out=ts[r]))
        shaped = run_all(
            nics, lambda r, nic: nic.allreduce(torch.from_numpy(xs[r][:20]).view(4, 5))
        )
    finally:
        close_world(nics, trs)
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)
    for r, (t, stats) in enumerate(in_place):
        assert t is ts[r]  # written where it was read
        np.testing.assert_array_equal(t.numpy(), want[r])
        assert [s.op_id for s in stats] == [0, 1]
    ref = np.mean([x[:20].astype(np.float64) for x in xs], axis=0)
    for t, stats in shaped:
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == (4, 5)
        np.testing.assert_allclose(t.numpy().ravel(), ref, rtol=1e-5, atol=1e-6)
        assert [s.op_id for s in stats] == [2]


def test_outsider_and_spoofed_datagrams_are_counted_and_change_nothing():
    """Ranks 0 and 1 start; while they wait for rank 2, a stranger sends them garbage and
    rank 1's socket sends rank 0 a header claiming to be rank 2. Then rank 2 starts."""
    world, n = 3, 40_000
    p = NicParams(t_b_us=5_000_000, t_c_min_us=5_000_000)
    xs = inputs(world, n, seed=9)
    nics, trs = make_world(world, p)
    spoof = bytearray(ubt.HEADER_LEN + 4 * p.p)
    spoof[0:8] = bytes([1, ubt.MSG_SCATTER, 0, 0, 0, p.job_id, 0, 2])  # ... sender 2
    try:
        with ThreadPoolExecutor(world) as pool:
            early = [pool.submit(nics[r].allreduce, xs[r]) for r in (0, 1)]
            time.sleep(0.3)
            assert not any(f.done() for f in early)  # the op is in flight, waiting for rank 2
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
                stranger.bind(("127.0.0.1", 0))
                for payload in (b"", b"garbage", bytes(spoof)):
                    for r in (0, 1):
                        stranger.sendto(payload, trs[r].address)
            trs[1].sock.sendto(bytes(spoof), trs[0].address)
            time.sleep(0.1)
            late = pool.submit(nics[2].allreduce, xs[2])
            got = [f.result(timeout=60) for f in (*early, late)]
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)
    for (out, _), w in zip(got, want, strict=True):
        np.testing.assert_array_equal(out, w)
    assert [c["not_member"] for c in counters] == [3, 3, 0]
    assert [c["wrong_sender"] for c in counters] == [1, 0, 0]
    for c in counters:  # nothing of it reached an engine
        assert c["rx_datagrams"] == c["rx_scatter"] + c["rx_gather"]
        assert sum(c[k] for k in ubt.DROP_REASONS) == 0


def test_impaired_ops_end_within_their_bound_and_report_the_injected_loss():
    world, n = 3, 50_000
    spec = ImpairmentSpec(median_us=300, p99_ratio=3.0, loss=0.02)
    p = NicParams(t_b_us=2_000_000)
    xs = inputs(world, n, seed=6)
    nics, trs = make_world(world, p, impairment=spec, seed=6)
    try:
        t_bs = run_all(nics, lambda r, nic: nic.calibrate(xs[r][: 2 * p.c], ops=3))
        before = [nic.counters()["impairment_lost"] for nic in nics]
        got = run_all(nics, lambda r, nic: nic.allreduce(xs[r]))
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    assert before == [0] * world  # the warm-up ran over the reliable path
    assert len(set(t_bs)) == 1 and 0 < t_bs[0] < p.t_b_us  # calibrated, the same everywhere
    t_b = t_bs[0]
    ref = np.mean([x.astype(np.float64) for x in xs], axis=0)
    for _, stats in got:
        for s in stats:
            assert s.elapsed_us <= 2 * t_b + 200_000  # two phases, plus scheduling slack
            for phase, reason in ((1, s.phase1_reason), (2, s.phase2_reason)):
                missing = getattr(s, f"lost_phase{phase}")
                assert (missing == 0) == (reason == "complete")  # a cut phase says so
    lost = sum(s.lost_phase1 + s.lost_phase2 for _, stats in got for s in stats)
    expected = sum(s.p1_expected + s.p2_expected for _, stats in got for s in stats)
    injected = sum(c["impairment_lost"] for c in counters)
    assert injected > 0 and lost >= injected  # every dropped datagram is reported missing
    assert max(c["release_queue_max"] for c in counters) > 0
    # What the deadlines cut on top of the injected loss depends on how far apart the
    # threads started their ops on this shared machine (t_C is a few ms here): the error
    # is bounded when the cut was small.
    if lost <= 0.05 * expected:
        for out, stats in got:
            err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert err < 0.5, (t_b, err, [s.to_dict() for s in stats])
    for out, _ in got:
        assert np.isfinite(out).all()


def test_duplicated_and_reordered_datagrams_change_nothing():
    """Delay, duplication and reordering without loss: every op that got all its packets
    has the model's result bit for bit, and every extra copy is dropped by a receiver (as a
    duplicate, or late / stale once its op has moved on).

    A copy held back longer than its op lasts can arrive after the sender has started op
    j + K: the protocol then counts the sender as done with op j (it could start j + K only
    with j complete) and the held-back packet arrives late. That is the peer-progress rule
    of the model and the gateware, not a fault: such an op's missing packets must all come
    back as late drops, so nothing is lost unseen."""
    world, n = 3, 40_000
    spec = ImpairmentSpec(median_us=200, p99_ratio=1.5, duplicate=0.05, reorder=0.2)
    p = NicParams(t_b_us=5_000_000, t_c_min_us=5_000_000)
    xs = inputs(world, n, seed=12)
    nics, trs = make_world(world, p, impairment=spec, seed=12)
    try:
        got = run_all(nics, lambda r, nic: nic.allreduce(xs[r]))
        time.sleep(0.2)  # the last copies leave the release queues and arrive
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)
    missing = 0
    for (out, stats), w in zip(got, want, strict=True):
        for s in stats:
            a, b = s.op_id * p.c, min(n, (s.op_id + 1) * p.c)
            if s.lost_phase1 == s.lost_phase2 == 0:
                np.testing.assert_array_equal(out[a:b], w[a:b])
                assert s.phase1_reason == s.phase2_reason == "complete"
            missing += s.lost_phase1 + s.lost_phase2
    duplicated = sum(c["impairment_duplicated"] for c in counters)
    dropped = sum(c["duplicate"] + c["late"] + c["stale_op"] for c in counters)
    assert duplicated > 0 and dropped == duplicated + missing
    assert sum(c["impairment_reordered"] for c in counters) > 0
    assert sum(c["impairment_lost"] for c in counters) == 0


def test_loss_statistics_match_what_was_injected():
    """Loss only, and deadlines far above any scheduling hiccup: every datagram the
    impairment dropped is one packet some rank reports missing, and nothing else is."""
    world, n = 3, 60_000
    p = NicParams(t_b_us=3_000_000, t_c_min_us=1_000_000)
    xs = inputs(world, n, seed=7)
    nics, trs = make_world(world, p, impairment=ImpairmentSpec(loss=0.03), seed=7)
    try:
        got = run_all(nics, lambda r, nic: nic.allreduce(xs[r]))
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    lost = sum(s.lost_phase1 + s.lost_phase2 for _, stats in got for s in stats)
    injected = sum(c["impairment_lost"] for c in counters)
    assert injected > 0 and lost == injected


def test_control_calls_and_bad_arguments():
    world, p = 2, NicParams(t_b_us=5_000_000)
    with pytest.raises(ValueError, match="agree is required"):
        NativeNic(p, 0, world)
    # own sockets, connected after; rank 1 runs no op, so rank 0 agrees with itself
    nics = [NativeNic(p, r, world, agree=list) for r in range(world)]
    try:
        rcv, snd = nics[0].socket_buffers
        assert rcv > 0 and snd > 0
        with pytest.raises(ValueError, match="connect"):  # at once, not at a timeout
            nics[0].allreduce(np.ones(8, np.float32))
        for nic in nics:
            nic.connect([m.address for m in nics])
        with pytest.raises(ValueError, match="same address"):
            nics[0].connect([nics[0].address, nics[0].address])
        with pytest.raises(ValueError, match=r"outside 0\.\.world-1"):
            nics[0].exclude(5)
        with pytest.raises(ValueError, match="not the next op"):
            nics[0]._live.submit(7, np.zeros(4, np.float32), np.zeros(4, np.float32), 0)
        with pytest.raises(ValueError, match=r"1\.\.c="):
            nics[0]._live.submit(0, np.zeros(0, np.float32), np.zeros(0, np.float32), 0)
        with pytest.raises(ValueError, match="empty input"):
            nics[0].allreduce(np.zeros(0, np.float32))
        x = np.arange(10, dtype=np.float32)
        with pytest.raises(TypeError, match="contiguous float32"):
            nics[0].allreduce(x, out=np.zeros(10, np.float64))
        nics[1].set_t_b(1234)
        assert nics[1].p.t_b_us == 1234
        nics[0].exclude(1)
        assert nics[0].gone == {1}
        assert nics[1].gone == set()
        # with its only peer gone, rank 0 reduces alone: the mean of itself
        assert nics[0].next_op == 0
        with nics[0].transport.reliable():
            out, stats = nics[0].allreduce(x)
        np.testing.assert_allclose(out, x)
        assert stats[0].p1_received == stats[0].p2_received == 0
        assert nics[0].next_op == 1 and nics[0].transport.address == nics[0].address
    finally:
        t0 = time.monotonic()
        for nic in nics:
            nic.close()
            nic.close()  # idempotent
        assert time.monotonic() - t0 < 1.0  # every wait in the loop is bounded
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        nics[0].allreduce(x)
    with pytest.raises(RuntimeError, match="engine thread has stopped"):
        nics[0].counters()


def test_trace_has_every_datagram_its_delay_and_the_engines_verdict():
    """The trace (loss attribution's input): every UBT datagram each engine sent, with the
    delay the impairment drew for it (at least the late link's extra), and every one it
    received with the verdict (accepted here: a lossless op); origins on CLOCK_MONOTONIC put
    each arrival after its send plus its delay."""
    world, n = 3, 5_000
    spec = ImpairmentSpec(median_us=100, p99_ratio=3.0, extra_us=700)
    p = NicParams(t_b_us=2_000_000)
    xs = inputs(world, n, seed=9)
    nics, trs = make_world(world, p, impairment=spec, seed=9)
    try:
        for nic in nics:
            nic.set_trace(True)
        got = run_all(nics, lambda r, nic: nic.allreduce(xs[r]))
        traces = [nic.take_trace() for nic in nics]
        again = nics[0].take_trace()
        counters = [nic.counters() for nic in nics]
    finally:
        close_world(nics, trs)
    assert again["sent"].shape == (0, 7) and again["arrived"].shape == (0, 7)  # taken
    sends = {}
    for r, tr in enumerate(traces):
        assert tr["not_kept"] == 0
        sent, arrived = tr["sent"], tr["arrived"]
        assert len(sent) == counters[r]["tx_scatter"] + counters[r]["tx_gather"]
        assert len(arrived) == counters[r]["rx_scatter"] + counters[r]["rx_gather"]
        assert (sent[:, 6] == 700).all() and (sent[:, 5] >= 700).all()
        assert (arrived[:, 5] == -1).all()  # every one accepted
        for op, ph, dst, pkt, tick, delay, _ in sent.tolist():
            sends[(op, ph, r, dst, pkt)] = tr["origin_us"] + tick + delay
    for r, tr in enumerate(traces):
        for op, ph, src, pkt, tick, _, _ in tr["arrived"].tolist():
            due = sends.pop((op, ph, src, r, pkt))
            assert due - 50 <= tr["origin_us"] + tick  # clocks read within a few us
    assert not sends  # every send arrived once
    for _, stats in got:
        assert all(s.lost_phase1 == s.lost_phase2 == 0 for s in stats)
