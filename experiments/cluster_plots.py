"""Plots of the cluster simulator (matplotlib, Agg): latency CDFs and P99 vs world size."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

STYLE = {
    "reliable_ring": ("tab:red", "-"),
    "reliable_tar": ("tab:orange", "-"),
    "optireduce": ("tab:blue", "-"),
    "optireduce_no_early": ("tab:cyan", "--"),
    "optireduce_no_rht": ("tab:green", ":"),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdfs(latency_us: Mapping[str, list[int]], path: str, title: str = "") -> None:
    """One CDF of op latency (ms) per algorithm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for algo, lat in latency_us.items():
        x = np.sort(np.asarray(lat, dtype=np.float64)) / 1000.0
        y = np.arange(1, len(x) + 1) / len(x)
        color, ls = STYLE.get(algo, (None, "-"))
        ax.step(x, y, where="post", label=algo, color=color, linestyle=ls)
    ax.set_xlabel("AllReduce op latency (ms)")
    ax.set_ylabel("CDF")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(p99_ms: Mapping[int, Mapping[str, float]], path: str, title: str = "") -> None:
    """P99 op latency (ms) vs world size, one line per algorithm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    sizes = sorted(p99_ms)
    algos = [a for a in STYLE if any(a in p99_ms[n] for n in sizes)]
    for algo in algos:
        color, ls = STYLE[algo]
        ns = [n for n in sizes if algo in p99_ms[n]]
        ax.plot(ns, [p99_ms[n][algo] for n in ns], marker="o", label=algo, color=color,
                linestyle=ls)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("workers")
    ax.set_ylabel("P99 op latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
