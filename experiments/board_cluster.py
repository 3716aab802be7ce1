"""One allreduce on namespace hosts where some ranks are virtual boards and the others
run the native engine (docs/boards.md, "The virtual board").

Each rank is a process on its own host (a network namespace, experiments/netns.py);
a board rank's process drives its virtual board through the `board` backend over the
board's host port, exactly as it would a board on a cable. Every rank is at the NIC's
build addressing (OPTIREDUCE_IFNAME, OPTIREDUCE_PORT), and the ranks meet in a FileStore.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optireduce.experiments.bench_cosim import collect, known_agreement, reap
from optireduce.experiments.netns import BOARD_HOST_IF, IFNAME, NetnsCluster, enter
from optireduce.params import NicParams


@dataclass
class BoardRun:
    outs: list[np.ndarray]
    stats: list[list[dict]]  # [rank][op] OpStats.to_dict()
    backends: list[str]
    counters: list[dict[str, int]]  # each rank's NIC counters after the call
    op_seconds: float  # from the common start to the last rank's result
    boards: dict[int, dict] = field(default_factory=dict)  # rank -> the harness's figures


def _worker(rank: int, p: NicParams, xs: list[np.ndarray], boards: tuple[int, ...],
            ns: str, store_path: str, barrier, results) -> None:  # fmt: skip
    enter(ns)  # before any socket: this rank lives on its host's stack
    import torch.distributed as dist

    from optireduce.host.board_nic import BOARD_IFNAME_VAR, board_address
    from optireduce.host.driver import select_nic
    from optireduce.host.transport import transport_from_store

    os.environ.update({"OPTIREDUCE_IFNAME": IFNAME, "OPTIREDUCE_PORT": str(p.udp_port)})
    board = rank in boards
    if board:
        os.environ[BOARD_IFNAME_VAR] = BOARD_HOST_IF
    world = len(xs)
    store = dist.FileStore(store_path, world)
    transport = transport_from_store(store, rank, world, key=None,
                                     publish=board_address(rank, p) if board else None)  # fmt: skip

    agree = known_agreement(p, xs, rank)
    prefer = ("board",) if board else ("native",)
    nic = select_nic(p, rank, world, transport=transport, agree=agree, prefer=prefer)
    try:
        barrier.wait(timeout=120)
        t0 = time.monotonic()
        out, stats = nic.allreduce(xs[rank])
        dt = time.monotonic() - t0
        results.put((rank, out, [s.to_dict() for s in stats], nic.backend, nic.counters(), dt))
        barrier.wait(timeout=120)  # no rank leaves while another may still need its socket
    finally:
        nic.close()


def run_board_cluster(p: NicParams, xs: Sequence[np.ndarray], boards: Sequence[int],
                      tmp: Path, timeout_s: float = 600.0) -> BoardRun:  # fmt: skip
    """One allreduce of xs[r] at each rank r; ranks in `boards` on virtual boards, each
    capturing its two ports to tmp/board<b>-host.pcap and -net.pcap. The namespaces and
    every process are removed at the end, whatever happens."""
    from optireduce.sim.cosim_build import board_harness_path

    exe = board_harness_path(p)  # before the namespaces: the first build takes minutes
    world = len(xs)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(world), ctx.Queue()
    procs = []
    with NetnsCluster(world, boards=boards) as c:
        for b in boards:
            c.start_board(b, str(exe), stats=str(tmp / f"board{b}.json"),
                          pcap=str(tmp / f"board{b}"))  # fmt: skip
        for r in range(world):
            args = (r, p, list(xs), tuple(boards), c.ns[r], str(tmp / "store"), barrier, results)
            procs.append(ctx.Process(target=_worker, args=args, daemon=True))
            procs[-1].start()

        def boards_alive() -> None:
            for b, proc in zip(boards, c.procs, strict=True):
                if proc.poll() is not None:
                    why = proc.stderr.read()[-2000:]
                    raise RuntimeError(f"rank {b}'s virtual board exited: {why}")

        try:
            got = collect(results, procs, world, timeout_s, boards_alive)
        finally:
            reap(procs)
    figures = {b: json.loads((tmp / f"board{b}.json").read_text()) for b in boards
               if (tmp / f"board{b}.json").exists()}  # fmt: skip
    ranks = [got[r] for r in range(world)]
    return BoardRun(
        outs=[g[1] for g in ranks],
        stats=[g[2] for g in ranks],
        backends=[g[3] for g in ranks],
        counters=[g[4] for g in ranks],
        op_seconds=max(g[5] for g in ranks),
        boards=figures,
    )
