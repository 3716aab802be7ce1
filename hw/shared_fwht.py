"""One FWHT for two streams: the encoder's forward transform and the decoder's inverse.

Model: `optireduce.host.model.fwht.fwht_blocks` on each stream alone (the transform is
its own inverse up to scale; the encoder and the decoder both run the unnormalized
WHT on integers).

  a_i (encode, width_a) ─┐                              ┌─► a_o (width_a + log2 B)
                         ├─ pick a block ─► Fwht(side) ─┤
  b_i (decode, width_b) ─┘                              └─► b_o (width_b + log2 B)

A block goes in whole: at a block's first beat the arbiter picks the stream that offers
one (both: the one that did not have the last block), and it keeps that stream until
the block's B/lanes beats are in. Each block carries its stream as the Fwht's `side`
tag, and its beats come out on that stream's port. Integers are exact at any width, so
the Fwht is built at max(width_a, width_b) bits: a's elements are sign-extended in and
its results, which fit width_a + log2 B bits, are cut back to that.

The two streams share one element a cycle, and one pipeline: while a's consumer stalls
a's beats at the output, b's blocks behind them wait too. NicCore reads the decode's
output (host_o) independently of the encode's input (host_i), so a stall there ends;
an encode block that has begun waits for the host's words, and the decode waits
behind it (docs/gateware.md, "One FWHT").
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.fwht import Fwht
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams


class SharedFwht(wiring.Component):
    """Ports: `a_i`/`a_o` and `b_i`/`b_o`, element streams of p.lanes elements (module
    docstring)."""

    def __init__(self, p: NicParams, width_a: int, width_b: int) -> None:
        self.p, self.width_a, self.width_b = p, width_a, width_b
        self.fwht = Fwht(p, max(width_a, width_b), side_bits=1)
        self.beats = p.b // p.lanes  # beats per block
        super().__init__(
            {
                "a_i": In(element_stream(width_a, p.lanes)),
                "a_o": Out(element_stream(width_a + p.log2_b, p.lanes)),
                "b_i": In(element_stream(width_b, p.lanes)),
                "b_o": Out(element_stream(width_b + p.log2_b, p.lanes)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.fwht = fw = self.fwht
        lanes = self.p.lanes
        self._arbiter(m, fw)

        # out: each block's beats to the stream its tag names
        to_b = fw.o.payload.side[0]
        for dst, mine in ((self.a_o, ~to_b), (self.b_o, to_b)):
            m.d.comb += [
                dst.valid.eq(fw.o.valid & mine),
                dst.payload.first.eq(fw.o.payload.first),
                dst.payload.last.eq(fw.o.payload.last),
                *(dst.payload.data[k].eq(fw.o.payload.data[k]) for k in range(lanes)),
            ]
        m.d.comb += fw.o.ready.eq(Mux(to_b, self.b_o.ready, self.a_o.ready))
        return m

    def _arbiter(self, m: Module, fw: Fwht) -> None:
        """In: a whole block from one stream, the streams taking turns when both offer."""
        a, b = self.a_i, self.b_i
        pos = Signal(range(self.beats))  # beats of the current block already in
        cur_b = Signal()  # the current block's stream (from its first beat)
        last_b = Signal()  # the stream of the last block begun
        pick_b = Mux(a.valid & b.valid, ~last_b, b.valid)
        sel_b = Signal()
        m.d.comb += sel_b.eq(Mux(pos == 0, pick_b, cur_b))
        m.d.comb += [
            fw.i.valid.eq(Mux(sel_b, b.valid, a.valid)),
            fw.i.payload.first.eq(Mux(sel_b, b.payload.first, a.payload.first)),
            fw.i.payload.last.eq(Mux(sel_b, b.payload.last, a.payload.last)),
            fw.i.payload.side.eq(sel_b),
            a.ready.eq(fw.i.ready & ~sel_b),
            b.ready.eq(fw.i.ready & sel_b),
        ]
        for k in range(self.p.lanes):  # sign-extended to the Fwht's width
            m.d.comb += fw.i.payload.data[k].eq(Mux(sel_b, b.payload.data[k], a.payload.data[k]))
        with m.If(fw.i.valid & fw.i.ready):
            m.d.sync += pos.eq(Mux(pos == self.beats - 1, 0, pos + 1))
            with m.If(pos == 0):
                m.d.sync += [cur_b.eq(sel_b), last_b.eq(sel_b)]
