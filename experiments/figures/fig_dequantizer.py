"""Throughput, latency and area of the Dequantizer at the default NicParams.

Width p.w_inv (44 bits): the widest input the decode path could hand it (the inverse
transform's width before the division brings it back to the wire width).
"""

from __future__ import annotations

import numpy as np

from optireduce.hw.dequantizer import Dequantizer
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, run_stream


def figures() -> dict:
    """One op of b elements, no idle, no backpressure."""
    p = NicParams()
    rng = np.random.default_rng(0)
    top = 1 << (p.w_inv - 1)
    v = rng.integers(-top + 1, top, p.b)
    beats = p.b // p.lanes
    pl = [
        element_payload(v[j * p.lanes : (j + 1) * p.lanes], j == 0, j == beats - 1)
        for j in range(beats)
    ]
    dut = Dequantizer(p, p.w_inv)

    async def setup(ctx):
        ctx.set(dut.exponent, -40)

    run = run_stream(dut, pl, beats, setup=setup)
    return {
        "cycles_per_element": run.cycles_per_beat() / p.lanes,
        "latency_cycles": run.latency,
    }


def area_component() -> tuple[Dequantizer, str]:
    p = NicParams()
    return Dequantizer(p, p.w_inv), "dequantizer"
