"""Replay a trace through the NIC core (hw/nic_core.py) in amaranth.sim.

The same inputs as sim/replay.py gives the model (replay.events): the CONFIG frame's
rank and world become CSR writes, START commands go to host_cmd/host_i (a command
that waits for room in the op window stays presented, as in a FIFO), network frames
go to net_rx, and ticks follow the trace. The idle/tick protocol of the core: every
input is presented, then the driver waits (bounded) for `idle`, and only then
strobes `tick`, one tick at a time, so that every event happens at the model's
tick. Output: net_tx frames stamped with the core's `now` when they leave, host_o
records turned back into RESULT and STATS frames (optireduce/host_port.py), the CSR
counters at the end. Frames are sorted by (tick, bytes), as replay() sorts the
model's: the order within one microsecond is the pipeline's, not the protocol's.

This is the slow, all-Python path for small traces (TRACE_PARAMS); the equivalence
suite runs the Verilated core in the C++ harness.
"""

from __future__ import annotations

import random
import struct
from collections import deque

import numpy as np
from amaranth import Module, ResetInserter, Signal
from amaranth.sim import Simulator

from optireduce import host_port
from optireduce.host.model.nic_model import EXP_COUNTERS
from optireduce.hw.csr import Csr
from optireduce.hw.nic_core import NicCore
from optireduce.sim.replay import (
    ALL_NIC_COUNTERS,
    ReplayError,
    ReplayResult,
    cmd_bits,
    config_writes,
    counter_offsets,
    events,
    host_record,
)
from optireduce.sim.trace import Frame

MAX_BURST = 4096  # ticks strobed back to back (the aggregator queues up to 2^16 - 1)


class CoreSimError(RuntimeError):
    """The core did not do what the protocol requires within its bounds (a hang)."""


def beat_bytes(v: int) -> tuple[bytes, bool]:
    """A net_tx payload word's bytes (as many as `keep` marks) and whether it is `last`."""
    keep = (v >> 64) & 0xFF
    return (v & ((1 << 64) - 1)).to_bytes(8, "little")[: keep.bit_length()], bool(v >> 72 & 1)


def frame_beats(frame: bytes) -> list[int]:
    """net_rx payload words: 8 bytes (byte 0 at bits 7:0), keep at 64, last at 72."""
    out = []
    for off in range(0, len(frame), 8):
        chunk = frame[off : off + 8]
        last = off + 8 >= len(frame)
        keep = (1 << len(chunk)) - 1
        out.append(int.from_bytes(chunk, "little") | keep << 64 | int(last) << 72)
    return out


def replay_core(frames: list[Frame], **kw) -> ReplayResult:
    """Replay one trace through NicCore (see replay_traces)."""
    return replay_traces([frames], **kw)[0]


