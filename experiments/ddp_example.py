"""A small DDP training run with the OptiReduce hook, for torchrun or spawn.

    torchrun --nproc_per_node 2 -m optireduce.experiments.ddp_example --iters 60

Rank 0 prints one JSON line: accuracy, every rank's parameter checksum, and the
hook's per-step loss figures.
"""

from __future__ import annotations

import argparse
import json
import os


def teacher_task(n: int = 4096):
    """(features, labels): 3 classes from a fixed random linear map of 20 features, the
    same on every rank; torch seeded and one thread per process."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(20, 3, generator=g)
    xs = torch.randn(n, 20, generator=g)
    return xs, (xs @ teacher).argmax(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--loss", type=float, default=0.0, help="injected packet loss")
    ap.add_argument("--t-b-us", type=int, default=None, help="fixed t_B (default: calibrate)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import NicParams, OptiReduceState, optireduce_hook
    from optireduce.host.model.impairment import ImpairmentSpec

    dist.init_process_group("gloo")  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    xs, ys = teacher_task()
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    ddp = DDP(model, bucket_cap_mb=0.01)
    params = (
        NicParams()
        if args.t_b_us is None
        else NicParams(t_b_us=args.t_b_us, t_c_min_us=args.t_b_us // 2)
    )
    state = OptiReduceState(
        params, warmup_iters=3, t_b_us=args.t_b_us,
        impairment=ImpairmentSpec(loss=args.loss) if args.loss else None, seed=rank,
    )  # fmt: skip
    ddp.register_comm_hook(state, optireduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for it in range(args.iters):
        lo = (it * world + rank) * 64 % 3968
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xs[lo : lo + 64]), ys[lo : lo + 64]).backward()
        opt.step()
    with torch.no_grad():
        acc = (model(xs).argmax(1) == ys).float().mean().item()
    ck = torch.tensor([sum(p.detach().double().sum().item() for p in model.parameters())])
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, ck.double())
    if rank == 0:
        print(json.dumps({
            "accuracy": acc, "checksums": [float(e) for e in every], "t_b_us": state.t_b_us,
            "steps": len(state.history), "max_lost": max(s.lost_fraction for s in state.history),
        }), flush=True)  # fmt: skip
    state.close()
    dist.barrier()
    del ddp
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
