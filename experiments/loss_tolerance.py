"""Loss tolerance: accuracy reached versus injected loss rate, with and
without the randomized Hadamard transform.

Data-parallel SGD of a small MLP (64-32-10, ReLU, 2410 parameters) on scikit-learn's
`load_digits` (1797 8x8 images, shipped inside the package: no download). The split is
fixed (450 test images, 1347 train); the train set is cut into `workers` shards, one per
worker. Every step each worker computes the gradient of the cross-entropy on a minibatch
of its own shard, as one flat float32 vector, and the workers average the vectors:

- `reference`: the float64 mean (numpy), the same for every worker (lossless training);
- otherwise: `simulate_allreduce` through N model NICs with `drop_rate` per packet
  (both phases), `NicParams(p, b, c, rht=...)`, `calibrate=False` and a fixed t_B.

Each worker applies ITS OWN received average (SGD with momentum, its own momentum
buffer), so replicas diverge when a worker misses a reduced (phase-2) packet. At the end
we report worker 0's test accuracy, the mean over workers, and the divergence of the
replicas: max over workers of ||theta_r - mean_r theta_r||_2 / ||mean_r theta_r||_2
(`divergence`) and the largest spread of one parameter, max_j (max_r - min_r)
(`divergence_max_abs`).

Same seeds for every configuration: a training seed fixes the initial weights, the
shards and the minibatch order, and step t's drops are seeded with (seed, t) for every
(loss, rht), so rht and no_rht lose the same packets (the send order does not depend on
the transform). Several training seeds are averaged (`seeds`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from optireduce.params import NicParams

LOSSES = (0.0, 0.01, 0.02, 0.05, 0.1)
HIDDEN = 32
NIC_FIELDS = ("p", "b", "c", "t_b_us")  # the NicParams fields a LossToleranceConfig carries
N_IN, N_OUT = 64, 10


@dataclass(frozen=True)
class LossToleranceConfig:
    workers: int = 8
    steps: int = 250
    batch: int = 32  # per worker
    lr: float = 0.1
    momentum: float = 0.9
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    losses: tuple[float, ...] = LOSSES
    p: int = 64
    b: int = 1024
    c: int = 16384
    t_b_us: int = 2000
    test_size: int = 450

    def nic_params(self, rht: bool = True) -> NicParams:
        """The NICs of the "rht" (or, rht=False, "no_rht") runs: a fixed t_B."""
        return NicParams(rht=rht, **{k: getattr(self, k) for k in NIC_FIELDS})


@dataclass
class RunResult:
    """One training run: one (mode, loss, seed)."""

    mode: str  # "rht", "no_rht" or "reference"
    loss: float
    seed: int
    acc: list[float]  # final test accuracy of each worker
    half_acc: float  # worker 0's test accuracy after half the steps
    divergence: float
    divergence_max_abs: float
    lost_phase1: int = 0  # packets lost over the run (all workers, all steps)
    lost_phase2: int = 0
    packets: int = 0  # packets sent over the run (both phases)
    extra: dict = field(default_factory=dict)


def n_params(hidden: int = HIDDEN) -> int:
    return N_IN * hidden + hidden + hidden * N_OUT + N_OUT


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (8x8 images, 0..16; labels), read from the CSV file it ships.
    `sklearn.datasets.load_digits` reads the same file but imports scikit-learn and SciPy
    first: 1.5-2 s in every training process. tests/test_loss_tolerance.py compares them."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed: make install")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if not path.is_file():  # another layout: its loader, slower
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data, d.target
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


def load_data(test_size: int = 450) -> tuple[np.ndarray, ...]:
    """Digits scaled to [0, 1]; a fixed split (seed 0), independent of the training seed."""
    data, target = digits()
    x = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(y))
    te, tr = perm[:test_size], perm[test_size:]
    return x[tr], y[tr], x[te], y[te]


def _init(seed: int, hidden: int = HIDDEN) -> np.ndarray:
    """Flat float32 parameters (w1, b1, w2, b2), PyTorch's default Linear init."""
    rng = np.random.default_rng([seed, 1])
    a1, a2 = 1 / np.sqrt(N_IN), 1 / np.sqrt(hidden)
    parts = [
        rng.uniform(-a1, a1, N_IN * hidden),
        rng.uniform(-a1, a1, hidden),
        rng.uniform(-a2, a2, hidden * N_OUT),
        rng.uniform(-a2, a2, N_OUT),
    ]
    return np.concatenate(parts).astype(np.float32)


