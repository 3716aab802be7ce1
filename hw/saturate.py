"""Symmetric saturation to a narrower signed width, counting each clamp.

Model: `optireduce.host.model.codec.saturate(v, limit)` with limit = 2^(limit_bits-1) - 1: values
beyond +-limit become +-limit (never wrap), and the returned count is the number of clamped
elements. The range is symmetric so that a later negation (the random signs) cannot wrap.

`count` is the model's counter for the current op: it restarts on each beat that carries
`first` and counts every clamped element up to and including the beat in the output register,
so when the op's `last` beat is in `o` it holds the op's total (until the next `first` passes).
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.codec import saturate
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams


class Saturate(wiring.Component):
    """Clamp to +-(2^(limit_bits-1) - 1); one register stage."""

    MODEL = saturate
    LATENCY = 1

    def __init__(self, p: NicParams, width_in: int, limit_bits: int | None = None) -> None:
        limit_bits = p.w_wire if limit_bits is None else limit_bits
        if not 2 <= limit_bits <= width_in:
            raise ValueError(f"limit_bits={limit_bits} must be in 2..width_in={width_in}")
        self.p, self.width_in, self.limit_bits, self.lanes = p, width_in, limit_bits, p.lanes
        self.limit = (1 << (limit_bits - 1)) - 1
        super().__init__(
            {
                "i": In(element_stream(width_in, p.lanes)),
                "o": Out(element_stream(limit_bits, p.lanes)),
                "count": Out(p.op_count_bits),  # an op has at most C
            }
        )

    def elaborate(self, platform):
        m = Module()
        lim = self.limit
        en = Signal()
        m.d.comb += [en.eq(self.o.ready | ~self.o.valid), self.i.ready.eq(en)]

        clamped = []
        for lane in range(self.lanes):
            x = self.i.payload.data[lane]
            hi, lo = Signal(name=f"hi{lane}"), Signal(name=f"lo{lane}")
            m.d.comb += [hi.eq(x > lim), lo.eq(x < -lim)]
            clamped += [hi, lo]
            with m.If(en):
                with m.If(hi):
                    m.d.sync += self.o.payload.data[lane].eq(lim)
                with m.Elif(lo):
                    m.d.sync += self.o.payload.data[lane].eq(-lim)
                with m.Else():
                    m.d.sync += self.o.payload.data[lane].eq(x)
        n_clamped = sum(clamped)  # hi and lo never both: one per clamped element

        with m.If(en):
            m.d.sync += [
                self.o.valid.eq(self.i.valid),
                self.o.payload.first.eq(self.i.payload.first),
                self.o.payload.last.eq(self.i.payload.last),
            ]
        with m.If(en & self.i.valid):
            with m.If(self.i.payload.first):
                m.d.sync += self.count.eq(n_clamped)
            with m.Else():
                m.d.sync += self.count.eq(self.count + n_clamped)
        return m
