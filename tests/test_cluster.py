"""The SimPy cluster simulator (experiments/cluster.py): fairness, the ring's formula, OptiReduce's
bit-exactness against simulate_allreduce, its deadline bound and its loss accounting."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from optireduce.experiments.cluster import (
    ClusterConfig,
    LinkDraws,
    link_spec,
    run_algorithm,
    summarize,
)
from optireduce.host.model.virtual_cluster import simulate_allreduce

# Small and fast: 4 workers, P = 256, B = 4096, 64 KiB ops (64 packets per op).
SMALL = {"workers": 4, "bucket_bytes": 64 * 1024, "p": 256, "b": 4096, "warmup": 2}


def test_draws_are_keyed_and_seeded():
    link = link_spec("cloud", median_us=50, loss=0.1)
    a, b, c = LinkDraws(link, 7), LinkDraws(link, 7), LinkDraws(link, 8)
    la, da = a.table(3, 1, 2, 0, 500)
    lb, db = b.table(3, 1, 2, 0, 500)
    assert np.array_equal(la, lb) and np.array_equal(da, db)
    _, dc = c.table(3, 1, 2, 0, 500)
    assert not np.array_equal(da, dc)
    # a packet's fate depends on its key only, not on how many were drawn
    lsmall, dsmall = a.table(3, 1, 2, 0, 37)
    assert np.array_equal(dsmall, da[:37]) and np.array_equal(lsmall, la[:37])
    # other op, other link or a retransmission: other draws
    for key in ((4, 1, 2, 0), (3, 2, 1, 0), (3, 1, 2, 1)):
        assert not np.array_equal(a.table(*key, 500)[1], da)


def test_lognormal_ratio():
    q = LinkDraws(link_spec(3, median_us=100), 0).quantiles(100_000)
    assert q["p50_us"] == pytest.approx(100, rel=0.03)
    assert q["p99_over_p50"] == pytest.approx(3, rel=0.06)


def test_identical_randomness_across_algorithms():
    cfg = ClusterConfig(link=link_spec(3, median_us=40), ops=2, **SMALL)
    logs = {
        a: {k: v for k, v in run_algorithm(a, cfg, record_delays=True).delays.items() if k[0] >= 0}
        for a in ("reliable_ring", "reliable_tar", "optireduce")
    }
    # TAR sends exactly OptiReduce's packets (same packetization, no loss here)
    assert logs["reliable_tar"] == logs["optireduce"]
    shared = logs["reliable_ring"].keys() & logs["optireduce"].keys()
    assert len(shared) > 50  # the ring's links r -> r+1 are among OptiReduce's
    assert all(logs["reliable_ring"][k] == logs["optireduce"][k] for k in shared)


def test_ring_latency_matches_formula():
    # Constant delay d (P99/P50 = 1), no loss. Step: m packets of s us on the uplink,
    # d in the network, s on the receiver's downlink (no contention in a ring), handed
    # over at the next integer tick; the next step starts then. 2(N-1) equal steps:
    #   latency = 2 (N - 1) ceil(m s + d + s), m = n / (N P), s = frame bits / bandwidth.
    d = 37.0
    for workers in (3, 4, 8):
        cfg = ClusterConfig(link=link_spec(1, median_us=d), ops=3, **{**SMALL, "workers": workers})
        m = math.ceil(cfg.n / (workers * cfg.p))
        s = cfg.frame_bytes() * 8 / (cfg.link.gbps * 1000)
        want = 2 * (workers - 1) * math.ceil(m * s + d + s)
        r = run_algorithm("reliable_ring", cfg)
        assert r.latency_us == [want] * 3, (workers, m, s)


def test_optireduce_lossless_is_bit_exact():
    # No warm-up: the transform's signs are keyed by op id, and simulate_allreduce
    # numbers its ops from 0 (with a warm-up, our measured ops come after it).
    cfg = ClusterConfig(link=link_spec(1, median_us=20), ops=1, **{**SMALL, "warmup": 0})
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(2 * cfg.n).astype(np.float32) * (r + 1) for r in range(4)]
    r = run_algorithm("optireduce", cfg, inputs=xs, keep_outputs=True)
    ref, _ = simulate_allreduce(xs, params=cfg.params(), calibrate=False)
    assert len(r.latency_us) == 2
    assert r.entries_lost == [0.0, 0.0] and r.contributions_lost == [0.0, 0.0]
    assert set(r.phases) == {"complete"}
    for out, want in zip(r.outputs, ref, strict=True):
        assert np.array_equal(out, want)


def test_optireduce_latency_bounded_by_deadlines():
    cfg = ClusterConfig(link=link_spec(3, median_us=150), ops=12, **SMALL)
    r = run_algorithm("optireduce", cfg)
    assert 0 < r.t_b_us < 100_000
    # phase 1 ends by start + t_B, phase 2 by max(phase-1 end, start + T1) + T2
    assert max(r.latency_us) <= 2 * r.t_b_us
    assert r.summary()["p99_ms"] * 1000 <= 2 * r.t_b_us


def test_entries_lost_matches_injected_loss():
    # Constant delay, 5 % loss per packet. A worker misses a reduced packet when the
    # owner's gather frame to it is lost (its own slots are local): expected
    # L (N - 1) / N of the entries. Phase-1 losses only thin the sums.
    loss, workers = 0.05, 4
    cfg = ClusterConfig(link=link_spec(1, median_us=30, loss=loss), ops=8,
                        **{**SMALL, "bucket_bytes": 256 * 1024})  # fmt: skip
    r = run_algorithm("optireduce", cfg)
    expect = loss * (workers - 1) / workers
    trials = cfg.ops * workers * (cfg.n // cfg.p) * (workers - 1) / workers
    tol = 4 * math.sqrt(expect * (1 - expect) / trials)  # 4 sigma, about 0.009
    assert abs(np.mean(r.entries_lost) - expect) <= tol
    assert abs(np.mean(r.contributions_lost) - loss) <= 4 * math.sqrt(loss / trials)
    ring = run_algorithm("reliable_ring", cfg)
    assert ring.retransmissions > 0 and ring.entries_lost == [0.0] * cfg.ops
    # a retransmission costs at least one RTO on some op
    assert max(ring.latency_us) >= cfg.rto_us


def test_summary_and_cli(tmp_path, capsys):
    from optireduce.cli import main

    png = tmp_path / "cdf.png"
    cfg = ClusterConfig(link=link_spec(1.5), ops=2, **SMALL)
    res = {a: run_algorithm(a, cfg) for a in ("reliable_ring", "optireduce")}
    s = summarize(cfg, res)
    assert set(s["ratios"]) >= {"optireduce_p99_over_ring_p99", "optireduce_p99_over_p50"}
    assert main(["cluster", "--workers", "4", "--ops", "2", "--bucket-kib", "64",
                 "--packet", "256", "--warmup", "1", "--jobs", "1", "--plot", str(png),
                 "--algos", "reliable_ring,optireduce", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    for algo in ("reliable_ring", "optireduce"):
        assert set(out[algo]) >= {"p50_ms", "p99_ms", "entries_lost"}
    assert "ratios" in out and out["settings"]["workers"] == 4
    assert png.stat().st_size > 1000


def test_exponent_exchange_is_charged_on_the_links():
    """The all-gather of exponent proposals costs network time: in-band, only the first
    L ops pay it (exp_lead_eff); with `exchange`, every op does, at least one link delay
    more than the same op agreed in-band."""
    d = 500  # a constant link delay (P99/P50 = 1), well above one op's serialization
    small = {k: v for k, v in SMALL.items() if k != "warmup"}
    runs = {
        mode: run_algorithm(
            "optireduce",
            ClusterConfig(link=link_spec(1, median_us=d), ops=7, warmup=0, exponents=mode, **small),
        )
        for mode in ("inband", "exchange")
    }
    lead = ClusterConfig(**SMALL).params().replace(exp_inband=True).exp_lead_eff
    assert runs["inband"].exchanges == lead < 7
    assert runs["exchange"].exchanges == 7
    inb, exc = runs["inband"].latency_us, runs["exchange"].latency_us
    assert inb[:lead] == exc[:lead]  # the same exchange, then the same op
    for k in range(lead, 7):
        assert exc[k] - inb[k] >= d
    for r in runs.values():
        assert r.entries_lost == [0.0] * 7
    with pytest.raises(ValueError, match="exponents"):
        ClusterConfig(exponents="oracle")
