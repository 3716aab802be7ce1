"""Lightning runs for tests/test_lightning.py, in a process of their own:

    python -c "import sys, tests.lightning_workers as w; w.main(sys.argv[1])" OUT

Lightning's spawn launcher pickles the Trainer (its strategy and the OptiReduceState
with it) into two workers that import this module by name. Each worker writes
OUT/{run}{rank}.json; the test reads them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from datetime import timedelta

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.strategies import DDPStrategy

WORLD = 2
BATCH = 32  # per rank; a step's global batch is WORLD * BATCH consecutive samples
STEPS = 30
LR = 0.5
WARMUP = 3
GLOO_TIMEOUT_S = 60  # every gloo collective of Lightning's and DDP's
# lossless by construction: no injected loss, and deadlines far above any descheduling
NIC = {"t_b_us": 3_000_000, "t_c_min_us": 2_000_000}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher task in float64 (its labels: argmax of a fixed random linear map)."""
    from optireduce.experiments.ddp_example import teacher_task

    xs, ys = teacher_task()
    return xs.double(), ys


def rank_indices(rank: int) -> torch.Tensor:
    """This rank's samples, in order: step t takes [(t * WORLD + rank) * BATCH, + BATCH)."""
    starts = (torch.arange(STEPS) * WORLD + rank) * BATCH
    return (starts[:, None] + torch.arange(BATCH)).reshape(-1)


class CommHookDDPStrategy(DDPStrategy):
    """DDPStrategy that registers ddp_comm_hook on CPU as well: Lightning 2.6 does so only
    for CUDA devices (DDPStrategy._register_ddp_hooks) and ignores it otherwise."""

    def configure_ddp(self) -> None:
        super().configure_ddp()
        if self._ddp_comm_hook is not None and not getattr(self.model, "_comm_hooks", []):
            _register_ddp_comm_hook(self.model, self._ddp_comm_state, self._ddp_comm_hook,
                                    self._ddp_comm_wrapper)  # fmt: skip


class TeacherRegression(L.LightningModule):
    """Softmax regression on the teacher task, from zero weights: a convex, smooth
    loss, so the test can bound how far a perturbed mean moves the parameters."""

    def __init__(self, out: str, run: str) -> None:
        super().__init__()
        self.out, self.run = out, run
        self.lin = torch.nn.Linear(20, 3)
        torch.nn.init.zeros_(self.lin.weight)
        torch.nn.init.zeros_(self.lin.bias)
        self.trajectory: list[list[float]] = []  # parameters before each step
        self.losses: list[float] = []
        self.full_loss: list[float] = []

    def flat(self) -> list[float]:
        return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in self.parameters()])]

    def whole_set_loss(self) -> float:
        xs, ys = data()
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(self.lin(xs), ys))

    def train_dataloader(self):
        xs, ys = data()
        idx = rank_indices(self.trainer.global_rank)
        ds = torch.utils.data.TensorDataset(xs[idx], ys[idx])
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False)

    def on_train_start(self) -> None:
        self.full_loss.append(self.whole_set_loss())

    def training_step(self, batch, batch_idx):
        xb, yb = batch
        self.trajectory.append(self.flat())
        loss = torch.nn.functional.cross_entropy(self.lin(xb), yb)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)

    def on_train_end(self) -> None:
        self.full_loss.append(self.whole_set_loss())
        state = self.trainer.strategy._ddp_comm_state
        nic = state._nic  # not state.nic: that would start a NIC the hook never used
        out = {
            "rank": self.trainer.global_rank,
            "params": self.flat(),
            "trajectory": self.trajectory,
            "losses": self.losses,
            "full_loss": self.full_loss,
            "hook": {
                "backend": nic.backend if nic is not None else None,
                "t_b_us": state.t_b_us,
                "faults": state.faults,
                "steps": [
                    {
                        "iteration": s.iteration,
                        "resynced": s.resynced,
                        "faults": s.faults,
                        "buckets": [dataclasses.asdict(b) for b in s.buckets],
                    }
                    for s in state.history
                ],
            },
        }
        with open(f"{self.out}/{self.run}{self.trainer.global_rank}.json", "w") as f:
            json.dump(out, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit(out: str, run: str) -> None:
    """One Trainer.fit on WORLD spawned CPU workers. `gloo`: the stock DDPStrategy given the
    hook (Lightning leaves it out on CPU: DDP's own gloo allreduce); `optireduce`: the
    strategy that registers it."""
    from optireduce import OptiReduceState, optireduce_hook
    from optireduce.params import NicParams

    state = OptiReduceState(NicParams(**NIC), warmup_iters=WARMUP, t_b_us=NIC["t_b_us"],
                            checksum_every=10)  # fmt: skip
    cls = CommHookDDPStrategy if run == "optireduce" else DDPStrategy
    strategy = cls(
        process_group_backend="gloo", start_method="spawn",
        timeout=timedelta(seconds=GLOO_TIMEOUT_S),
        ddp_comm_state=state, ddp_comm_hook=optireduce_hook,
    )  # fmt: skip
    os.environ["MASTER_PORT"] = str(_free_port())
    trainer = L.Trainer(
        accelerator="cpu", devices=WORLD, strategy=strategy, max_steps=STEPS,
        precision="64-true", use_distributed_sampler=False,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(TeacherRegression(out, run))


def main(out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.set_num_threads(1)
    for run in ("gloo", "optireduce"):
        fit(out, run)
    print("lightning runs done", file=sys.stderr)
