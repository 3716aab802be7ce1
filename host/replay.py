"""Replay a trace through a NIC backend; collect its output frames and counters.

The trace's first host frame (CONFIG) sets the NIC up; START/DATA frames are host
commands, queued at the host port until the op window has room (as a command FIFO
does); every other frame is network input. Ticks come from the trace's
timestamps. After the last frame the NIC's timers run out (every phase ends by its
deadline). A malformed frame is input, counted, never an error; an unreadable
file is an error.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from optireduce.host import host_port
from optireduce.host.nic_model import NicModel
from optireduce.host.trace import Frame
from optireduce.params import NicParams

BACKENDS = ("model", "rtl")


class ReplayError(RuntimeError):
    """The trace cannot be replayed (no CONFIG frame, unknown backend)."""


@dataclass
class ReplayResult:
    frames: list[Frame] = field(default_factory=list)  # network and host output, by tick
    counters: dict[str, int] = field(default_factory=dict)
    results: dict[int, np.ndarray] = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "frames_out": len(self.frames),
            "ops_completed": len(self.results),
            "counters": self.counters,
        }


def replay(frames: list[Frame], backend: str = "model") -> ReplayResult:
    if backend == "rtl":
        raise ReplayError(
            "the rtl replay backend needs the Verilated NIC core, which is not built yet "
            "(issue 4); use --backend model"
        )
    if backend != "model":
        raise ReplayError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    res = ReplayResult()
    nic: NicModel | None = None
    chunks = host_port.ChunkAssembler()
    pending: deque = deque()  # whole chunks waiting for room in the op window
    host_drops = 0

    def admit(now: int) -> None:
        """The host port queues START commands; an op starts when the window has room."""
        while pending and pending[0][0] < nic.base + nic.p.ops_in_flight:
            op_id, exponent, data = pending.popleft()
            nic.start_op(now, op_id, data, exponent)

    def drain(now: int) -> None:
        for tx in nic.poll_tx():
            res.frames.append((tx.time_us, tx.frame))
        for r in nic.poll_results():
            res.results[r.op_id] = r.data
            res.frames += [
                (now, f)
                for f in host_port.chunk_frames(host_port.RESULT, r.op_id, r.data, r.stats.exponent)
            ]
            res.frames.append((now, host_port.stats_frame(host_port.stats_words(r.stats))))

    for tick, frame in frames:
        if host_port.is_host_frame(frame):
            try:
                f = host_port.parse(frame)
                if f.kind == host_port.CONFIG:
                    cfg = json.loads(f.payload)
                    nic = NicModel(NicParams(**cfg["params"]), cfg["rank"], cfg["world"])
                elif f.kind in (host_port.START, host_port.DATA):
                    if nic is None:
                        raise ReplayError("the trace starts an op before its CONFIG frame")
                    whole = chunks.add(f)
                    if whole is not None:
                        pending.append(whole)
                else:
                    host_drops += 1  # results are the NIC's output, not input
            except (ValueError, KeyError, TypeError):
                host_drops += 1
        elif nic is None:
            raise ReplayError("the trace has network frames before its CONFIG frame")
        else:
            nic.receive(tick, frame)
        if nic is not None:
            nic.advance(tick)
            drain(tick)
            admit(tick)
            drain(tick)
    if nic is None:
        raise ReplayError("the trace has no CONFIG frame")
    # Let every timer run out: each phase ends by its deadline, so this ends.
    for _ in range(100_000):
        t = nic.next_timer()
        if t is None:
            break
        nic.advance(t)
        drain(t)
        admit(t)
        drain(t)
    res.counters = dict(nic.counters)
    res.counters["host_malformed"] = host_drops
    order = sorted(range(len(res.frames)), key=lambda k: (res.frames[k][0], k))
    res.frames = [res.frames[k] for k in order]
    return res
