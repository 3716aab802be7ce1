"""Figures of the streaming FWHT (hw/fwht.py) at the default NicParams: rate, latency, area."""

from __future__ import annotations

import numpy as np
from amaranth.lib import wiring

from optireduce.hw.fwht import Fwht
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, run_stream


def figures(p: NicParams | None = None, blocks: int = 2) -> dict:
    """Forward transform, `blocks` blocks back to back with no idle or backpressure."""
    p = p or NicParams()
    dut = Fwht(p, p.w_in)
    rng = np.random.default_rng(0)
    x = rng.integers(-p.q_max, p.q_max + 1, (blocks * p.b // p.lanes, p.lanes))
    pl = [element_payload(v, k == 0, k == len(x) - 1) for k, v in enumerate(x)]
    run = run_stream(dut, pl, len(pl))
    return {
        **run.element_figures(p.lanes),
        "latency_model": dut.LATENCY,
        "b": p.b,
        "lanes": p.lanes,
    }


def area_component() -> tuple[wiring.Component, str]:
    """The forward transform at the default sizes (B = 4096, 23-bit input, 35-bit output)."""
    p = NicParams()
    return Fwht(p, p.w_in), "fwht"
