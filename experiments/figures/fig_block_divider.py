"""Figures of BlockDivider: rate and latency (run_stream, no backpressure), ECP5 area."""

from __future__ import annotations

import numpy as np
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.block_divider import BlockDivider
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, run_stream


class _FullBlocks(wiring.Component):
    """The divider with its k stream always valid (every block full): run_stream drives i/o."""

    def __init__(self, p: NicParams) -> None:
        self.div = BlockDivider(p)
        super().__init__(
            {
                "i": In(element_stream(self.div.width_in, p.lanes)),
                "o": Out(element_stream(self.div.width_out, p.lanes)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.div = d = self.div
        wiring.connect(m, wiring.flipped(self.i), d.i)
        wiring.connect(m, d.o, wiring.flipped(self.o))
        m.d.comb += [d.k.valid.eq(1), d.k.payload.eq(self.div.p.packets_per_block)]
        return m


def figures(p: NicParams | None = None, blocks: int = 2) -> dict:
    p = p or NicParams()
    rng = np.random.default_rng(0)
    nb = p.b // p.lanes
    t = rng.integers(-(1 << 40), 1 << 40, (blocks * nb, p.lanes))
    beats = [element_payload(v, j % nb == 0, j % nb == nb - 1) for j, v in enumerate(t)]
    run = run_stream(_FullBlocks(p), beats, len(beats))
    return run.element_figures(p.lanes)


def area_component() -> tuple[wiring.Component, str]:
    return BlockDivider(NicParams()), "block_divider"


if __name__ == "__main__":
    from optireduce.experiments.area import ecp5_area

    print(figures())
    print(ecp5_area(*area_component()))
