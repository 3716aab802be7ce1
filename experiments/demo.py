"""`optireduce demo`: OptiReduce against gloo, training under an injected tail.

The demo (`train_demo`): a small cluster of processes on loopback trains the digits
MLP with DDP twice, with gloo and with the OptiReduce hook (software NICs), under the
same injected tail (`optireduce.experiments.train`), and reports time to accuracy, P99 op
latency and entries lost per method, with a plot of accuracy against wall time.

`optireduce demo --numerics` (`run_demo`): the paper's argument for the Hadamard
transform, measured. Eight workers AllReduce a realistic gradient (heavy-tailed,
layers whose scales differ by orders of magnitude) through the model NICs at several
packet-loss rates, with and without the randomized Hadamard transform.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.params import NicParams

# (name, elements, scale): shapes of a small CNN's buckets.
LAYERS: tuple[tuple[str, int, float], ...] = (
    ("conv1.weight", 1_728, 3e-2),
    ("conv1.bias", 64, 1e-1),
    ("conv2.weight", 36_864, 4e-3),
    ("bn2.weight", 128, 2e-1),
    ("fc1.weight", 65_536, 1e-3),
    ("fc1.bias", 256, 5e-2),
    ("fc2.weight", 2_560, 2e-2),
    ("fc2.bias", 10, 3e-1),
)

CONFIGS: tuple[tuple[str, dict], ...] = (
    ("RHT, unbiased decode", {"rht": True, "estimator": "unbiased"}),
    ("RHT, plain decode", {"rht": True, "estimator": "plain"}),
    ("no transform", {"rht": False, "estimator": "plain"}),
)


def realistic_gradients(workers: int, seed: int) -> tuple[list[np.ndarray], list[slice]]:
    """Per-worker gradients: a shared heavy-tailed signal plus per-worker minibatch noise."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
    spans, at = [], 0
    for _name, n, scale in LAYERS:
        signal = scale * rng.standard_t(3, n)
        for w in range(workers):
            parts[w].append(signal + scale * rng.standard_t(3, n))
        spans.append(slice(at, at + n))
        at += n
    return [np.concatenate(p).astype(np.float32) for p in parts], spans


@dataclass
class Row:
    config: str
    loss: float
    rel_l2: float  # mean over workers of ||est - mean|| / ||mean||
    bias: float  # <est - mean, mean> / <mean, mean>, mean over workers
    worst_layer: float  # largest per-layer relative L2 error over workers
    worst_layer_name: str
    zeroed: float  # share of elements decoded as exactly 0 whose mean is not small (holes)
    lost_phase1: int
    lost_phase2: int
    saturations: int


def run_demo(
    workers: int = 8,
    losses: tuple[float, ...] = (0.0, 0.01, 0.05),
    seed: int = 0,
    params: NicParams | None = None,
    progress: Callable[[], object] | None = None,
) -> tuple[list[Row], dict]:
    """Every (config, loss) pair; returns the table rows and per-layer errors for plotting."""
    base = params or NicParams()
    xs, spans = realistic_gradients(workers, seed)
    ref = np.mean([x.astype(np.float64) for x in xs], axis=0)
    significant = np.concatenate([np.full(s.stop - s.start, 0.01 * np.std(ref[s])) for s in spans])
    rows: list[Row] = []
    layer_err: dict = {}
    for name, cfg in CONFIGS:
        for loss in losses:
            outs, st = simulate_allreduce(
                xs, params=base.replace(**cfg), drop_rate=loss, seed=seed + 1
            )
            errs, biases, layer = [], [], np.zeros(len(spans))
            zeroed = np.mean([np.mean((o == 0) & (np.abs(ref) > significant)) for o in outs])
            for o in outs:
                d = o.astype(np.float64) - ref
                errs.append(np.linalg.norm(d) / np.linalg.norm(ref))
                biases.append(float(d @ ref / (ref @ ref)))
                le = [np.linalg.norm(d[s]) / np.linalg.norm(ref[s]) for s in spans]
                layer = np.maximum(layer, le)
            worst = int(np.argmax(layer))
            layer_err[(name, loss)] = layer
            rows.append(
                Row(name, loss, float(np.mean(errs)), float(np.mean(biases)), float(layer[worst]),
                    LAYERS[worst][0], float(zeroed), st.lost_phase1, st.lost_phase2,
                    st.saturations)
            )  # fmt: skip
            if progress is not None:
                progress()
    return rows, layer_err


