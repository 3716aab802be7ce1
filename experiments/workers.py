"""Worker processes for the training runs and the multi-process tests: forked from a server
that has imported torch, instead of spawned.

A spawned worker imports torch and, in DDP's constructor, torch._dynamo: 3-4 s of CPU per
process, most of a short run's wall time. multiprocessing's forkserver imports them once (the
first start in this process) and forks every worker from it. A forked worker would see the
server's environment, not this process's now, so each one takes this process's environment
as it is at the start (what a spawned one would inherit), and ends when that process does.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")


def start_workers(fn: Callable, args: tuple, nprocs: int):
    """fn(rank, *args) in nprocs processes (torch.multiprocessing's ProcessContext, not
    joined: the caller bounds the wait)."""
    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    return mp.start_processes(_in_env, args=(os.getpid(), dict(os.environ), fn, args),
                              nprocs=nprocs, join=False, start_method="forkserver")  # fmt: skip


def _in_env(rank: int, caller: int, env: dict[str, str], fn: Callable, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    _end_with(caller)
    fn(rank, *args)


ORPHAN_GRACE_S = 10.0


def _end_with(caller: int) -> None:
    """This worker ends when `caller` does: its parent is the forkserver, so the parent-death
    signal torch sets does not fire when the caller is killed. SIGINT first (as that signal
    would be), then, ORPHAN_GRACE_S later, exit."""
    import select
    import signal
    import threading

    try:
        fd = os.pidfd_open(caller)  # readable once the process has ended
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="end-with-caller", daemon=True).start()
