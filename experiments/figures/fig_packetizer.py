"""Packetizer figures: rate and latency at the default NicParams, and the block for ecp5_area."""

from __future__ import annotations

import numpy as np
from amaranth.lib import wiring

from optireduce import ubt
from optireduce.hw.packetizer import Packetizer
from optireduce.params import NicParams
from optireduce.sim.stream_sim import StreamRun, run_stream


def _run(p: NicParams, msg_type: int, world: int, rank: int, n_elements: int) -> StreamRun:
    """One op through the packetizer with no backpressure on `o` or `own`."""
    dut = Packetizer(p)
    rng = np.random.default_rng(0)
    vals = rng.integers(-(1 << 31), 1 << 31, n_elements)
    L = p.lanes
    payloads = [
        {"data": [int(v) for v in vals[k : k + L]], "first": int(k == 0), "last": 0}
        for k in range(0, n_elements, L)
    ]
    n_pk = p.packets_for(p.c)
    if msg_type == ubt.MSG_SCATTER:
        frames = sum(1 for i in range(n_pk) if i % world != rank)
    else:
        frames = (n_elements // p.p) * (world - 1)
    ports = {
        "msg_type": msg_type, "rank": rank, "world": world, "job_id": p.job_id, "op_id": 7,
        "exponent": -20, "op_len": p.c, "t_c_us": 1000, "contributors": 1,
    }  # fmt: skip

    async def setup(ctx):
        for name, v in ports.items():
            ctx.set(getattr(dut, name), v)
        ctx.set(dut.own.ready, 1)

    return run_stream(dut, payloads, frames * dut.frame_beats, setup=setup, read=lambda pl: 0)


def figures() -> dict:
    """cycles_per_element: scatter of a whole chunk C (world 4), input side, counting the
    op's one set-up cycle; latency_cycles: first beat of a packet to the first beat of its
    frame. gather_cycles_per_element_world{2,4}: gather input rate (each slot is sent N-1
    times, so above 2 ranks the frames, not the input, set the pace)."""
    p = NicParams()
    beats = p.c // p.lanes
    sc = _run(p, ubt.MSG_SCATTER, 4, 1, p.c)
    out = {
        "cycles_per_element": (sc.in_cycles[-1] + 1) / (beats * p.lanes),
        "latency_cycles": sc.latency,
        "frame_beats": -(-(74 + 4 * p.p) // (8 * p.lanes)),
    }
    for world in (2, 4):
        slots = p.packets_for(p.c) // world  # rank 0's slots
        g = _run(p, ubt.MSG_GATHER, world, 0, slots * p.p)
        out[f"gather_cycles_per_element_world{world}"] = (g.in_cycles[-1] + 1) / (slots * p.p)
    return out


def area_component() -> tuple[wiring.Component, str]:
    return Packetizer(NicParams()), "packetizer"
