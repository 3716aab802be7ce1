"""Throughput, latency and area of the Quantizer at the default NicParams."""

from __future__ import annotations

import numpy as np

from optireduce.hw.quantizer import Quantizer
from optireduce.params import NicParams
from optireduce.sim.stream_sim import frame_payloads, run_stream


def figures() -> dict:
    """One op of b elements (no padding needed), no idle, no backpressure."""
    p = NicParams()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(p.b) * 1e-3).astype(np.float32).view(np.uint32)
    pl = frame_payloads(x, p.lanes)
    dut = Quantizer(p)

    async def setup(ctx):
        ctx.set(dut.exponent, -30)

    run = run_stream(dut, pl, len(pl), setup=setup)
    return run.element_figures(p.lanes)


def area_component() -> tuple[Quantizer, str]:
    return Quantizer(NicParams()), "quantizer"
