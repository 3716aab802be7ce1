"""simulate_allreduce against an independent float64 mean: lossless, loss spread, unbiasedness."""

import numpy as np
import pytest

from optireduce import NicParams, simulate_allreduce
from optireduce.experiments.demo import realistic_gradients


def f64_mean(xs):
    return np.mean([x.astype(np.float64) for x in xs], axis=0)


def gaussians(seed, world, n):
    """world float32 vectors of n standard normal values, from one seeded generator."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(world)]


def rel_l2(a, ref):
    return float(np.linalg.norm(a.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize(("world", "n"), [(2, 1000), (3, 5003), (8, 40_001), (16, 6_999)])
def test_lossless_error_and_identical_outputs(world, n):
    rng = np.random.default_rng(world * 7 + n)
    xs = [(rng.standard_normal(n) * rng.uniform(0.5, 2)).astype(np.float32) for _ in range(world)]
    outs, st = simulate_allreduce(xs)
    ref = f64_mean(xs)
    assert rel_l2(outs[0], ref) <= 1e-4
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    assert st.packets_lost == 0 and st.saturations == 0
    assert st.timeouts("complete") == 2 * world * st.ops
    assert st.ops == -(-n // NicParams().c)


def test_lossless_on_a_realistic_gradient():
    xs, _ = realistic_gradients(8, seed=3)
    outs, st = simulate_allreduce(xs)
    assert rel_l2(outs[0], f64_mean(xs)) <= 1e-4
    assert st.packets_lost == 0


def test_no_transform_is_also_lossless():
    xs = gaussians(5, 4, 3000)
    outs, _ = simulate_allreduce(xs, params=NicParams(rht=False))
    assert rel_l2(outs[0], f64_mean(xs)) <= 1e-4


def test_exactly_lost_packets_are_reported():
    xs = gaussians(6, 8, 4096)
    lost = [(1, 1, 0, 8), (2, 0, 3, 0)]  # a contribution to owner 0; a reduced packet to 3
    outs, st = simulate_allreduce(xs, lost=lost)
    assert st.injected == {1: 1, 2: 1}
    assert (st.lost_phase1, st.lost_phase2) == (1, 1)
    owner0 = st.per_worker[0][0]
    assert owner0.p1_received == owner0.p1_expected - 1
    assert st.per_worker[3][0].contributor_hist[0] == 1  # one reduced packet missing
    hist = st.contributor_hist
    assert hist[0] == 1 and hist[7] == 8 and hist[8] == 8 * 16 - 8 - 1  # every rank sees packet 8
    for r in (1, 2, 4, 5, 6, 7):
        np.testing.assert_array_equal(outs[r], outs[0])
    assert not np.array_equal(outs[3], outs[0])


def test_deterministic_for_a_seed():
    xs = gaussians(7, 4, 9000)
    a, sa = simulate_allreduce(xs, drop_rate=0.05, seed=11)
    b, sb = simulate_allreduce(xs, drop_rate=0.05, seed=11)
    c, sc = simulate_allreduce(xs, drop_rate=0.05, seed=12)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert sa.summary() == sb.summary()
    assert sa.injected != sc.injected or any(
        not np.array_equal(x, y) for x, y in zip(a, c, strict=True)
    )


def segment_errors(out, ref, block, p):
    d = (out.astype(np.float64) - ref)[block * 4096 : (block + 1) * 4096]
    return np.linalg.norm(d.reshape(-1, p), axis=1)


def test_a_lost_packet_is_spread_over_its_block_by_the_transform():
    xs = gaussians(8, 8, 8192)
    ref = f64_mean(xs)
    lost = [(2, 21 % 8, 2, 21)]  # packet 21 (block 1) never reaches rank 2
    with_rht, _ = simulate_allreduce(xs, lost=lost)
    without, _ = simulate_allreduce(xs, lost=lost, params=NicParams(rht=False))
    seg = segment_errors(with_rht[2], ref, 1, 256)
    assert seg.max() <= 2.0 * seg.mean()  # spread evenly over the 16 packets' span
    seg0 = segment_errors(without[2], ref, 1, 256)
    assert seg0.max() >= 10 * seg0.mean()  # without it: a hole in one packet's span
    assert np.argmax(seg0) == 21 - 16
    # other blocks untouched either way
    assert rel_l2(with_rht[2][:4096], ref[:4096]) <= 1e-4


def bias_statistics(estimator: str, seeds: int = 30):
    """Mean and standard error of the error's projection on the true mean and on 3
    fixed random directions, over seeds x workers (rows: directions)."""
    xs, _ = realistic_gradients(8, seed=1)
    xs = [x[:8192] for x in xs]
    ref = f64_mean(xs)
    dirs = np.vstack([ref, np.random.default_rng(99).standard_normal((3, len(ref)))])
    dirs *= np.linalg.norm(ref) / np.linalg.norm(dirs, axis=1, keepdims=True)
    b = []
    for s in range(seeds):
        p = NicParams(estimator=estimator, seed=1000 + s)
        outs, _ = simulate_allreduce(xs, params=p, drop_rate=0.05, seed=s)
        b.extend(dirs @ (o.astype(np.float64) - ref) / (ref @ ref) for o in outs)
    b = np.array(b)
    return b.mean(axis=0), b.std(axis=0, ddof=1) / np.sqrt(len(b))


def test_unbiased_estimator_is_unbiased_over_seeds():
    """Bias along the true mean, averaged over 30 seeds (signs and drops) x 8 workers.

    Bound: |mean| <= 4 standard errors on each of 4 projections (a false alarm about 1 in
    4,000 runs; the runs are seeded, so the outcome is fixed).
    The plain estimator shrinks by about the phase-2 loss and must fail the same bound.
    """
    m, se = bias_statistics("unbiased")
    assert np.all(np.abs(m) <= 4 * se), (m, se)  # along the mean and 3 random directions
    m_plain, se_plain = bias_statistics("plain")
    assert m_plain[0] < -4 * se_plain[0], (m_plain, se_plain)


def test_bad_arguments():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="at least 2"):
        simulate_allreduce([x])
    with pytest.raises(TypeError, match="float32"):
        simulate_allreduce([x, np.zeros(10)])
    with pytest.raises(ValueError, match="elements"):
        simulate_allreduce([x, np.zeros(11, np.float32)])
    with pytest.raises(ValueError, match="drop_rate"):
        simulate_allreduce([x, x], drop_rate=1.5)
    with pytest.raises(ValueError, match="lost"):
        simulate_allreduce([x, x], lost=[(3, 0, 1, 0)])
    with pytest.raises(ValueError, match="empty"):
        simulate_allreduce([x[:0], x[:0]])


def test_lossless_with_more_workers_than_packets_per_op():
    """Ranks that own no slot must not drag t_C (and everyone's T) to zero."""
    p = NicParams(c=4096)
    xs = gaussians(9, 32, 10 * 4096)
    outs, st = simulate_allreduce(xs, params=p)
    assert st.packets_lost == 0
    assert rel_l2(outs[0], f64_mean(xs)) <= 1e-4


def test_calibrated_tb_is_twice_the_p95_of_warmup_phases():
    from optireduce.host.model.virtual_cluster import calibrate_t_b

    xs = gaussians(10, 4, 40_000)
    p = NicParams()
    t_b = calibrate_t_b(xs, p)
    _, st = simulate_allreduce([x[: 2 * p.c] for x in xs], params=p, calibrate=False)
    d = [v for ops in st.per_worker for s in ops
         for v in (s.phase1_end_us - s.start_us, s.end_us - s.phase1_end_us)]  # fmt: skip
    assert t_b == int(np.ceil(2 * np.percentile(d, 95)))
    assert 0 < t_b < p.t_b_us
    _, st2 = simulate_allreduce(xs)
    assert st2.t_b_us == t_b and st2.packets_lost == 0


def test_duplicated_and_reordered_packets_change_nothing():
    from optireduce.host.model.impairment import ImpairmentSpec

    xs = gaussians(11, 4, 20_000)
    clean, _ = simulate_allreduce(xs)
    spec = ImpairmentSpec(median_us=20, duplicate=0.1, reorder=0.2)
    outs, st = simulate_allreduce(xs, impairment=spec, seed=4)
    for a, b in zip(outs, clean, strict=True):
        np.testing.assert_array_equal(a, b)
    dups = sum(c["duplicate"] for c in st.counters)
    sent = sum(c["tx_scatter"] + c["tx_gather"] for c in st.counters)
    assert st.packets_lost == 0 and 0.05 * sent < dups < 0.15 * sent


def test_tail_latency_is_bounded_by_the_deadlines():
    from optireduce.host.model.impairment import ImpairmentSpec

    xs = gaussians(12, 8, 100_000)
    _, st = simulate_allreduce(xs, impairment=ImpairmentSpec(median_us=50, p99_ratio=3.0))
    for ops in st.per_worker:
        for s in ops:
            # phase 1 by start + T1, phase 2 by its anchor + T2: at most 2 t_B per op
            assert s.end_us - s.start_us <= 2 * st.t_b_us
    assert st.lost_phase1 + st.lost_phase2 < 0.02 * sum(
        c["tx_scatter"] + c["tx_gather"] for c in st.counters
    )
