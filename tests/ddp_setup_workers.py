"""Worker body of tests/test_ddp_setups.py (spawned: must be importable).

Each rank trains two copies of one model side by side on the same data: `ref` with plain
DDP (gloo's AllReduce, the reference) and `hk` with the OptiReduce hook. Before every step
hk takes ref's parameters, so both compute gradients at the same point; the step record
holds what the test checks: the largest gradient difference against the numerics bound, a
digest of hk's parameters after its own step (replicas), the GradScaler's scale and
whether each optimizer step was taken, and the hook's bucket statistics.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import pickle

from tests.live_workers import join_world, store_url

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
SUBNORMAL_STEP = {"float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}


def _model(cfg: dict):
    import torch

    torch.manual_seed(cfg.get("init_seed", 0))
    nn = torch.nn
    if cfg.get("layers") == "varied":  # buckets of very different sizes
        sizes = (20, 200, 48, 300, 64)
        layers = [m for a, b in itertools.pairwise(sizes) for m in (nn.Linear(a, b), nn.ReLU())]
        body = nn.Sequential(*layers)
    else:
        body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = body, nn.Linear(64, 3)
            # a second head, for find_unused_parameters only (DDP needs every parameter
            # used otherwise)
            self.other = nn.Linear(64, 3) if cfg.get("find_unused") else None

        def forward(self, x, use_other: bool = False):
            h = self.body(x)
            return self.other(h) if use_other else self.head(h)

    return Net()


def _digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().contiguous().view(-1).view(dtype=_int_view(p.dtype)).numpy().tobytes())
    return h.hexdigest()


def _int_view(dtype):
    import torch

    return {torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[dtype]  # fmt: skip


def _grad_check(hk, ref, exponent: int, world: int, w_in: int, dtype_name: str) -> dict:
    """Largest |hook - gloo| / bound over every gradient entry, and the non-finite picture.

    Bound (docs/numerics.md 8): the hook's mean is within 1.5 Delta + u_32 |x| of the exact
    mean, Delta = 2^E, and its cast to the dtype adds u |value|. Gloo divides each term by
    N and sums in the bucket's dtype: with N = 2 one rounding, u |value| (the halving is
    exact but for subnormals: a subnormal step each side); with N > 2 the partial sums round too,
    within (N - 1) u M, where M = 2^(E + w_in - 1) bounds every rank's entry."""
    import torch

    u = UNIT_ROUNDOFF[dtype_name]
    delta = 2.0**exponent
    big = 2.0 ** (exponent + w_in - 1)
    spread = (world - 1) * u * big if world > 2 else 0.0
    step = SUBNORMAL_STEP[dtype_name]
    worst, nonfinite_hk, nonfinite_ref, none_mismatch = 0.0, 0, 0, 0
    for ph, pr in zip(hk.parameters(), ref.parameters(), strict=True):
        if (ph.grad is None) != (pr.grad is None):
            none_mismatch += 1
            continue
        if pr.grad is None:
            continue
        gh, gr = ph.grad.double(), pr.grad.double()
        nonfinite_hk += int((~torch.isfinite(gh)).sum())
        nonfinite_ref += int((~torch.isfinite(gr)).sum())
        if not torch.isfinite(gr).all() or not torch.isfinite(gh).all():
            continue
        bound = (1.5 * delta + spread + 2 * step + 2 * u * torch.maximum(gh.abs(), gr.abs())
                 + 2.0**-23 * gh.abs())  # fmt: skip
        worst = max(worst, float(((gh - gr).abs() / bound).max()))
    return {"worst": worst, "nonfinite_hk": nonfinite_hk, "nonfinite_ref": nonfinite_ref,
            "none_mismatch": none_mismatch}  # fmt: skip


def setup_worker(rank: int, world: int, tmp: str, cfg: dict) -> None:
    join_world(rank, world, tmp)
    out = run_setup(rank, world, tmp, cfg)
    with open(f"{tmp}/setup{rank}.json", "w") as f:
        json.dump(out, f)


