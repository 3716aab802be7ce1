"""The hook with CUDA buckets: copied to pinned host memory, reduced, and copied back to
the bucket's device. Runs where a GPU exists."""

from __future__ import annotations

import json

import pytest
import torch

from tests.live_workers import join_world, spawn_world

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no GPU on this machine: the CUDA path runs where one exists",
)


def cuda_worker(rank: int, world: int, tmp: str) -> None:
    join_world(rank, world, tmp)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import NicParams, OptiReduceState, optireduce_hook
    from optireduce.experiments.ddp_example import teacher_task

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    xs, ys = teacher_task()
    xs, ys = xs.to(dev), ys.to(dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3)
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index], bucket_cap_mb=0.01)
    state = OptiReduceState(NicParams(t_b_us=3_000_000, t_c_min_us=1_500_000), warmup_iters=2,
                            t_b_us=3_000_000, checksum_every=5)  # fmt: skip
    ddp.register_comm_hook(state, optireduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for it in range(20):
        lo = (it * world + rank) * 64 % 3968
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xs[lo : lo + 64]), ys[lo : lo + 64]).backward()
        opt.step()
    with torch.no_grad():
        acc = (model(xs).argmax(1) == ys).float().mean().item()
    out = {
        "acc": acc,
        "checksum": sum(p.detach().double().sum().item() for p in model.parameters()),
        "devices": sorted({str(p.grad.device) for p in model.parameters()}),
        "modes": [b.mode for s in state.history for b in s.buckets],
        "lost": max(s.lost_fraction for s in state.history),
    }
    with open(f"{tmp}/cuda{rank}.json", "w") as f:
        json.dump(out, f)
    state.close()
    dist.barrier()
    del ddp
    dist.destroy_process_group()


def test_cuda_buckets_come_back_on_their_device(tmp_path):
    spawn_world(cuda_worker, (2, str(tmp_path)), 2, 240)
    outs = [json.loads((tmp_path / f"cuda{r}.json").read_text()) for r in range(2)]
    for r, out in enumerate(outs):
        assert out["devices"] == [f"cuda:{r % torch.cuda.device_count()}"]
        assert "optireduce" in out["modes"] and out["lost"] == 0
        assert out["acc"] > 0.5  # learnt (chance: 1/3)
    assert outs[0]["checksum"] == outs[1]["checksum"]
