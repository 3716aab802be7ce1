"""Figures of the saturation block (hw/saturate.py) at the default NicParams: w_fwd -> w_wire."""

from __future__ import annotations

import numpy as np
from amaranth.lib import wiring

from optireduce.hw.saturate import Saturate
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, run_stream


def figures(p: NicParams | None = None, beats: int = 256) -> dict:
    p = p or NicParams()
    dut = Saturate(p, p.w_fwd)
    lim = 1 << (p.w_fwd - 1)
    x = np.random.default_rng(0).integers(-lim, lim, (beats, p.lanes))
    pl = [element_payload(v, k == 0, k == beats - 1) for k, v in enumerate(x)]
    run = run_stream(dut, pl, len(pl))
    return {
        **run.element_figures(p.lanes),
        "lanes": p.lanes,
    }


def area_component() -> tuple[wiring.Component, str]:
    p = NicParams()
    return Saturate(p, p.w_fwd), "saturate"
