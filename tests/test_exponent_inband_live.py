"""In-band exponent agreement on the live host backends (host/exponent_plan.py): ranks are
threads of this process, each NIC on its own UDP socket on 127.0.0.1.

Only the first L ops and the L ops after a resync call the reliable exchange; every other
op takes the exponent the NIC agreed from the proposals that rode ahead on the packets. The
native engine and the Python model give the same bits; the first call equals the
reliable-exchange virtual cluster bit for bit (every in-band exponent is then exactly the
max of the proposals); the ops after a call's end run at the predicted exponent, whose
quantization step bounds their error.
"""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.host.driver import SoftwareNic
from optireduce.host.exponent_plan import PREDICTION_MARGIN
from optireduce.host.model.quantize import propose_exponent
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.host.native.nic import NativeNic
from optireduce.host.transport import UdpTransport
from optireduce.params import NicParams
from tests.native.test_live_native import ThreadAgreement, inputs, run_all

WORLD, N = 3, 100_000  # 7 ops of at most c = 16 384: more than the lead of 2K = 4


class CountingAgreement(ThreadAgreement):
    """ThreadAgreement that records each rank's calls (the proposals it exchanged)."""

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.calls: list[list[list[int]]] = [[] for _ in range(world)]

    def rank(self, r: int):
        inner = super().rank(r)

        def agree(proposals: list[int]) -> list[int]:
            self.calls[r].append(list(proposals))
            return inner(proposals)

        return agree


def run(backend: str, p: NicParams, calls: list[list[np.ndarray]], resync_after: int | None):
    """Each call's inputs (one array per rank) through one world of `backend` NICs."""
    trs = [UdpTransport(r) for r in range(WORLD)]
    for t in trs:
        t.connect([u.address for u in trs])
    agreement = CountingAgreement(WORLD)
    cls = {"native": NativeNic, "software": SoftwareNic}[backend]
    nics = [cls(p, r, WORLD, trs[r], agreement.rank(r)) for r in range(WORLD)]

    def job(r: int, nic):
        outs, stats = [], []
        for k, xs in enumerate(calls):
            if resync_after is not None and k == resync_after + 1:
                nic.resync()
            out, st = nic.allreduce(xs[r])
            outs.append(out)
            stats.append(st)
        return outs, stats, nic.counters()

    try:
        got = run_all(nics, job, timeout_s=300)
    finally:
        for nic in nics:
            nic.close()
        for t in trs:
            t.close()
    return got, agreement.calls


P = NicParams(t_b_us=5_000_000, t_c_min_us=5_000_000, exp_inband=True)
LEAD = P.exp_lead_eff


@pytest.fixture(scope="module")
def three_calls():
    first = inputs(WORLD, N, seed=11)
    second = [x * 0.25 for x in inputs(WORLD, N, seed=12)]  # smaller: the prediction is wide
    third = inputs(WORLD, N, seed=13)
    calls = [first, second, third]
    return calls, {b: run(b, P, calls, resync_after=1) for b in ("native", "software")}


def test_only_the_first_ops_and_a_resync_use_the_exchange(three_calls):
    calls, runs = three_calls
    n_ops = -(-N // P.c)
    for _, agreed in runs.values():
        for r in range(WORLD):
            # call 1: its first L ops; call 2: none; call 3 (after resync): its first L
            want = [[propose_exponent(calls[k][r][a : a + P.c], P) for a in range(0, N, P.c)]
                    for k in (0, 2)]  # fmt: skip
            assert agreed[r] == [want[0][:LEAD], want[1][:LEAD]]
    for got, _ in runs.values():
        for _, _, c in got:
            assert c["exp_given"] == 2 * LEAD
            assert c["exp_inband"] == 3 * n_ops - 2 * LEAD
            assert c["exp_incomplete"] == c["exp_followed"] == c["exp_saturated"] == 0
            assert c["exponent_mismatch"] == 0


def test_native_and_model_give_the_same_bits(three_calls):
    _, runs = three_calls
    for (n_outs, n_stats, _), (s_outs, s_stats, _) in zip(
        runs["native"][0], runs["software"][0], strict=True
    ):
        for a, b in zip(n_outs, s_outs, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(n_stats, s_stats, strict=True):
            assert [s.exponent for s in a] == [s.exponent for s in b]


def test_first_call_equals_the_reliable_exchange_bit_for_bit(three_calls):
    calls, runs = three_calls
    want, _ = simulate_allreduce(calls[0], params=P.replace(exp_inband=False), calibrate=False)
    for outs, _, _ in runs["native"][0]:
        np.testing.assert_array_equal(outs[0], want[0])


def test_ops_past_a_call_run_at_the_predicted_exponent(three_calls):
    calls, runs = three_calls
    props = [[propose_exponent(x[a : a + P.c], P) for a in range(0, N, P.c)] for x in calls[0]]
    predicted = max(max(props[r]) for r in range(WORLD))
    predicted += PREDICTION_MARGIN
    exact = [max(propose_exponent(x[a : a + P.c], P) for x in calls[1]) for a in range(0, N, P.c)]
    mean = np.mean([x.astype(np.float64) for x in calls[1]], axis=0)
    for outs, stats, _ in runs["native"][0]:
        second = stats[1]
        assert [s.exponent for s in second] == [predicted] * LEAD + exact[LEAD:]
        # a coarser step, never saturation: error within a few steps of 2^E per element
        err = np.abs(outs[1][: LEAD * P.c] - mean[: LEAD * P.c])
        assert err.max() < 4 * 2.0**predicted
        assert all(s.sat_quantize == 0 for s in second)


def test_a_call_after_another_is_predicted_from_the_last_time_it_followed_it():
    """Two buckets of different scale in turn, as DDP hands them over every step: A (small
    gradients, 80 000 elements) then B (2^12 times larger, 100 000). In round 1 the first
    L ops of B ride on A's prediction (A's largest proposal + margin): far too small, they
    saturate. In round 2 they ride on what B proposed for those ops in round 1 (+ margin):
    no saturation, and each such op runs at exactly that exponent (max over the ranks)."""
    a1, a2 = ([x[:80_000] * 2.0**-6 for x in inputs(WORLD, N, seed=s)] for s in (21, 23))
    b1, b2 = ([x * 2.0**6 for x in inputs(WORLD, N, seed=s)] for s in (22, 24))
    (got, _) = run("native", P, [a1, b1, a2, b2], resync_after=None)
    b_round1 = [[propose_exponent(x[a : a + P.c], P) for a in range(0, N, P.c)] for x in b1]
    want = [max(b_round1[r][k] for r in range(WORLD)) + PREDICTION_MARGIN for k in range(LEAD)]
    for _, stats, c in got:
        first_b, second_b = stats[1], stats[3]
        assert sum(s.sat_quantize > 0 for s in first_b[:LEAD]) == LEAD
        assert [s.exponent for s in second_b[:LEAD]] == want
        assert all(s.sat_quantize == 0 for s in second_b)
        assert c["exp_saturated"] == LEAD  # round 1's, on every rank
