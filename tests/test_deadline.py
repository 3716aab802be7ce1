"""t_C estimator, consensus and LAST-flag counts against hand-computed integer sequences."""

import math

import numpy as np

from optireduce.host.model.deadline import (
    COMPLETE,
    DEADLINE,
    EARLY,
    PhaseTracker,
    TcEstimator,
    agreed_timeout,
    flagged_count,
)
from optireduce.params import NicParams


def test_tc_estimator_follows_the_integer_ewma():
    p = NicParams(t_b_us=1000)
    est = TcEstimator(p)
    assert est.tc == 1000  # t_c_init defaults to t_B
    assert est.sample(100) == 100 + 4 * 50  # first sample: mean = s, dev = s / 2
    # second: err = 20; mean = 100 + (20 >> 3) = 102; dev = 50 + ((20 - 50) >> 2) = 50 - 8 = 42
    assert est.sample(120) == 102 + 4 * 42
    # err = -102 -> mean = 102 + (-102 >> 3) = 102 - 13 = 89; dev = 42 + ((102 - 42) >> 2) = 57
    assert est.sample(0) == 89 + 4 * 57
    # clamped to t_B
    assert est.sample(10_000) == 1000


def test_agreed_timeout_is_the_lower_median_capped_by_tb():
    assert agreed_timeout(np.array([5, 1, 9]), 100) == 5
    assert agreed_timeout(np.array([5, 1, 9, 7]), 100) == 5  # lower median of 1 5 7 9
    assert agreed_timeout(np.array([500, 300]), 100) == 100


def test_flagged_count_is_the_last_percentile():
    assert [flagged_count(n, 1) for n in (0, 1, 99, 100, 101, 250)] == [0, 1, 1, 1, 2, 3]
    assert flagged_count(10, 50) == 5 and flagged_count(3, 100) == 3


def test_phase_tracker_rules_and_samples():
    exp = np.array([0, 2, 2])
    ph = PhaseTracker(exp, alpha_q8=64)
    ph.begin(10)
    ph.arrive(12, 1, False)
    ph.arrive(14, 1, True)
    ph.arrive(15, 2, True)  # sender 2 owes one more, but its LAST is in
    assert ph.due(100, 400, 0) is None
    assert ph.next_timer(400, 0) == 15 + 100  # alpha * T = 400 / 4
    assert ph.due(115, 400, 0) == (115, EARLY)
    assert ph.finish(115, EARLY, 400) == 5  # sample: last arrival - start

    ph = PhaseTracker(exp, alpha_q8=64)
    ph.begin(0)
    ph.arrive(3, 1, False)
    assert ph.due(1000, 400, 0) == (400, DEADLINE)
    assert ph.finish(400, DEADLINE, 400) == 400  # a deadline samples the whole wait

    ph = PhaseTracker(exp, alpha_q8=64)
    for t, s in ((1, 1), (2, 1), (3, 2), (4, 2)):
        ph.arrive(t, s, False)
    ph.begin(50)  # everything came before the phase: no information for t_C
    assert ph.due(50, 400, 0) == (50, COMPLETE)
    assert ph.finish(50, COMPLETE, 400) is None


def test_phase_tracker_ends_early_when_every_owing_sender_is_gone():
    ph = PhaseTracker(np.array([0, 2, 2]), alpha_q8=64)
    ph.begin(0)
    ph.arrive(1, 1, False)
    ph.arrive(2, 1, False)
    ph.arrive(3, 2, False)
    ph.sender_gone(9, 2)
    assert ph.due(9, 400, 0) == (9, EARLY)


def _p95_by_hand(samples: list[int]) -> float:
    """numpy's default percentile, written out: linear between the order statistics."""
    srt = sorted(samples)
    h = (len(srt) - 1) * 0.95
    lo = int(h)
    hi = min(lo + 1, len(srt) - 1)
    return srt[lo] + (h - lo) * (srt[hi] - srt[lo])


def test_calibrate_t_b_is_twice_the_p95_rounded_up():
    from optireduce.host.model.deadline import calibrate_t_b

    # 10, 20, ..., 200: h = 19 * 0.95 = 18.05, P95 = 190 + 0.05 * 10 = 190.5, 2 x = 381
    assert calibrate_t_b(list(range(200, 0, -10))) == 381
    # 1..7: h = 5.7, P95 = 6.7, 2 x = 13.4, rounded up to 14
    assert calibrate_t_b([3, 1, 7, 5, 2, 6, 4]) == 14
    rng = np.random.default_rng(12)
    for _ in range(50):
        d = rng.integers(0, 5000, int(rng.integers(1, 300))).tolist()
        y = 2 * _p95_by_hand(d)
        if abs(y - round(y)) > 1e-6:  # clear of an integer, where the last ulp could decide
            assert calibrate_t_b(d) == max(1, math.ceil(y))
    assert calibrate_t_b([0, 0, 0]) == 1  # a t_B of 0 would end every phase at once
    assert calibrate_t_b([250]) == 500


def test_calibrate_t_b_refuses_no_samples():
    import pytest

    from optireduce.host.model.deadline import calibrate_t_b

    with pytest.raises(ValueError, match="no warm-up phase times"):
        calibrate_t_b([])


def test_phase_times_are_both_phases_of_every_op():
    from optireduce.host.model.deadline import phase_times
    from optireduce.op_stats import OpStats

    a = OpStats(0, 0, 2, 10, 0, start_us=100, phase1_end_us=130, end_us=180)
    b = OpStats(1, 0, 2, 10, 0, start_us=200, phase1_end_us=205, end_us=300)
    assert phase_times([a, b]) == [30, 50, 5, 95]
