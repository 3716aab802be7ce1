"""Figures of GatherBuffer: place and drain rate, drain latency (run_stream, no backpressure),
ECP5 area."""

from __future__ import annotations

import numpy as np
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.gather_buffer import GatherBuffer, GatherOp
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, run_stream


class _FillThenDrain(wiring.Component):
    """Packets 0, 1, ... of slot 0 on i; one cycle after the last beat of the last packet it
    issues DRAIN (n = c) and o is the drained stream (k always taken)."""

    def __init__(self, p: NicParams) -> None:
        self.gb = GatherBuffer(p)
        super().__init__(
            {
                "i": In(element_stream(p.w_wire, p.lanes)),
                "o": Out(element_stream(p.w_wire, p.lanes)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.gb = g = self.gb
        p = g.p
        wiring.connect(m, wiring.flipped(self.i), g.i)
        wiring.connect(m, g.o, wiring.flipped(self.o))
        pkt = Signal(range(g.n_pkts + 1))
        fire = Signal()
        m.d.comb += [g.pkt_index.eq(pkt), g.contributors.eq(1), g.k.ready.eq(1)]
        with m.If(g.cmd.ready):
            m.d.sync += fire.eq(0)
        with m.If(self.i.valid & self.i.ready & self.i.payload.last):
            m.d.sync += pkt.eq(pkt + 1)
            with m.If(pkt == g.n_pkts - 1):
                m.d.sync += fire.eq(1)
        m.d.comb += [g.cmd.valid.eq(fire), g.cmd.payload.op.eq(GatherOp.DRAIN)]
        m.d.comb += g.cmd.payload.n.eq(p.c)
        return m


def figures(p: NicParams | None = None) -> dict:
    p = p or NicParams()
    rng = np.random.default_rng(0)
    bpp = p.p // p.lanes
    vals = rng.integers(-(1 << 31), 1 << 31, (p.c // p.lanes, p.lanes))
    beats = [element_payload(v, j % bpp == 0, j % bpp == bpp - 1) for j, v in enumerate(vals)]
    run = run_stream(_FillThenDrain(p), beats, len(beats))
    assert np.array_equal([o[0] for o in run.outputs], vals)
    place = (run.in_cycles[-1] - run.in_cycles[0]) / max(1, len(beats) - 1)
    return {
        "cycles_per_element": run.cycles_per_beat() / p.lanes,  # drain
        "place_cycles_per_element": place / p.lanes,
        # DRAIN accepted -> first beat (the wrapper raises cmd one cycle after the last beat)
        "latency_cycles": run.out_cycles[0] - run.in_cycles[-1] - 1,
    }


def area_component() -> tuple[wiring.Component, str]:
    return GatherBuffer(NicParams()), "gather_buffer"


if __name__ == "__main__":
    from optireduce.experiments.area import ecp5_area

    print(figures())
    print(ecp5_area(*area_component()))
