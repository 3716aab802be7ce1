"""Worker bodies for the multi-process tests (spawned: must be importable)."""

from __future__ import annotations

import json
import os
import time

import numpy as np

ATTEMPT = "OPTIREDUCE_TEST_WORLD_ATTEMPT"  # set by spawn_world: each attempt its own stores


def spawn_world(fn, args: tuple, nprocs: int, timeout_s: float) -> None:
    """Run fn(rank, *args) in nprocs processes (experiments/workers.py); kill them all past
    timeout_s.

    gloo's own rendezvous on loopback fails now and then under load ("connectFullMesh
    failed ... Connection closed by peer", also in PyTorch's CI): that, and only that, is
    retried once, with fresh stores (store_url) and one line saying so."""
    import sys

    import pytest
    import torch.multiprocessing as mp

    from optireduce.experiments.workers import start_workers

    for attempt in range(2):
        os.environ[ATTEMPT] = str(attempt)  # the workers take this environment
        ctx = start_workers(fn, args, nprocs)
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    for proc in ctx.processes:
                        proc.kill()
                    pytest.fail(f"{fn.__name__}: workers did not finish within {timeout_s} s")
            return
        except mp.ProcessRaisedException as e:
            if attempt or "connectFullMesh failed" not in str(e):
                raise
            print(f"{fn.__name__}: gloo's rendezvous failed, retrying once: "
                  f"{str(e).strip().splitlines()[-1][:200]}", file=sys.stderr)  # fmt: skip
        finally:
            os.environ.pop(ATTEMPT, None)


def store_url(tmp: str, name: str = "store") -> str:
    """A file store in tmp for this attempt of spawn_world (a failed attempt's files stay)."""
    return f"file://{tmp}/{name}-{os.environ.get(ATTEMPT, '0')}"


def join_world(rank: int, world: int, tmp: str):
    """This spawned worker in a gloo group of `world` on loopback (a file store in tmp),
    one thread per process; returns the group's store."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=store_url(tmp), rank=rank, world_size=world)
    return dist.distributed_c10d._get_default_store()


def live_inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def allreduce_worker(rank: int, world: int, tmp: str, n: int, seed: int, cfg: dict) -> None:
    store = join_world(rank, world, tmp)
    import torch.distributed as dist

    from optireduce.host.driver import select_nic, torch_exponent_agreement
    from optireduce.host.model.impairment import ImpairmentSpec
    from optireduce.host.transport import transport_from_store
    from optireduce.params import NicParams

    imp = ImpairmentSpec(**cfg["impairment"]) if cfg.get("impairment") else None
    transport = transport_from_store(store, rank, world, impairment=imp, seed=seed * 100 + rank)
    nic = select_nic(
        NicParams(**cfg.get("params", {})), rank, world,
        transport=transport, agree=torch_exponent_agreement(), prefer=cfg.get("prefer"),
    )  # fmt: skip
    x = live_inputs(world, n, seed)[rank]
    if cfg.get("calibrate"):
        t_b = nic.calibrate(x[: 2 * nic.p.c], ops=3)
    else:
        t_b = nic.p.t_b_us
    out, stats = nic.allreduce(x)
    np.save(f"{tmp}/out{rank}.npy", out)
    import torch

    with nic.transport.reliable():  # not part of the loss statistics below
        t_out, _ = nic.allreduce(torch.from_numpy(x[:20].copy()).view(4, 5))  # a tensor in
    np.save(f"{tmp}/tensor{rank}.npy", t_out.numpy())
    assert isinstance(t_out, torch.Tensor) and tuple(t_out.shape) == (4, 5)
    with open(f"{tmp}/stats{rank}.json", "w") as f:
        json.dump({"t_b_us": t_b, "ops": [s.to_dict() for s in stats], "backend": nic.backend,
                   "sent": nic.transport.sent, "lost": nic.transport.lost}, f)  # fmt: skip
    dist.barrier()
    nic.close()
    dist.destroy_process_group()


def ddp_worker(rank: int, world: int, tmp: str, cfg: dict) -> None:
    """Train a small MLP with DDP, plain or with the OptiReduce hook; save accuracy and
    a parameter checksum."""
    join_world(rank, world, tmp)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import OptiReduceState, optireduce_hook
    from optireduce.experiments.ddp_example import teacher_task
    from optireduce.host.model.impairment import ImpairmentSpec

    xs, ys = teacher_task()
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 3),
    )  # fmt: skip
    ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets
    state = None
    if cfg["hook"]:
        from optireduce.params import NicParams

        imp = ImpairmentSpec(**cfg["impairment"]) if cfg.get("impairment") else None
        state = OptiReduceState(
            NicParams(**cfg.get("params", {})),
            warmup_iters=3, policy=cfg.get("policy", "accept"),
            checksum_every=cfg.get("checksum_every", 10), impairment=imp, seed=rank,
            t_b_us=cfg.get("t_b_us"),
        )  # fmt: skip
        ddp.register_comm_hook(state, optireduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    times = []
    for it in range(cfg["iters"]):
        if rank == cfg.get("die_rank") and it == cfg.get("die_at"):
            os._exit(0)  # a worker dies mid-training, without a word to anyone
        if rank == cfg.get("stall_rank") and it == cfg.get("stall_at"):
            time.sleep(cfg["stall_s"])  # a worker stalls (descheduled, swapping, ...)
        t0 = time.perf_counter()
        lo = (it * world + rank) * 64 % 3968
        xb, yb = xs[lo : lo + 64], ys[lo : lo + 64]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    with torch.no_grad():
        acc = (model(xs).argmax(1) == ys).float().mean().item()
    ck = sum(p.detach().double().sum().item() for p in model.parameters())
    out = {"acc": acc, "checksum": ck, "times": times}
    if state is not None:
        out["steps"] = [
            {"lost": s.lost_fraction, "modes": [b.mode for b in s.buckets], "resynced": s.resynced}
            for s in state.history
        ]
        out["t_b_us"] = state.t_b_us
        out["faults"] = state.faults
        out["step_faults"] = [s.faults for s in state.history]
        state.close()
    with open(f"{tmp}/ddp{rank}.json", "w") as f:
        json.dump(out, f)
    if not out.get("faults"):  # a barrier would wait for the dead
        dist.barrier()
    del ddp
    dist.destroy_process_group()
