"""Live clusters on loopback with co-simulated NICs, and the `bench cosim` figures.

run_cluster() forks one process per rank, each with its UDP transport (made here,
so every rank knows every address before the fork) and its NIC: the sim backend
(the Verilated core in the C++ harness) for the ranks asked for, the software
model for the others. The op exponents are agreed from the inputs themselves (the
max of every rank's proposal, which every rank can compute here because the inputs
are known); the driver's reliable exchange is not what is measured.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from optireduce.host.model.quantize import propose_exponent
from optireduce.host.transport import UdpTransport
from optireduce.params import NicParams

# Deadlines far above any scheduling hiccup of a loaded 2-core machine: a lossless
# live run must not end a phase early. t_C starts at t_B (a build parameter of the core).
LIVE_PARAMS = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=5_000_000, t_c_min_us=1_000_000)
# The bench co-simulates a whole 16K-element chunk per op, far slower than real time:
# t_C may not fall under t_B, so a slow phase is waited for, not cut (and counted).
BENCH_PARAMS = NicParams(t_b_us=20_000_000, t_c_min_us=20_000_000)


@dataclass
class ClusterRun:
    outs: list[np.ndarray]
    stats: list[list[dict]]  # [rank][op] OpStats.to_dict()
    backends: list[str]
    op_seconds: float  # from the common start to the last rank's result
    sim_info: dict[int, dict]  # rank -> harness cycles, ticks, busy/wall time


def inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def known_agreement(p: NicParams, xs: Sequence[np.ndarray], rank: int):
    """The exponent agreement every rank reaches, from everyone's inputs (known here):
    per op the largest proposal."""

    def agree(proposals: list[int]) -> list[int]:
        bounds = range(0, xs[rank].size, p.c)
        return [max(propose_exponent(y[a : a + p.c], p) for y in xs) for a in bounds]

    return agree


def _worker(rank, p, xs, sim_ranks, transports, barrier, results) -> None:
    from optireduce.host.driver import select_nic

    for r, t in enumerate(transports):
        if r != rank:
            t.sock.close()  # the fork's copies of the other ranks' sockets
    x = xs[rank]

    agree = known_agreement(p, xs, rank)

    prefer = ("sim", "software") if rank in sim_ranks else ("software",)
    nic = select_nic(p, rank, len(xs), transport=transports[rank], agree=agree, prefer=prefer)
    try:
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        out, stats = nic.allreduce(x)
        dt = time.monotonic() - t0
        info = nic.info() if nic.backend == "sim" else {}
        results.put((rank, out, [s.to_dict() for s in stats], nic.backend, dt, info))
    finally:
        nic.close()


def collect(results, procs: list, world: int, timeout_s: float,
            check: Callable[[], None] | None = None) -> dict[int, tuple]:  # fmt: skip
    """Every rank's result tuple (rank first) from `results`; RuntimeError as soon as a
    process fails (or `check` raises), TimeoutError past timeout_s. The processes joined."""
    got: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < world:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            dead = [q.exitcode for q in procs if q.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a cluster worker failed (exit codes {dead})") from None
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster: {len(got)}/{world} ranks done in {timeout_s} s"
                                   ) from None  # fmt: skip
            continue
        got[item[0]] = item
    for q in procs:
        q.join(timeout=30)
    return got


def reap(procs: list) -> None:
    """Kill whatever still runs."""
    for q in procs:
        if q.is_alive():
            q.kill()
            q.join(timeout=5)


def run_cluster(
    p: NicParams,
    xs: Sequence[np.ndarray],
    sim_ranks: Sequence[int] = (0,),
    timeout_s: float = 300.0,
) -> ClusterRun:
    """One allreduce of xs[r] at each rank r, live on loopback; processes always reaped."""
    world = len(xs)
    # unkeyed whatever OPTIREDUCE_KEY_FILE says: the co-simulated NIC has no tags
    transports = [UdpTransport(r, key=None) for r in range(world)]
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(world), ctx.Queue()
    procs = []
    try:
        for t in transports:
            t.connect([u.address for u in transports])
        for r in range(world):
            args = (r, p, list(xs), tuple(sim_ranks), transports, barrier, results)
            procs.append(ctx.Process(target=_worker, args=args, daemon=True))
            procs[-1].start()
        got = collect(results, procs, world, timeout_s)
    finally:
        reap(procs)
        for t in transports:
            t.sock.close()
    ranks = [got[r] for r in range(world)]
    return ClusterRun(
        outs=[g[1] for g in ranks],
        stats=[g[2] for g in ranks],
        backends=[g[3] for g in ranks],
        op_seconds=max(g[4] for g in ranks),
        sim_info={g[0]: g[5] for g in ranks if g[5]},
    )


def bench_cosim(
    quick: bool = False, progress: Callable[[str], None] | None = None, seed: int = 0
) -> dict:
    """cycles_per_second of the live harness; one op of 1M elements (quick: 16K at
    LIVE_PARAMS) with 4 workers, one co-simulated, against all software in this run."""
    from optireduce.sim.cosim_build import harness_path

    say = progress or (lambda s: None)
    p, n, world = (LIVE_PARAMS, 16_384, 4) if quick else (BENCH_PARAMS, 1 << 20, 4)
    say("building the co-simulation harness (cached after the first time)")
    harness_path(p)
    xs = inputs(world, n, seed)
    say(f"mixed cluster: {world} workers, rank 0 co-simulated, {n} elements")
    mixed = run_cluster(p, xs, (0,))
    say(f"software cluster: {world} workers, {n} elements")
    soft = run_cluster(p, xs, ())
    info = mixed.sim_info[0]
    lost = [sum(s["lost_phase1"] + s["lost_phase2"] for s in r) for r in mixed.stats]
    return {
        # per second of the harness's CPU time (a loaded machine does not skew it),
        # then per second of busy wall time (not sleeping), then of all wall time
        "cycles_per_second": info["cycles"] / max(info["cpu_ns"] * 1e-9, 1e-9),
        "cycles_per_second_busy": info["cycles"] / max(info["busy_ns"] * 1e-9, 1e-9),
        "cycles_per_second_wall": info["cycles"] / max(info["wall_ns"] * 1e-9, 1e-9),
        "op_seconds_mixed": mixed.op_seconds,
        "op_seconds_software": soft.op_seconds,
        "mixed_over_software": mixed.op_seconds / soft.op_seconds,
        "cycles": info["cycles"],
        "elements": n,
        "workers": world,
        "params": {"p": p.p, "b": p.b, "c": p.c},
        "packets_lost_mixed": sum(lost),
        "identical_to_software": all(
            np.array_equal(a.view(np.uint32), b.view(np.uint32))
            for a, b in zip(mixed.outs, soft.outs, strict=True)
        ),
    }
