"""Non-finite inputs (docs/numerics.md 2): never turned into numbers.

An inf or NaN in one rank's chunk makes that op's result NaN on every rank (the op is the
granularity: the wire carries one FLAG_NONFINITE bit per frame), the other ops of the call
stay within the numerics bound of a float64 mean computed here, and each is counted.
"""

from __future__ import annotations

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.nic_model import NONFINITE_RESULT, NicModel
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=2000)


def _reference_bound(xs: list[np.ndarray], p: NicParams) -> tuple[np.ndarray, np.ndarray]:
    """float64 mean and the per-element bound 1.5 * 2^E + 2^-24 |mean| (docs/numerics.md 8),
    E from frexp of the largest |x| (not from the code under test); one E per op."""
    x = np.stack([a.astype(np.float64) for a in xs])
    mean = x.mean(axis=0)
    bound = np.empty_like(mean)
    for lo in range(0, len(mean), p.c):
        m = np.abs(x[:, lo : lo + p.c]).max()
        e = int(np.frexp(m)[1]) - 1  # m = 1.f * 2^e
        exp = e + 2 - p.w_in + 1  # one more than the rule at most (rounding up to 2^(w_in-1))
        bound[lo : lo + p.c] = 1.5 * 2.0**exp + 2.0**-24 * np.abs(mean[lo : lo + p.c])
    return mean, bound


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("drop_rate", [0.0, 0.1])
def test_one_nonfinite_entry_makes_its_op_nan_on_every_rank(world, bad, drop_rate):
    rng = np.random.default_rng(world)
    n = 2 * P.c + 100  # three ops: [0, c), [c, 2c), [2c, n)
    xs = [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]
    bad_rank, where = world - 1, P.c + 37  # in op 1
    xs[bad_rank][where] = bad
    outs, st = simulate_allreduce(xs, params=P, drop_rate=drop_rate, seed=5)
    op1 = slice(P.c, 2 * P.c)
    for r, out in enumerate(outs):
        assert (out[op1].view(np.uint32) == NONFINITE_RESULT).all(), r
        assert np.isfinite(out[: P.c]).all() and np.isfinite(out[2 * P.c :]).all(), r
        ops = st.per_worker[r]
        assert [s.nonfinite_result for s in ops] == [0, 1, 0], r
        assert [s.nonfinite for s in ops] == ([0, 1, 0] if r == bad_rank else [0, 0, 0]), r
        # inf also clamps to +-q_max in the quantizer (counted); NaN does not
        assert ops[1].sat_quantize == (int(np.isinf(bad)) if r == bad_rank else 0)
    if drop_rate == 0.0:  # the other ops: the float64 mean within the numerics bound
        clean = [np.where(np.arange(n) == where, 0, x) for x in xs]
        mean, bound = _reference_bound(clean, P)
        keep = np.r_[0 : P.c, 2 * P.c : n]
        for out in outs:
            err = np.abs(out[keep].astype(np.float64) - mean[keep])
            assert (err <= bound[keep]).all(), float((err / bound[keep]).max())
            assert np.linalg.norm(err) <= 1e-4 * np.linalg.norm(mean[keep])


def test_nonfinite_on_every_rank_and_in_every_op():
    xs = [np.full(300, np.nan, dtype=np.float32), np.full(300, np.inf, dtype=np.float32)]
    outs, st = simulate_allreduce(xs, params=P)
    for r, out in enumerate(outs):
        assert (out.view(np.uint32) == NONFINITE_RESULT).all()
        assert [s.nonfinite for s in st.per_worker[r]] == [256, 44]
        assert [s.nonfinite_result for s in st.per_worker[r]] == [1, 1]


def _frames(nic: NicModel) -> list:
    return [(tx, ubt.parse_frame(tx.frame, port=P.udp_port, rank=tx.dst)) for tx in nic.poll_tx()]


