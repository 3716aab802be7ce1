"""Worker bodies for the multi-process tests (spawned: must be importable)."""

from __future__ import annotations

import json
import os

import numpy as np


def live_inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def allreduce_worker(rank: int, world: int, tmp: str, n: int, seed: int, cfg: dict) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    from optireduce.host.driver import select_nic, torch_exponent_agreement
    from optireduce.host.impairment import ImpairmentSpec
    from optireduce.host.transport import UdpTransport, addresses_from_store
    from optireduce.params import NicParams

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()
    imp = ImpairmentSpec(**cfg["impairment"]) if cfg.get("impairment") else None
    transport = UdpTransport(rank, impairment=imp, seed=seed * 100 + rank)
    transport.connect(addresses_from_store(store, rank, world, transport.address))
    nic = select_nic(
        NicParams(**cfg.get("params", {})), rank, world,
        transport=transport, agree=torch_exponent_agreement(),
    )  # fmt: skip
    x = live_inputs(world, n, seed)[rank]
    if cfg.get("calibrate"):
        t_b = nic.calibrate(x[: 2 * nic.p.c], ops=3)
    else:
        t_b = nic.p.t_b_us
    out, stats = nic.allreduce(x)
    np.save(f"{tmp}/out{rank}.npy", out)
    with open(f"{tmp}/stats{rank}.json", "w") as f:
        json.dump({"t_b_us": t_b, "ops": [s.to_dict() for s in stats],
                   "sent": transport.sent, "lost": transport.impairment.lost
                   if transport.impairment else 0}, f)  # fmt: skip
    dist.barrier()
    nic.close()
    dist.destroy_process_group()
