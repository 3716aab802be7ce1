"""The OptiReduce hook inside a PyTorch Lightning Trainer: DDPStrategy, 2 CPU workers
launched by Lightning (start_method="spawn"), against the same run on DDP's gloo allreduce.

Lightning 2.6 registers `ddp_comm_hook` only on CUDA devices; on CPU the stock
DDPStrategy drops it without a word. tests/lightning_workers.py therefore runs the stock
strategy (the reference: DDP's own gloo allreduce) and a DDPStrategy subclass that
registers the hook on CPU too.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # both fits; measured 23-34 s at load 6-8 on 2 cores


def run_lightning(out: Path) -> float:
    """tests/lightning_workers.main in a session of its own (with its spawned workers),
    killed whole past TIMEOUT_S; returns the seconds it took."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-c", "import sys, tests.lightning_workers as w; w.main(sys.argv[1])",
           str(out)]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the Lightning runs did not finish within {TIMEOUT_S} s; "
                    f"stderr tail:\n{err[-3000:]}")  # fmt: skip
    assert proc.returncode == 0, f"the Lightning runs failed (rc {proc.returncode}):\n{err[-4000:]}"
    return time.monotonic() - t0


def local_gradient(theta, x, y):
    """d/dtheta of the mean cross-entropy of softmax(x W^T + b), theta = [W (3x20), b (3)]:
    (p - onehot(y))^T x / m and the mean of p - onehot(y)."""
    import torch

    w, b = theta[:60].view(3, 20), theta[60:]
    r = torch.softmax(x @ w.T + b, dim=1) - torch.nn.functional.one_hot(y, 3).double()
    return torch.cat([(r.T @ x / len(x)).reshape(-1), r.mean(0)])


def test_lightning_trainer_runs_the_hook(tmp_path):
    import torch

    import tests.lightning_workers as w
    from optireduce.params import NicParams

    took = run_lightning(tmp_path)
    print(f"two Lightning fits (gloo, optireduce), {w.WORLD} workers each: {took:.1f} s")
    gloo = [json.loads((tmp_path / f"gloo{r}.json").read_text()) for r in range(w.WORLD)]
    opti = [json.loads((tmp_path / f"optireduce{r}.json").read_text()) for r in range(w.WORLD)]

    # The stock strategy on CPU: the hook never ran, so this is DDP's gloo allreduce.
    for g in gloo:
        assert g["hook"]["steps"] == [] and g["hook"]["backend"] is None, (
            "Lightning's DDPStrategy now registers ddp_comm_hook on CPU: the reference run "
            "is no longer plain gloo (and the subclass in tests/lightning_workers.py is moot)"
        )

    # The hook ran every step on every rank, on the native NIC, without a lost packet.
    for o in opti:
        h = o["hook"]
        assert h["backend"] == "native"
        assert h["t_b_us"] == w.NIC["t_b_us"] and h["faults"] == []
        assert [s["iteration"] for s in h["steps"]] == list(range(w.STEPS))
        for s in h["steps"]:
            want = "warmup" if s["iteration"] < w.WARMUP else "optireduce"
            assert [b["mode"] for b in s["buckets"]] == [want], s  # one bucket: 63 parameters
            assert sum(b["elements"] for b in s["buckets"]) == 63
            assert all(b["lost_fraction"] == 0 and b["saturations"] == 0 for b in s["buckets"]), s
            assert not s["resynced"] and s["faults"] == []

    # Replicas equal, bit for bit, all along.
    for run in (gloo, opti):
        assert run[0]["params"] == run[1]["params"]
        assert run[0]["trajectory"] == run[1]["trajectory"]

    # It learned: from the zero model's ln 3 to well below it on the whole set.
    for run in (gloo, opti):
        start, end = run[0]["full_loss"]
        assert abs(start - math.log(3)) < 1e-12
        assert end < 0.4 * start, run[0]["full_loss"]

    # The reference run is plain SGD on the global batch (mean of the ranks' batch means):
    # the test's own float64 SGD reproduces it, so the batches below are the ones trained on.
    xs, ys = w.data()
    n_per_step = w.WORLD * w.BATCH

    def batch(t: int, r: int):
        lo = (t * w.WORLD + r) * w.BATCH
        return xs[lo : lo + w.BATCH], ys[lo : lo + w.BATCH]

    theta = torch.zeros(63, dtype=torch.float64)
    ref = []
    for t in range(w.STEPS):
        ref.append(theta)
        g = sum(local_gradient(theta, *batch(t, r)) for r in range(w.WORLD)) / w.WORLD
        theta = theta - w.LR * g
    ref.append(theta)
    got = torch.tensor(gloo[0]["trajectory"] + [gloo[0]["params"]], dtype=torch.float64)
    assert (got - torch.stack(ref)).abs().max() < 1e-12

    # Tolerance against the gloo run, from the quantization alone (docs/numerics.md 8):
    # per element |mean error| <= 1.5 D + 2^-24 |mean| with D = 2^E <= 2^(3 - w_in) M (the
    # exponent rule gives 2^(2 - w_in) M; a rounding carry doubles it), M the largest
    # input |x| over the ranks; the float64 -> float32 cast of the inputs adds 2^-24 M.
    # Softmax regression is convex and L-smooth with L <= lambda_max(X^T X / m) / 2
    # (Boehning), so for lr <= 2 / L a gradient step does not increase the distance
    # between two parameter vectors: the distance grows by at most lr * |error|_2 a step,
    # plus float64 rounding (1e-12, the reference match above).
    w_in = NicParams(**w.NIC).w_in
    per_m = 1.5 * 2.0 ** (3 - w_in) + 2 * 2.0**-24
    traj = torch.tensor(opti[0]["trajectory"] + [opti[0]["params"]], dtype=torch.float64)
    bound, bounds = 0.0, [0.0]
    for t in range(w.STEPS):
        xg = xs[t * n_per_step : (t + 1) * n_per_step]
        xg = torch.cat([xg, torch.ones(n_per_step, 1, dtype=xg.dtype)], dim=1)  # the bias's 1
        lip = torch.linalg.eigvalsh(xg.T @ xg / n_per_step).max().item() / 2
        assert 2 / lip >= w.LR, f"step {t}: L = {lip}, lr above 2 / L"
        m = max(local_gradient(traj[t], *batch(t, r)).abs().max().item() for r in range(w.WORLD))
        bound += w.LR * math.sqrt(63) * per_m * m * (1 + 2.0**-20) + 1e-12
        bounds.append(bound)
    apart = (traj - got).norm(dim=1).tolist()
    pairs = list(zip(apart, bounds, strict=True))
    print(f"|optireduce - gloo|_2 final {apart[-1]:.3g}, bound {bounds[-1]:.3g}; "
          f"largest share of the bound {max(d / b for d, b in pairs[1:]):.3g}")  # fmt: skip
    assert apart[0] == 0
    assert all(d <= b for d, b in pairs), pairs
    assert apart[-1] > 0  # the hook's quantized mean really made the steps
