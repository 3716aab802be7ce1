"""Throughput, latency and area of the Dequantizer at the default NicParams.

Width p.w_inv (44 bits): the widest input the decode path could hand it (the inverse
transform's width before the division brings it back to the wire width).
"""

from __future__ import annotations

import numpy as np

from optireduce.hw.dequantizer import Dequantizer
from optireduce.params import NicParams
from optireduce.sim.stream_sim import frame_payloads, run_stream


def figures() -> dict:
    """One op of b elements, no idle, no backpressure."""
    p = NicParams()
    rng = np.random.default_rng(0)
    top = 1 << (p.w_inv - 1)
    v = rng.integers(-top + 1, top, p.b)
    pl = frame_payloads(v, p.lanes)
    dut = Dequantizer(p, p.w_inv)

    async def setup(ctx):
        ctx.set(dut.exponent, -40)

    run = run_stream(dut, pl, len(pl), setup=setup)
    return run.element_figures(p.lanes)


def area_component() -> tuple[Dequantizer, str]:
    p = NicParams()
    return Dequantizer(p, p.w_inv), "dequantizer"