def replay_traces(
    traces: list[list[Frame]],
    *,
    backpressure: float = 0.0,
    seed: int = 0,
    idle_bound: int | None = None,
    progress: bool = False,
    tick0: int = 0,
) -> list[ReplayResult]:
    """Replay each trace through one NicCore (built once from the first trace's CONFIG
    params, which every trace must share), with a reset between traces.

    tick0: the core's clock after reset (NicCore(tick0=...)) and the driver's first
    tick: a trace whose ticks start there runs across the clock's wrap (`tick_bits`).

    backpressure: probability that net_tx / host_o are not ready in a cycle.
    Raises CoreSimError if the core is not idle within `idle_bound` cycles of an input.
    progress: show a rich progress bar (traces replayed).
    """
    evs = [events(frames) for frames in traces]
    p = evs[0].params
    if any(ev.params != p for ev in evs):
        raise ReplayError("replay_traces: every trace must have the same CONFIG params")
    if p.sdram_addr_bits:
        raise ReplayError("replay_traces: amaranth's simulator has no SDRAM; params with "
                          "sdram_addr_bits replay on the rtl backend (Verilator)")  # fmt: skip
    dut = NicCore(p, tick0=tick0 % (1 << p.tick_bits))
    soft_rst = Signal()
    top = Module()
    top.submodules.core = ResetInserter(soft_rst)(dut)
    bound = idle_bound or 200 * p.c + 20_000
    offsets = {**counter_offsets(p, ALL_NIC_COUNTERS), **counter_offsets(p, EXP_COUNTERS)}
    rng = random.Random(seed)
    out: list[ReplayResult] = []
    pending: deque = deque()  # STARTs handed to the host port, in order
    cur: dict = {}  # the trace being replayed: its result, tick, records, world

    async def wait_idle(ctx, what: str) -> None:
        for _ in range(bound):
            await ctx.tick()
            if ctx.get(dut.idle):
                return
        raise CoreSimError(f"the core was not idle {bound} cycles after {what} (tick "
                           f"{cur['now']})")  # fmt: skip

    async def run_one(ctx, ev) -> None:
        ctx.set(soft_rst, 1)
        await ctx.tick().repeat(2)
        ctx.set(soft_rst, 0)
        starts = deque(what for _, kind, what in ev.inputs if kind == "start")
        n_starts = len(starts)
        res = ReplayResult()
        cur.update(res=res, now=tick0, records=0, taken=0, world=ev.world, cycles=0, reset=True)
        for addr, value in config_writes(p, ev.rank, ev.world, ev.peers):
            ctx.set(dut.csr_addr, addr)
            ctx.set(dut.csr_w_data, value)
            ctx.set(dut.csr_w_en, 1)
            await ctx.tick()
        ctx.set(dut.csr_w_en, 0)
        await wait_idle(ctx, "reset")

        async def strobe():
            ctx.set(dut.tick, 1)
            await ctx.tick()
            ctx.set(dut.tick, 0)
            cur["now"] += 1
            await wait_idle(ctx, "a tick")

        async def burst(k: int):
            """k ticks back to back: only when no op is in flight, so no timer is live
            (NicModel.next_timer() is None) and the ticks only move `now`."""
            ctx.set(dut.tick, 1)
            await ctx.tick().repeat(k)
            ctx.set(dut.tick, 0)
            cur["now"] += k
            await wait_idle(ctx, "a burst of ticks")

        for tick, kind, what in ev.inputs:
            while cur["now"] < tick:
                if not pending and cur["taken"] == cur["records"] and tick - cur["now"] > 1:
                    await burst(min(tick - cur["now"], MAX_BURST))
                else:
                    await strobe()
            if kind == "start":
                pending.append(starts.popleft())
                await ctx.tick().repeat(3)  # the host feeder presents it
                await wait_idle(ctx, "a START")
                continue
            for beat in frame_beats(what):
                ctx.set(dut.net_rx.payload.as_value(), beat)
                ctx.set(dut.net_rx.valid, 1)
                for _ in range(bound):
                    ready = ctx.get(dut.net_rx.ready)
                    await ctx.tick()
                    if ready:
                        break
                else:
                    raise CoreSimError(f"net_rx not ready for {bound} cycles")
            ctx.set(dut.net_rx.valid, 0)
            await wait_idle(ctx, "a frame")
        # every op ends by its deadlines: 2 t_B per op, queued ops one after another
        limit = cur["now"] + (n_starts + 2) * 4 * p.t_b_us
        while cur["records"] < n_starts:
            if cur["now"] >= limit:
                raise CoreSimError(f"{cur['records']} of {n_starts} ops completed by tick "
                                   f"{limit}")  # fmt: skip
            await strobe()
        for name in offsets:
            ctx.set(dut.csr_addr, offsets[name])
            ctx.set(dut.csr_r_en, 1)
            await ctx.tick()
            ctx.set(dut.csr_r_en, 0)
            for _ in range(Csr.MAX_READ_CYCLES):  # a counter's read waits for its visit
                if ctx.get(dut.csr_r_valid):
                    break
                await ctx.tick()
            else:
                raise CoreSimError(f"no csr_r_valid for {name} in {Csr.MAX_READ_CYCLES} cycles")
            into = res.exp_counters if name in EXP_COUNTERS else res.counters
            into[name] = ctx.get(dut.csr_r_data)
        res.counters["host_malformed"] = ev.host_malformed
        res.frames.sort(key=lambda e: (e[0], e[1]))
        res.sim = {"cycles": cur["cycles"], "ticks": cur["now"]}
        out.append(res)

    async def main(ctx):
        for ev in evs:
            await run_one(ctx, ev)
            if bar is not None:
                bar.advance(task)

    async def push(ctx, port, value: int) -> None:
        """One beat on a stream port: valid held until a cycle with ready."""
        ctx.set(port.payload.as_value(), value)
        ctx.set(port.valid, 1)
        while True:
            ready = ctx.get(port.ready)
            await ctx.tick()
            if ready:
                break

    async def host_feeder(ctx):
        while True:
            if not pending:
                await ctx.tick()
                continue
            c = pending.popleft()
            await push(
                ctx,
                dut.host_cmd,
                c.op_id | len(c.data) << 32 | cmd_bits(c.exponent, c.proposal) << 64,
            )
            ctx.set(dut.host_cmd.valid, 0)
            cur["taken"] += 1
            words = np.asarray(c.data, np.float32).view(np.uint32).tolist()
            for k, w in enumerate(words):
                await push(ctx, dut.host_i, w | int(k == 0) << 32 | int(k == len(words) - 1) << 33)
            ctx.set(dut.host_i.valid, 0)

    async def monitor(ctx):
        frame = bytearray()
        words: list[int] = []
        while True:
            if cur.get("reset"):
                frame, words, cur["reset"] = bytearray(), [], False
            tx_ready = rng.random() >= backpressure
            o_ready = rng.random() >= backpressure
            ctx.set(dut.net_tx.ready, tx_ready)
            ctx.set(dut.host_o.ready, o_ready)
            if cur and tx_ready and ctx.get(dut.net_tx.valid):
                chunk, last = beat_bytes(ctx.get(dut.net_tx.payload.as_value()))
                frame += chunk
                if last:
                    cur["res"].frames.append((cur["now"], bytes(frame)))
                    frame = bytearray()
            if cur and o_ready and ctx.get(dut.host_o.valid):
                v = ctx.get(dut.host_o.payload.as_value())
                words.append(v & 0xFFFF_FFFF)
                if (v >> 32) & 1:
                    _host_record(cur, words)
                    words = []
            await ctx.tick()
            if cur:
                cur["cycles"] += 1

    sim = Simulator(top)
    sim.add_clock(8e-9)
    sim.add_testbench(main)
    sim.add_testbench(host_feeder, background=True)
    sim.add_testbench(monitor, background=True)
    bar = task = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        task = bar.add_task("NIC core in amaranth.sim", total=len(evs))
        with bar:
            sim.run()
    else:
        sim.run()
    if len(out) != len(evs):
        raise CoreSimError("the replay did not finish")
    return out


def _host_record(cur: dict, words: list[int]) -> None:
    """One op's host_o words -> its RESULT and STATS frames, at the current tick."""
    res, now = cur["res"], cur["now"]
    if len(words) < len(host_port.HEAD_FIELDS) + len(host_port.STATS_FIELDS) + cur["world"] + 2:
        raise CoreSimError(f"host_o record of {len(words)} words")
    op_id, x, stats = host_record(words, cur["world"])
    res.results[op_id] = x
    for f in host_port.chunk_frames(host_port.RESULT, op_id, x, stats_exp(stats)):
        res.frames.append((now, f))
    res.frames.append((now, host_port.stats_frame(stats)))
    cur["records"] += 1


def stats_exp(stats: list[int]) -> int:
    """The exponent word of a STATS record, signed."""
    return struct.unpack("<i", struct.pack("<I", stats[2]))[0]