def test_the_flag_rides_on_every_frame_of_the_op_and_only_there():
    """Rank 2 of 3 has a NaN in op 0: its scatter frames carry FLAG_NONFINITE; each owner,
    having accepted one, flags all of its gather frames; op 1 carries no flag."""
    world = 3
    nics = [NicModel(P, r, world) for r in range(world)]
    data = [np.arange(200, dtype=np.float32) + r for r in range(world)]
    data[2][5] = np.nan
    for r, nic in enumerate(nics):
        nic.start_op(0, 0, data[r], 0)
    t = 0
    seen: dict[tuple[int, int], list[bool]] = {}  # (phase, sender) -> flags
    while True:
        frames = [(r, tx, f) for r, nic in enumerate(nics) for tx, f in _frames(nic)]
        if not frames:
            break
        t += 1
        for r, tx, f in frames:
            seen.setdefault((tx.phase, r), []).append(bool(f.header.flags & ubt.FLAG_NONFINITE))
            nics[tx.dst].receive(t, tx.frame)
    assert seen[(1, 2)] and all(seen[(1, 2)])  # the rank with the NaN
    assert not any(seen[(1, 0)]) and not any(seen[(1, 1)])  # the others, before they knew
    for r in range(world):  # every owner heard it in phase 1: every gather frame flagged
        assert seen[(2, r)] and all(seen[(2, r)]), r
    for nic in nics:
        (res,) = nic.poll_results()
        assert (res.data.view(np.uint32) == NONFINITE_RESULT).all()
        assert nic.counters["malformed_header"] == 0
    # the next op, all finite: no flag anywhere, a finite result
    for nic in nics:
        nic.start_op(t + 1, 1, np.ones(200, dtype=np.float32), 0)
    flags = []
    for _ in range(4):
        for nic in nics:
            for tx, f in _frames(nic):
                flags.append(f.header.flags & ubt.FLAG_NONFINITE)
                nics[tx.dst].receive(t + 2, tx.frame)
    assert flags and not any(flags)
    for nic in nics:
        (res,) = nic.poll_results()
        np.testing.assert_array_equal(res.data, np.ones(200, dtype=np.float32))
        assert res.stats.nonfinite_result == 0


def test_a_dropped_flagged_frame_changes_nothing():
    """A flagged frame that fails a check (here: another job) is counted and does not make
    the op non-finite: a bad frame never changes an aggregate."""
    a, b = NicModel(P, 0, 2), NicModel(P, 1, 2)
    x = np.ones(64, dtype=np.float32)
    a.start_op(0, 0, x, 0)
    b.start_op(0, 0, x, 0)
    txs = b.poll_tx()  # b's scatter frames to a
    h, payload = ubt.parse_frame(txs[0].frame, port=P.udp_port, rank=0)
    forged = ubt.build_frame(h._replace(flags=h.flags | ubt.FLAG_NONFINITE, job_id=h.job_id + 1),
                             bytes(payload), src=1, dst=0, port=P.udp_port)  # fmt: skip
    a.receive(1, forged)
    assert a.counters["wrong_job"] == 1
    for tx in txs:
        a.receive(1, tx.frame)
    for txa in a.poll_tx():
        b.receive(2, txa.frame)
    for txb in b.poll_tx():
        a.receive(3, txb.frame)
    (res,) = a.poll_results()
    np.testing.assert_array_equal(res.data, x)
    assert res.stats.nonfinite_result == 0


def test_an_inf_in_an_inband_op_is_not_a_saturated_prediction():
    """exp_saturated tells the host its in-band prediction was too small; an inf clamps
    (counted in sat_quantize) but says nothing about the prediction."""
    p = P.replace(exp_inband=True)
    rng = np.random.default_rng(1)
    n = 8 * p.c  # 8 ops: the first exp_lead_eff take the exchange, the rest are in-band
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    xs[0][7 * p.c + 1] = np.inf  # the last op: in-band
    outs, st = simulate_allreduce(xs, params=p)
    assert st.per_worker[0][7].sat_quantize == 1 and st.per_worker[0][7].nonfinite == 1
    assert [c["exp_saturated"] for c in st.exp_counters] == [0, 0, 0]
    assert sum(c["exp_inband"] + c["exp_incomplete"] for c in st.exp_counters) > 0
    for out in outs:
        assert (out[7 * p.c :].view(np.uint32) == NONFINITE_RESULT).all()
        assert np.isfinite(out[: 7 * p.c]).all()
