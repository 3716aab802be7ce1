"""A toy block (negate, one register stage) that exercises the shared harnesses."""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.streams import element_stream


class Negate(wiring.Component):
    LATENCY = 1

    def __init__(self, width: int = 20, lanes: int = 2) -> None:
        self.width, self.lanes = width, lanes
        super().__init__(
            {"i": In(element_stream(width, lanes)), "o": Out(element_stream(width, lanes))}
        )

    def elaborate(self, platform):
        m = Module()
        with m.If(self.o.ready | ~self.o.valid):
            m.d.sync += [
                self.o.valid.eq(self.i.valid),
                self.o.payload.first.eq(self.i.payload.first),
                self.o.payload.last.eq(self.i.payload.last),
            ]
            for k in range(self.lanes):
                m.d.sync += self.o.payload.data[k].eq(-self.i.payload.data[k])
        m.d.comb += self.i.ready.eq(self.o.ready | ~self.o.valid)
        return m
