"""`optireduce train`: DDP with the OptiReduce hook and with gloo, real processes, the same
injected tail. One short run (both methods, 3 processes each) is checked from its files:
the JSON, the kept parameters and the NICs' own counters."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from optireduce.cli import main
from optireduce.experiments import train
from optireduce.experiments.train import TrainConfig, straggler_delays

WORLD, STEPS, TARGET = 3, 50, 0.7


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    argv = ["train", "--world", str(WORLD), "--steps", str(STEPS), "--target", str(TARGET),
            "--straggler-ms", "5", "--packet-delay-us", "100", "--json",
            "-o", str(out)]  # fmt: skip

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue()), out


def _test_split() -> tuple[np.ndarray, np.ndarray]:
    """The held-out split, derived here from sklearn (seed-0 permutation, first 450)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    perm = np.random.default_rng(0).permutation(len(d.target))[:450]
    return d.data[perm] / 16.0, d.target[perm]


def _numpy_accuracy(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """An independent float64 forward pass of the 64-32-10 MLP (w1, b1, w2, b2)."""
    t = theta.astype(np.float64)
    w1, b1 = t[:2048].reshape(32, 64), t[2048:2080]
    w2, b2 = t[2080:2400].reshape(10, 32), t[2400:2410]
    h = np.maximum(x @ w1.T + b1, 0)
    return float(((h @ w2.T + b2).argmax(1) == y).mean())


def test_json_has_every_method_and_key(run):
    out, d = run
    for m in ("gloo", "optireduce"):
        assert {"tta_s", "final_acc", "entries_lost"} <= set(out[m])
    saved = json.loads((d / "train.json").read_text())
    assert saved["gloo"] == out["gloo"] and saved["optireduce"] == out["optireduce"]
    assert (d / "train.png").read_bytes()[:4] == b"\x89PNG"


def test_both_methods_reach_the_target_on_held_out_data(run):
    """Every kept accuracy is re-evaluated here with numpy on a split derived from sklearn;
    time to accuracy is the first kept time at or above the target."""
    out, d = run
    x, y = _test_split()
    for m in ("gloo", "optireduce"):
        r0 = np.load(d / "raw" / m / "rank0.npz")
        accs = [_numpy_accuracy(th, x, y) for th in r0["theta"]]
        curve = json.loads((d / "train.json").read_text())["curves"][m]
        assert curve["acc"] == pytest.approx(accs, abs=1e-12)
        assert accs[0] < 0.5 < TARGET <= max(accs)  # it learned, from chance
        first = next(i for i, a in enumerate(accs) if a >= TARGET)
        assert out[m]["tta_s"] == r0["times"][first] > 0
        assert out[m]["final_acc"] == pytest.approx(accs[-1], abs=1e-12)
        assert list(r0["steps"])[-1] == STEPS


def test_entries_lost_is_what_the_nics_report(run):
    """entries_lost = reduced packets missed / packets decoded, over every rank and op;
    each NIC's rx_gather counter (gathers it accepted) gives the same count."""
    out, d = run
    missed = packets = 0
    for r in range(WORLD):
        z = np.load(d / "raw" / "optireduce" / f"rank{r}.npz")
        assert z["p2_received"].sum() == z["rx_gather"]  # the op stats and the counter agree
        missed += int(z["p2_expected"].sum() - z["rx_gather"])
        # 2410 parameters pad to 3 blocks of 1024 = 12 packets of 256; one op per step
        assert set(z["n_packets"].tolist()) == {12} and len(z["n_packets"]) == STEPS
        packets += int(z["n_packets"].sum())
    assert out["optireduce"]["entries_lost"] == missed / packets
    # the lossless check op before training: every live NIC equals the virtual cluster
    assert out["optireduce"]["verify_bit_exact"] == [True] * WORLD
    assert out["optireduce"]["backends"] == ["native"] * WORLD  # the default software backend
    assert out["optireduce"]["cosim_bit_exact"] is None
    assert out["gloo"]["entries_lost"] == 0.0
    # the split by who was late adds up, and charges the straggler its own packets
    o = out["optireduce"]
    by_sender = o["entries_lost_from_straggler"] + o["entries_lost_from_others"]
    assert by_sender == pytest.approx(o["entries_lost"])
    assert o["unattributed_ops"] == 0
    # the split by cause (the engines' traces) adds up too, every loss explained
    causes = ("straggler", "delay", "processing", "unattributed")
    assert sum(o[f"entries_lost_{c}"] for c in causes) == pytest.approx(o["entries_lost"])
    assert o["entries_lost_unattributed"] == 0.0
    assert len(o["step_entries_lost_processing"]) == STEPS
    # the fixture's run: the stragglers depend on world, steps, seed, tail and median only
    cfg = TrainConfig(world=WORLD, steps=STEPS, straggler_median_ms=5)
    late = straggler_delays(cfg).argmax(axis=1)
    by_straggler = 0
    for r in range(WORLD):
        z = np.load(d / "raw" / "optireduce" / f"rank{r}.npz")
        assert (z["p2_missing_from"].sum(axis=1) == z["p2_expected"] - z["p2_received"]).all()
        by_straggler += sum(
            int(m[late[t]]) for t, m in zip(z["op_step"], z["p2_missing_from"], strict=True)
        )
    assert o["entries_lost_from_straggler"] == by_straggler / packets


def test_gloo_replicas_are_identical(run):
    _, d = run
    thetas = [np.load(d / "raw" / "gloo" / f"rank{r}.npz")["final_theta"] for r in range(WORLD)]
    for th in thetas[1:]:
        np.testing.assert_array_equal(th, thetas[0])


def test_straggler_delays_are_one_rank_per_step_with_the_tail():
    cfg = TrainConfig(steps=20_000, straggler_median_ms=10.0, tail=3.0)
    d = straggler_delays(cfg)
    assert d.shape == (20_000, 4) and ((d > 0).sum(axis=1) == 1).all()
    v = d.max(axis=1)
    p50, p99 = np.percentile(v, [50, 99])
    assert p50 == pytest.approx(0.010, rel=0.03) and p99 / p50 == pytest.approx(3.0, rel=0.08)
    who = (d > 0).argmax(axis=1)
    assert np.bincount(who, minlength=4).min() > 4500  # uniform over the ranks
    np.testing.assert_array_equal(straggler_delays(cfg), d)  # the same for every method


def _reference_sgd(cfg: TrainConfig, schedule: str) -> list[np.ndarray]:
    """Lossless data-parallel training in float64 numpy, written from the definitions:
    the MLP's cross-entropy gradient by hand, the mean over the workers' minibatches,
    SGD with momentum as torch.optim.SGD (buf = m * buf + g), and the learning rate of
    step t, lr * (1 + cos(pi * t / steps)) / 2 for "cosine". Parameters every eval_every
    steps. The inputs (data split, initial weights, minibatch draw) are the experiment's
    own: this checks the training, not the draw."""
    from optireduce.experiments import loss_tolerance as lt

    xtr, ytr, _, _ = lt.load_data(cfg.test_size)
    x, y = xtr.astype(np.float64), ytr
    batches = train._batches(cfg)
    theta = lt._init(cfg.seed).astype(np.float64)
    buf = np.zeros_like(theta)
    kept = []
    for t in range(cfg.steps):
        g = np.zeros_like(theta)
        for r in range(cfg.world):
            xb, yb = x[batches[t, r]], y[batches[t, r]]
            w1, b1 = theta[:2048].reshape(32, 64), theta[2048:2080]
            w2 = theta[2080:2400].reshape(10, 32)
            pre = xb @ w1.T + b1
            h = np.maximum(pre, 0)
            z = h @ w2.T + theta[2400:]
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(yb)), yb] -= 1
            dz = p / len(yb)
            dh = (dz @ w2) * (pre > 0)
            g += np.concatenate([(dh.T @ xb).ravel(), dh.sum(0), (dz.T @ h).ravel(), dz.sum(0)])
        g /= cfg.world
        buf = g if t == 0 else cfg.momentum * buf + g
        lr = cfg.lr * ((1 + np.cos(np.pi * t / cfg.steps)) / 2 if schedule == "cosine" else 1)
        theta = theta - lr * buf
        if (t + 1) % cfg.eval_every == 0:
            kept.append(theta.copy())
    return kept