def scenarios_worker(rank: int, world: int, tmp: str, cfgs: dict[str, dict]) -> None:
    """Several set-ups one after the other in one pair of processes (spawning costs more
    than a set-up): each in its own process group on its own store, so that its hook
    state publishes its addresses afresh. A set-up that raises records the traceback."""
    import os
    import traceback

    import torch.distributed as dist

    join_world(rank, world, tmp)
    dist.destroy_process_group()
    for k, (name, cfg) in enumerate(cfgs.items()):
        sub = f"{tmp}/{name}"
        os.makedirs(sub, exist_ok=True)
        dist.init_process_group("gloo", init_method=store_url(tmp, f"store{k}"), rank=rank,
                                world_size=world)  # fmt: skip
        try:
            out = run_setup(rank, world, sub, cfg)
        except Exception:
            out = {"error": traceback.format_exc()}
        with open(f"{sub}/setup{rank}.json", "w") as f:
            json.dump(out, f)
        dist.destroy_process_group()
        if "error" in out:
            return  # the peer may be waiting in a collective: the spawn's bound ends it


def run_setup(rank: int, world: int, tmp: str, cfg: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import OptiReduceState, optireduce_hook
    from optireduce.experiments.ddp_example import teacher_task
    from optireduce.params import NicParams

    dtype_name = cfg.get("dtype", "float32")
    dtype = getattr(torch, dtype_name)
    xs, ys = teacher_task()
    xs = xs.to(dtype)
    base = _model(cfg).to(dtype)
    ref_m, hk_m = copy.deepcopy(base), copy.deepcopy(base)
    ddp_kw = {"bucket_cap_mb": cfg.get("bucket_cap_mb", 25),
              "find_unused_parameters": cfg.get("find_unused", False),
              "gradient_as_bucket_view": cfg.get("bucket_view", False)}  # fmt: skip
    ref, hk = DDP(ref_m, **ddp_kw), DDP(hk_m, **ddp_kw)
    params = NicParams(**cfg.get("params", {}))
    restore = cfg.get("restore_from")
    if restore:
        with open(f"{restore}/ckpt{rank}.pkl", "rb") as f:
            ck = pickle.load(f)
        state = ck["state"]
        for m in (ref_m, hk_m):
            m.load_state_dict(ck["model"])
    else:
        state = OptiReduceState(params, warmup_iters=cfg.get("warmup", 2),
                                t_b_us=cfg.get("t_b_us", 3_000_000),
                                policy=cfg.get("policy", "accept"),
                                checksum_every=cfg.get("checksum_every", 0))  # fmt: skip
    hk.register_comm_hook(state, optireduce_hook)
    lr = cfg.get("lr", 0.05)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    opt_hk = torch.optim.SGD(hk.parameters(), lr=lr)
    amp = cfg.get("amp", False)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)
               for _ in range(2)] if amp else None  # fmt: skip
    accum = cfg.get("accumulate", 1)
    now = {"it": -1}
    if rank == cfg.get("overflow_rank") and cfg.get("inject_inf_at"):
        # one gradient entry of one rank becomes inf, before DDP reduces it
        def poison(g):
            if now["it"] not in cfg["inject_inf_at"]:
                return g
            g = g.clone()
            g.view(-1)[7] = float("inf")
            return g

        for m in (ref_m, hk_m):
            m.body[0].weight.register_hook(poison)
    first = state.iteration if restore else 0
    steps = []
    for it in range(first, cfg["iters"]):
        now["it"] = it
        with torch.no_grad():
            for ph, pr in zip(hk.parameters(), ref.parameters(), strict=True):
                ph.copy_(pr)
            if it == cfg.get("perturb_at") and rank == world - 1:  # a replica drifts
                next(hk.parameters()).add_(0.01)
        before = [p.detach().clone() for p in hk.parameters()]
        rec = {"it": it}
        for k, (ddp, opt) in enumerate(((ref, opt_ref), (hk, opt_hk))):
            opt.zero_grad(set_to_none=True)
            for micro in range(accum):
                lo = ((it * accum + micro) * world + rank) * 32 % (len(xs) - 32)
                xb, yb = xs[lo : lo + 32].clone(), ys[lo : lo + 32]
                if amp and it in cfg.get("overflow_at", ()) and rank == cfg.get("overflow_rank"):
                    xb[0] *= 1e6  # fp16 activations overflow on this rank only
                use_other = cfg.get("find_unused", False) and it % 2 == 1
                sync = micro == accum - 1
                ctx = ddp.no_sync() if not sync else _nullcontext()
                with ctx:
                    if amp:
                        with torch.autocast("cpu", dtype=torch.float16):
                            loss = torch.nn.functional.cross_entropy(ddp(xb, use_other).float(), yb)
                        scalers[k].scale(loss).backward()
                    else:
                        loss = torch.nn.functional.cross_entropy(ddp(xb, use_other).float(), yb)
                        loss.backward()
            if k == 1:  # both have their averaged gradients now: compare before the step
                last = state.history[-1]
                exponent = max(b.exponent for b in last.buckets)
                if amp:  # ref's scaler.step unscaled its gradients: the same here, exactly
                    scalers[1].unscale_(opt)
                    exponent -= int(math.log2(scalers[1].get_scale()))
                rec.update(_grad_check(hk, ref, exponent, world, params.w_in, dtype_name))
                rec["resynced"] = last.resynced
                rec["buckets"] = [
                    {"index": b.index, "elements": b.elements, "mode": b.mode,
                     "lost": b.lost_fraction, "nonfinite_inputs": b.nonfinite_inputs,
                     "nonfinite_ops": b.nonfinite_ops, "saturations": b.saturations}
                    for b in last.buckets
                ]  # fmt: skip
                if cfg.get("bucket_view"):
                    rec["grad_is_view"] = _grads_share_storage(hk)
            if amp:
                scalers[k].step(opt)
                scalers[k].update()
                rec[f"scale{k}"] = scalers[k].get_scale()
            else:
                opt.step()
            if k == 1:
                rec["hk_stepped"] = any(not torch.equal(b, p) for b, p in
                                        zip(before, hk.parameters(), strict=True))  # fmt: skip
        rec["ref_stepped"] = any(not torch.equal(b, p) for b, p in
                                 zip(before, ref.parameters(), strict=True))  # fmt: skip
        digest = _digest(hk.parameters())
        rec["hk_finite"] = all(bool(torch.isfinite(p).all()) for p in hk.parameters())
        every = [None] * world
        dist.all_gather_object(every, digest)
        rec["replicas_equal"] = len(set(every)) == 1
        rec["ref_digest"] = _digest(ref.parameters())
        rec["hk_digest"] = digest
        steps.append(rec)
        if cfg.get("save_at") == it + 1:
            with open(f"{tmp}/ckpt{rank}.pkl", "wb") as f:
                pickle.dump({"state": state, "model": ref_m.state_dict()}, f)
    out = {"steps": steps, "t_b_us": state.t_b_us, "iteration": state.iteration,
           "backend": state.nic.backend, "history_len": len(state.history),
           "nic_t_b_us": state.nic.p.t_b_us}  # fmt: skip
    state.close()
    dist.barrier()
    return out


def _grads_share_storage(ddp) -> bool:
    """gradient_as_bucket_view: every gradient lives inside one of DDP's bucket buffers, so
    no two gradients are separate allocations: their storages are shared in few buffers."""
    ptrs = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters() if p.grad is not None}
    n = sum(1 for p in ddp.parameters() if p.grad is not None)
    return len(ptrs) < n


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