def _model(hidden: int = HIDDEN) -> tuple[Callable, Callable]:
    """(vmapped per-worker gradient, logits) of the MLP on a flat parameter vector."""
    import torch
    from torch.func import grad, vmap

    s1 = N_IN * hidden
    s2 = s1 + hidden
    s3 = s2 + hidden * N_OUT

    def logits(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        w1 = theta[:s1].reshape(hidden, N_IN)
        w2 = theta[s2:s3].reshape(N_OUT, hidden)
        h = torch.relu(x @ w1.T + theta[s1:s2])
        return h @ w2.T + theta[s3:]

    def loss(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits(theta, x), y)

    return vmap(grad(loss)), logits


def _accuracy(logits: Callable, theta: np.ndarray, x, y) -> float:
    import torch

    with torch.no_grad():
        pred = logits(torch.from_numpy(theta), x).argmax(dim=1)
    return float((pred == y).double().mean())


def _batches(cfg: LossToleranceConfig, seed: int, n_train: int) -> np.ndarray:
    """[steps, workers, batch] train indices: shard r is worker r's, reshuffled each epoch."""
    rng = np.random.default_rng([seed, 2])
    shards = np.array_split(rng.permutation(n_train), cfg.workers)
    out = np.empty((cfg.steps, cfg.workers, cfg.batch), dtype=np.int64)
    for r, shard in enumerate(shards):
        need = cfg.steps * cfg.batch
        epochs = [rng.permutation(shard) for _ in range(-(-need // len(shard)))]
        order = np.concatenate(epochs)[:need]
        out[:, r, :] = order.reshape(cfg.steps, cfg.batch)
    return out


def run_one(cfg: LossToleranceConfig, mode: str, loss: float, seed: int) -> RunResult:
    """Train once: mode "reference" (float64 mean) or "rht" / "no_rht" (simulate_allreduce)."""
    import torch

    torch.set_num_threads(1)
    from optireduce import simulate_allreduce

    if mode not in ("rht", "no_rht", "reference"):
        raise ValueError(f"mode {mode!r}: expected rht, no_rht or reference")
    xtr, ytr, xte, yte = load_data(cfg.test_size)
    xtr_t, ytr_t = torch.from_numpy(xtr), torch.from_numpy(ytr)
    xte_t, yte_t = torch.from_numpy(xte), torch.from_numpy(yte)
    grad_fn, logits = _model()
    batches = _batches(cfg, seed, len(ytr))
    params = cfg.nic_params(rht=mode == "rht")

    theta = np.tile(_init(seed), (cfg.workers, 1))  # [workers, D], one replica per worker
    vel = np.zeros_like(theta)
    lost1 = lost2 = packets = 0
    half_acc = 0.0
    for t in range(cfg.steps):
        idx = torch.from_numpy(batches[t])
        g = grad_fn(torch.from_numpy(theta), xtr_t[idx], ytr_t[idx]).numpy()
        if mode == "reference":
            avg = np.broadcast_to(g.astype(np.float64).mean(axis=0).astype(np.float32), g.shape)
        else:
            outs, st = simulate_allreduce(
                [np.ascontiguousarray(v) for v in g], params=params, drop_rate=loss,
                seed=seed * 1_000_003 + t, calibrate=False,
            )  # fmt: skip
            avg = np.stack(outs)
            lost1 += st.lost_phase1
            lost2 += st.lost_phase2
            packets += sum(c["tx_scatter"] + c["tx_gather"] for c in st.counters)
        vel = cfg.momentum * vel + avg
        theta = theta - np.float32(cfg.lr) * vel
        if t + 1 == cfg.steps // 2:
            half_acc = _accuracy(logits, theta[0], xte_t, yte_t)
    acc = [_accuracy(logits, th, xte_t, yte_t) for th in theta]
    centre = theta.astype(np.float64).mean(axis=0)
    dev = np.linalg.norm(theta - centre, axis=1).max() / np.linalg.norm(centre)
    spread = float((theta.max(axis=0) - theta.min(axis=0)).max())
    return RunResult(
        mode=mode, loss=loss, seed=seed, acc=acc, half_acc=half_acc, divergence=float(dev),
        divergence_max_abs=spread, lost_phase1=lost1, lost_phase2=lost2, packets=packets,
    )  # fmt: skip


def _task(args: tuple) -> RunResult:
    return run_one(*args)


def run_all(
    cfg: LossToleranceConfig,
    jobs: int = 0,
    progress: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Every (mode, loss, seed) and the reference for each seed, on `jobs` processes."""
    tasks = [(cfg, "reference", 0.0, s) for s in cfg.seeds]
    tasks += [
        (cfg, m, loss, s) for m in ("rht", "no_rht") for loss in cfg.losses for s in cfg.seeds
    ]
    jobs = jobs or os.cpu_count() or 1
    out = []
    if jobs == 1:
        for t in tasks:
            out.append(_task(t))
            if progress:
                progress(out[-1])
        return out
    import multiprocessing as mp

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
        for res in ex.map(_task, tasks):
            out.append(res)
            if progress:
                progress(res)
    return out


def summarize(cfg: LossToleranceConfig, results: Sequence[RunResult]) -> dict:
    """{"rht": {LOSS: {...}}, "no_rht": {...}, "reference_acc": ..., "settings": ...}.

    Accuracies are in [0, 1], averaged over the training seeds. `final_acc` is worker 0's,
    `mean_worker_acc` the mean over workers, `divergence` the replicas' relative L2
    divergence (max over workers and seeds), `packets_lost` the fraction of sent packets
    lost (both phases).
    """

    def mean(vals: Sequence[float]) -> float:
        return float(np.mean(vals))

    ref = [r for r in results if r.mode == "reference"]
    out: dict = {
        "reference_acc": mean([r.acc[0] for r in ref]),
        "reference_acc_per_seed": [r.acc[0] for r in ref],
        "reference_half_acc": mean([r.half_acc for r in ref]),
    }
    for mode in ("rht", "no_rht"):
        out[mode] = {}
        for loss in cfg.losses:
            rs = [r for r in results if r.mode == mode and r.loss == loss]
            sent = sum(r.packets for r in rs)
            out[mode][str(loss)] = {
                "final_acc": mean([r.acc[0] for r in rs]),
                "mean_worker_acc": mean([mean(r.acc) for r in rs]),
                "final_acc_per_seed": [r.acc[0] for r in rs],
                "half_acc": mean([r.half_acc for r in rs]),
                "divergence": max(r.divergence for r in rs),
                "divergence_max_abs": max(r.divergence_max_abs for r in rs),
                "packets_lost": (sum(r.lost_phase1 + r.lost_phase2 for r in rs) / sent)
                if sent
                else 0.0,
                "lost_phase1": sum(r.lost_phase1 for r in rs),
                "lost_phase2": sum(r.lost_phase2 for r in rs),
            }
    settings = asdict(cfg)
    settings["n_params"] = n_params()
    settings["model"] = f"MLP {N_IN}-{HIDDEN}-{N_OUT} ReLU, SGD with momentum"
    out["settings"] = settings
    return out


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"rht": "tab:blue", "no_rht": "tab:orange"}
    lowest = 100 * summary["reference_acc"]
    for mode, shift in (("rht", -0.1), ("no_rht", 0.1)):
        rows = summary[mode]
        xs = [100 * float(k) for k in rows]
        ax.plot(xs, [100 * v["final_acc"] for v in rows.values()], "o-", color=colors[mode],
                label=f"{mode}: worker 0")  # fmt: skip
        ax.plot(xs, [100 * v["mean_worker_acc"] for v in rows.values()], "s--",
                color=colors[mode], alpha=0.6, label=f"{mode}: mean over workers")  # fmt: skip
        for x, v in zip(xs, rows.values(), strict=True):
            accs = [100 * a for a in v["final_acc_per_seed"]]
            ax.vlines(x + shift, min(accs), max(accs), color=colors[mode], alpha=0.3, lw=4)
            lowest = min(lowest, *accs)
        ax2.plot(xs, [100 * v["divergence"] for v in rows.values()], "o-",
                 color=colors[mode], label=mode)  # fmt: skip
    ref = 100 * summary["reference_acc"]
    ax.axhline(ref, color="k", ls=":", label=f"float64 reference ({ref:.2f} %)")
    s = summary["settings"]
    ax.set_ylim(bottom=lowest - 4)
    ax.set_xlabel("injected packet loss (%)")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(
        f"digits, {s['workers']} workers, {s['steps']} steps, mean of {len(s['seeds'])} seeds"
        " (bars: seed range, worker 0)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    ax2.set_xlabel("injected packet loss (%)")
    ax2.set_ylabel("max_r |theta_r - mean| / |mean| (%)")
    ax2.set_title("divergence of the workers' parameters at the end (max over seeds)", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