def test_gloo_training_is_the_reference_sgd_with_the_cosine_schedule(run):
    """gloo is lossless: its kept parameters are float64 data-parallel SGD with momentum
    and the cosine learning rate, to float32 rounding; the constant rate is far off."""
    _, d = run
    cfg = TrainConfig(world=WORLD, steps=STEPS)
    assert cfg.schedule == "cosine"
    got = np.load(d / "raw" / "gloo" / "rank0.npz")["theta"][1:]  # [0] is the start
    ref = _reference_sgd(cfg, "cosine")
    assert len(got) == len(ref) == STEPS // cfg.eval_every
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, ref, strict=True))
    assert err < 1e-4
    off = float(np.abs(_reference_sgd(cfg, "constant")[-1] - ref[-1]).max())
    assert off > 100 * err and off > 1e-2


def test_run_seeds_reports_the_mean_and_range_of_every_seed(monkeypatch):
    """run_seeds over made-up per-seed results: means per method and ratio, min and max of
    the ratios, the mean absolute gap, the checks of every seed, every seed's own
    summary; a seed that missed the target makes the mean None and is counted."""

    def result(g_tta, g_acc, o_tta, o_acc, ratio, gap, exact=True, excl=()):
        ratios = {"tta_optireduce_over_gloo": ratio, "final_acc_gap_points": gap}
        opti = {"tta_s": o_tta, "final_acc": o_acc, "verify_bit_exact": [True, exact],
                "cosim_bit_exact": None, "exclusions": list(excl)}  # fmt: skip
        gloo = {"tta_s": g_tta, "final_acc": g_acc, "flag": True}  # a bool is not averaged
        return {"gloo": gloo, "optireduce": opti, "ratios": ratios}

    per = {
        3: (result(2.0, 0.95, 1.0, 0.94, 0.5, 1.0), {"c": 3}),
        7: (result(4.0, 0.97, 3.0, 0.96, 0.75, -0.5, excl=[[1, 2]]), {"c": 7}),
    }
    seen = []

    def fake_run_train(cfg, work=None, progress=None):
        seen.append((cfg.seed, work))
        out, curves = per[cfg.seed]
        return {**out, "settings": {"seed": cfg.seed}}, curves

    monkeypatch.setattr(train, "run_train", fake_run_train)
    out, curves = train.run_seeds(TrainConfig(), [3, 7], "/w")
    assert seen == [(3, "/w/seed3"), (7, "/w/seed7")]
    assert curves == {3: {"c": 3}, 7: {"c": 7}}
    assert out["gloo"] == {"tta_s": 3.0, "tta_s_min": 2.0, "tta_s_max": 4.0,
                           "final_acc": pytest.approx(0.96)}  # fmt: skip
    o = out["optireduce"]
    assert o["tta_s"] == 2.0 and o["verify_bit_exact"] is True and o["cosim_bit_exact"] is None
    assert o["exclusions"] == {"3": [], "7": [[1, 2]]}
    r = out["ratios"]
    assert r["tta_optireduce_over_gloo"] == pytest.approx(0.625)
    assert (r["tta_optireduce_over_gloo_min"], r["tta_optireduce_over_gloo_max"]) == (0.5, 0.75)
    assert r["final_acc_gap_points"] == pytest.approx(0.25)
    assert (r["final_acc_gap_points_min"], r["final_acc_gap_points_max"]) == (-0.5, 1.0)
    assert r["final_acc_gap_points_abs_mean"] == pytest.approx(0.75)
    assert out["per_seed"]["7"]["optireduce"]["tta_s"] == 3.0
    assert out["settings"]["seeds"] == [3, 7]

    per[7] = (result(4.0, 0.97, None, 0.9, None, 7.0, exact=False), {"c": 7})  # missed
    out, _ = train.run_seeds(TrainConfig(), [3, 7])
    o, r = out["optireduce"], out["ratios"]
    assert o["tta_s"] is None and o["tta_s_reached"] == 1 and o["tta_s_min"] == 1.0
    assert o["verify_bit_exact"] is False  # one seed's check failed: the summary says so
    assert r["tta_optireduce_over_gloo"] is None and r["tta_optireduce_over_gloo_reached"] == 1
    with pytest.raises(ValueError, match="distinct"):
        train.run_seeds(TrainConfig(), [3, 3])


def test_train_config_checks_its_nic_params_before_any_process_starts():
    with pytest.raises(ValueError, match="tc_gain_shift"):
        TrainConfig(tc_gain_shift=9)
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="step")
