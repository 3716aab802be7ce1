"""Throughput, latency and area of SignFlip at the default NicParams.

Width p.w_wire (32 bits): the wider of its two uses (w_in after the quantizer on encode,
the divided inverse transform on decode).
"""

from __future__ import annotations

import numpy as np

from optireduce.hw.sign_flip import SignFlip
from optireduce.params import NicParams
from optireduce.sim.stream_sim import frame_payloads, run_stream


def figures() -> dict:
    """Two back-to-back ops of b elements each (the second op's key arrives with its first
    beat), no idle, no backpressure: the rate includes the op boundary."""
    p = NicParams()
    rng = np.random.default_rng(0)
    top = (1 << (p.w_wire - 1)) - 1
    v = rng.integers(-top, top + 1, 2 * p.b)
    pl = frame_payloads(v, p.lanes, p.b // p.lanes)
    dut = SignFlip(p, p.w_wire)

    async def setup(ctx):
        ctx.set(dut.seed, p.seed)
        ctx.set(dut.op_id, 1)

    run = run_stream(dut, pl, len(pl), setup=setup)
    return run.element_figures(p.lanes)


def area_component() -> tuple[SignFlip, str]:
    p = NicParams()
    return SignFlip(p, p.w_wire), "sign_flip"
