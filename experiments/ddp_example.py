"""A small DDP training run with the OptiReduce hook, on one host or many (torchrun).

    torchrun --nnodes=N --nproc-per-node=M --node-rank=I --master-addr=A --master-port=P \\
        -m optireduce.example [--steps S] [--json]

Every rank binds OptiReduce's sockets on the interface that reaches the rendezvous (or
OPTIREDUCE_IFNAME) and gloo on the same interface unless GLOO_SOCKET_IFNAME is set.
With --json, rank 0 prints as its last line one JSON object: world, backend, peers (the
address each rank uses for OptiReduce traffic, by rank), final_loss, final_acc,
lost_fraction, replica_checksums_equal (every live rank's parameter checksum, compared
through the store), admission_drops (by rank), faults (ranks found gone) and step_times.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from datetime import timedelta

KEY = "optireduce/example/"
FINAL_WAIT_S = 60.0  # how long rank 0 waits for the live ranks' final figures


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


def train_step(ddp, opt, xs, ys, it: int, world: int, rank: int) -> float:
    """One SGD step of the example on this rank's 64 samples of step `it`; its seconds."""
    import torch

    t0 = time.monotonic()
    lo = (it * world + rank) * 64 % 3968
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ddp(xs[lo : lo + 64]), ys[lo : lo + 64]).backward()
    opt.step()
    return time.monotonic() - t0


def _gloo_interface() -> None:
    """GLOO_SOCKET_IFNAME, when unset, to the interface OptiReduce binds (gloo otherwise
    resolves the hostname, which on many hosts names loopback or nothing)."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    import socket

    from optireduce.host.bind_address import interface_ipv4, local_ipv4

    addr = local_ipv4()
    for _, name in socket.if_nameindex():
        try:
            if interface_ipv4(name) == addr:
                os.environ["GLOO_SOCKET_IFNAME"] = name
                return
        except OSError:
            continue


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", "--iters", dest="steps", type=int, default=60)
    ap.add_argument("--json", action="store_true", help="rank 0: one JSON line at the end")
    ap.add_argument("--loss", type=float, default=0.0, help="injected packet loss")
    ap.add_argument("--t-b-us", type=int, default=None, help="fixed t_B (default: calibrate)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (calibrate t_B)")
    ap.add_argument("--progress", action="store_true", help="one line per step on stderr")
    ap.add_argument(
        "--p",
        type=int,
        default=None,
        help="elements per packet: 256 fits a 1500-byte MTU, 2048 a 9000-byte one",
    )
    ap.add_argument("--job-id", type=int, default=1, help="UBT job id (16 bits), one per job")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")  # fmt: skip
    _gloo_interface()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import NicParams, OptiReduceState, optireduce_hook
    from optireduce.host.model.impairment import ImpairmentSpec
    from optireduce.host.transport import STORE_PREFIX

    dist.init_process_group("gloo")  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    xs, ys = teacher_task()
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    ddp = DDP(model, bucket_cap_mb=0.01)
    # exponents agreed in-band: no exchange with the slowest rank before each bucket
    # (docs/numerics.md); the gateware's sim backend needs it off and says so
    params = NicParams(job_id=args.job_id, exp_inband=True)
    if args.p is not None:
        params = params.replace(p=args.p)
    if args.t_b_us is not None:
        params = params.replace(t_b_us=args.t_b_us, t_c_min_us=args.t_b_us // 2)
    state = OptiReduceState(
        params, warmup_iters=args.warmup, t_b_us=args.t_b_us,
        impairment=ImpairmentSpec(loss=args.loss) if args.loss else None, seed=rank,
    )  # fmt: skip
    ddp.register_comm_hook(state, optireduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    times = []
    for it in range(args.steps):
        times.append(train_step(ddp, opt, xs, ys, it, world, rank))
        if args.progress:
            print(f"optireduce.example rank {rank} step {it} {times[-1]:.3f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    with torch.no_grad():
        logits = model(xs)
        final_loss = torch.nn.functional.cross_entropy(logits, ys).item()
        acc = (logits.argmax(1) == ys).float().mean().item()
    ck = sum(p.detach().double().sum().item() for p in model.parameters())
    nic = state.nic
    c = nic.counters()
    ctl = state._control.transport.counters()
    mine = {
        "checksum": ck.hex(),
        "admission": {"not_member": c["not_member"], "wrong_sender": c["wrong_sender"],
                      "wrong_job": c["wrong_job"], "bad_tag": c["bad_tag"],
                      "control_not_member": ctl["not_member"],
                      "control_wrong_sender": ctl["wrong_sender"],
                      "control_bad_tag": ctl["bad_tag"]},
    }  # fmt: skip
    store.set(f"{KEY}final/{rank}", json.dumps(mine))
    faults = state.faults
    if rank == 0:
        live = [r for r in range(world) if r not in faults]
        store.set_timeout(timedelta(seconds=FINAL_WAIT_S))
        finals = {}
        for r in live:
            try:
                finals[r] = json.loads(store.get(f"{KEY}final/{r}"))
            except Exception:  # a rank that died after the last exchange it answered
                log = logging.getLogger("optireduce")
                log.error("optireduce.example: rank %d sent no final figures", r)
        peers = [store.get(f"{STORE_PREFIX}{r}").decode().rsplit(":", 1)[0] for r in range(world)]
        steps = [s for s in state.history if s.buckets and s.buckets[0].mode != "warmup"]
        checksums = {r: float.fromhex(f["checksum"]) for r, f in finals.items()}
        out = {
            "world": world, "backend": nic.backend, "peers": peers,
            "final_loss": final_loss, "final_acc": acc,
            "lost_fraction": sum(s.lost_fraction for s in steps) / max(1, len(steps)),
            "max_lost_fraction": max((s.lost_fraction for s in steps), default=0.0),
            "replica_checksums_equal": len(finals) == len(live)
            and len(set(checksums.values())) == 1,
            "checksums": checksums,
            "admission_drops": {r: f["admission"] for r, f in finals.items()},
            "faults": faults, "step_faults": [s.faults for s in state.history],
            "t_b_us": state.t_b_us, "steps": len(state.history), "step_times": times,
        }  # fmt: skip
        if args.json:
            print(json.dumps(out), flush=True)
        else:
            print(f"world {world}, {nic.backend} NIC, peers {peers}: loss {final_loss:.4f}, "
                  f"accuracy {acc:.3f}, lost {out['lost_fraction']:.2%}, replicas "
                  f"{'equal' if out['replica_checksums_equal'] else 'DIFFER'}, "
                  f"faults {faults}")  # fmt: skip
    state.close()
    if not faults:
        dist.barrier()  # gloo cannot pass a dead peer: with a fault, each rank just leaves
    del ddp
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
