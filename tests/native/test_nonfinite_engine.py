"""Non-finite inputs in the native engine against the Python model, bit for bit: the
FLAG_NONFINITE frames, the NaN results, and the counts (docs/numerics.md 2)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_twin import Plan, Twin, allreduce_on_model_and_engine, run_cluster

from optireduce import ubt
from optireduce.host.model.nic_model import NONFINITE_RESULT
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=2000)


def _stats(per_worker: list) -> list:
    return [[{k: v for k, v in dataclasses.asdict(s).items() if k not in ("late", "duplicate")}
             for s in ops] for ops in per_worker]  # fmt: skip


@pytest.mark.parametrize("drop_rate", [0.0, 0.1])
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_the_virtual_cluster_on_the_engine_gives_the_models_bits(monkeypatch, drop_rate, bad):
    from optireduce.host.model.impairment import ImpairmentSpec

    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(3 * P.c - 10).astype(np.float32) for _ in range(4)]
    xs[1][P.c + 3] = bad  # op 1 of rank 1 only
    imp = ImpairmentSpec(median_us=20, p99_ratio=3.0, duplicate=0.02, reorder=0.05)
    kw = dict(params=P, drop_rate=drop_rate, seed=11, impairment=imp)
    _, ws, got, gs = allreduce_on_model_and_engine(monkeypatch, xs, **kw)
    for b in got:
        assert (b[P.c : 2 * P.c].view(np.uint32) == NONFINITE_RESULT).all()
        assert np.isfinite(b[: P.c]).all() and np.isfinite(b[2 * P.c :]).all()
    assert gs.counters == ws.counters
    # per-op late/duplicate counts are left out: the model's OpStats object keeps counting
    # late frames after its result was polled, the engine's dict is a snapshot (a difference
    # of the bindings, with or without non-finite inputs)
    assert _stats(gs.per_worker) == _stats(ws.per_worker)
    assert [[s.nonfinite_result for s in ops] for ops in gs.per_worker] == [[0, 1, 0]] * 4
    assert [[s.nonfinite for s in ops] for ops in gs.per_worker] == [
        [0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]]  # fmt: skip


def test_flagged_frames_are_the_models_frame_for_frame():
    """Three twins (model and engine fed the same events, every frame compared): rank 0's
    NaN in op 0 flags its scatter frames, then every gather frame; op 1 is clean."""
    world = 3
    nodes = [Twin(P, r, world) for r in range(world)]
    xs = [np.linspace(-1, 1, 150, dtype=np.float32) * (r + 1) for r in range(world)]
    xs[0][77] = np.nan
    flags: dict[tuple[int, int, int], list[bool]] = {}  # (op, phase, sender) -> flags
    for op in (0, 1):
        for r, node in enumerate(nodes):
            x = xs[r] if op == 0 else np.ones(150, dtype=np.float32)
            node.call("start_op", op * 10, op, x, -20)
        t = op * 10
        while True:
            frames = [(r, tx) for r, node in enumerate(nodes) for tx in node.collect()]
            if not frames:
                break
            t += 1
            for r, tx in frames:
                h = ubt.parse_frame(tx.frame, port=P.udp_port, rank=tx.dst).header
                flag = bool(h.flags & ubt.FLAG_NONFINITE)
                flags.setdefault((op, tx.phase, r), []).append(flag)
                nodes[tx.dst].call("receive", t, tx.frame)
    assert all(flags[(0, 1, 0)])  # the rank with the NaN
    for r in range(world):  # every owner heard of it in phase 1
        assert flags[(0, 2, r)] and all(flags[(0, 2, r)]), r
    assert not any(f for (op, _, _), v in flags.items() if op == 1 for f in v)
    for node in nodes:
        r0, r1 = node.results
        assert (r0.data.view(np.uint32) == NONFINITE_RESULT).all()
        assert np.isfinite(r1.data).all() and r1.stats.nonfinite_result == 0


@pytest.mark.parametrize("seed", range(6))
def test_lossy_reordered_clusters_with_nonfinite_inputs_run_identically(seed):
    """engine_twin's lossy clusters with inf/NaN in the last op of every rank."""
    p = NicParams(p=8, b=32, c=64, n_max=8, t_b_us=300, ops_in_flight=2)
    plan = Plan(params=p, world=3 + seed % 3, lens=[64, 50, 64], seed=seed, loss=0.1,
                dup=0.1, max_delay=200, data="nonfinite", mutate=0.05)  # fmt: skip
    nodes = run_cluster(plan)
    for node in nodes:
        last = [r for r in node.results if r.op_id == 2]
        for r in last:
            assert r.stats.nonfinite_result == 1
            assert (r.data.view(np.uint32) == NONFINITE_RESULT).all()


def test_scatter_frames_carry_the_own_input_only():
    """Rank 0 (a NaN) is ahead: its flagged scatter frames reach rank 1 before rank 1
    starts the op. Rank 1's scatter frames still say only what its own input holds (the
    gateware knows that bit at START, before its first frame); its gather frames, sent when
    phase 1 ends, carry what it learnt; both results are NaN."""
    a, b = Twin(P, 0, 2), Twin(P, 1, 2)
    x = np.arange(100, dtype=np.float32)
    bad = x.copy()
    bad[3] = np.nan
    a.call("start_op", 0, 0, bad, -10)
    for tx in a.collect():
        b.call("receive", 1, tx.frame)
    b.call("start_op", 2, 0, x, -10)
    flags = {}
    t = 2
    while True:
        frames = [(r, tx) for r, n in enumerate((a, b)) for tx in n.collect()]
        if not frames:
            break
        t += 1
        for r, tx in frames:
            h = ubt.parse_frame(tx.frame, port=P.udp_port, rank=tx.dst).header
            flags.setdefault((r, tx.phase), []).append(bool(h.flags & ubt.FLAG_NONFINITE))
            (a, b)[tx.dst].call("receive", t, tx.frame)
    assert flags[(1, 1)] and not any(flags[(1, 1)])  # rank 1's own input is finite
    assert flags[(1, 2)] and all(flags[(1, 2)])  # it heard rank 0 in phase 1
    assert all(flags[(0, 2)])
    for n in (a, b):
        (res,) = n.results
        assert (res.data.view(np.uint32) == NONFINITE_RESULT).all()