def plot(layer_err: dict, losses: tuple[float, ...], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, _, _ in LAYERS]
    lossy = [lo for lo in losses if lo > 0] or list(losses)
    fig, axes = plt.subplots(1, len(lossy), figsize=(6 * len(lossy), 4), squeeze=False)
    x = np.arange(len(names))
    width = 0.8 / len(CONFIGS)
    for ax, loss in zip(axes[0], lossy, strict=True):
        for k, (cfg, _) in enumerate(CONFIGS):
            ax.bar(x + k * width, layer_err[(cfg, loss)], width, label=cfg)
        ax.set_yscale("log")
        ax.set_xticks(x + width, names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("worst worker's relative L2 error")
        ax.set_title(f"per-layer error at {loss:.0%} packet loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- the training demo -----------------------------------------------------------------


def demo_config(steps: int = 120, seed: int = 0):
    """4 processes, the digits MLP to 93 %, one straggler per step (median 20 ms,
    P99/P50 3) and 200 us per-packet delays: under a minute per method on 2 cores."""
    from optireduce.experiments.train import TrainConfig

    return TrainConfig(world=4, steps=steps, seed=seed, target_acc=0.93)


def rtl_config(cfg):
    """The demo's third run: OptiReduce with rank 0's NIC the co-simulated RTL. The
    simulator is ~100x slower than the microseconds it simulates, so t_C = mean + 4 dev
    (the deadlines wait for it instead of cutting it every op)."""
    from dataclasses import replace

    return replace(cfg, cosim_rank=0, tc_dev_mult=4, methods=("optireduce",))


def cosim_status(cfg=None) -> tuple[bool, str]:
    """(usable, reason): can rank 0 of the OptiReduce run be the co-simulated NIC? Builds
    the harness for the hook's NicParams if needed (minutes, once; cached under build/)."""
    cfg = cfg or rtl_config(demo_config())
    try:
        from optireduce.sim.cosim_build import harness_path

        # the hook's NIC: with the warm-up t_B (a reset value in the gateware)
        harness_path(cfg.nic_params())
    except ImportError as e:
        return False, f"the co-simulation is not installed: {e}"
    except Exception as e:  # a missing toolchain or a failed build: say why, run software
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return False, f"{type(e).__name__}: {first[:160]}"
    return True, "rank 0"


RTL = "optireduce_rtl"  # the run with rank 0 co-simulated


def train_demo(
    cfg=None, rtl: bool = False, progress: Callable[[str, int], None] | None = None
) -> dict:
    """gloo and OptiReduce (software NICs) under the same tail, then, with `rtl`, OptiReduce
    with rank 0 co-simulated (rtl_config); {METHOD: summary, "ratios", "settings",
    "curves"}, the co-simulated run under RTL."""
    import tempfile

    from optireduce.experiments.train import run_method, run_train

    cfg = cfg or demo_config()
    out, curves = run_train(cfg, progress=progress)
    if rtl:
        tick = (lambda s: progress(RTL, s)) if progress else (lambda s: None)
        try:
            with tempfile.TemporaryDirectory(prefix="optireduce-demo-") as tmp:
                r = run_method(rtl_config(cfg), "optireduce", tmp, tick)
        except Exception as e:  # the software runs stand; say why this one did not
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            out["rtl_error"] = f"{type(e).__name__}: {first}"
        else:
            out[RTL], curves[RTL] = r["summary"], r["curve"]
    out["curves"] = curves
    return out
