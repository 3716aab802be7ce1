"""One FWHT for two streams: the encoder's forward transform and the decoder's inverse.

Model: `optireduce.host.model.fwht.fwht_blocks` on each stream alone (the transform is
its own inverse up to scale; the encoder and the decoder both run the unnormalized
WHT on integers).

  a_i (encode) ─► a_buf (a block) ─┐                              ┌─► a_o
                                   ├─ pick a block ─► Fwht(side) ─┤
  b_i (decode) ────────────────────┘                              └─► b_buf (2 blocks) ─► b_o

A block goes in whole: at a block's first beat the arbiter picks a stream that can start
one (both: the one that did not have the last block), and it keeps that stream until the
block's B/lanes beats are in. Each block carries its stream as the Fwht's `side` tag,
and its beats come out on that stream's side. Integers are exact at any width, so the
Fwht is built at max(width_a, width_b) bits: a's elements are sign-extended in and its
results, which fit width_a + log2 B bits, are cut back to that.

The Fwht never waits on what is outside it for the other stream's sake:
- a's block starts only once all of it is in `a_buf`, so a host word that comes late
  (or never: the host adapter pads a broken op at the next START) holds only a;
- b's block starts only once `b_buf` has room for all of it (`room` counts the entries
  not yet promised), so b's consumer (host_o, which a board's host adapter reads at its
  link's pace: not while its ring of results is full) never stops the Fwht and a's
  blocks with it.
a's consumer (the scatter packetizer, toward the network and the aggregator) can stop
it; nothing there waits on the decode. The two streams share one element a cycle
(docs/gateware.md, "One FWHT, one t_C estimator").
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.hw.fwht import Fwht
from optireduce.hw.streams import element_layout, element_stream
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
        p, beats = self.p, self.beats
        # a: a block goes in once all of it is here, so that a host word that is late
        # (or lost: its op is padded at the next START) never holds the Fwht
        lay_a = element_layout(self.width_a, p.lanes)
        m.submodules.a_buf = a_buf = SyncFIFOBuffered(width=lay_a.size, depth=beats + 1)
        m.d.comb += [
            a_buf.w_data.eq(self.a_i.payload.as_value()),
            a_buf.w_en.eq(self.a_i.valid),
            self.a_i.ready.eq(a_buf.w_rdy),
        ]
        # b: a block goes in once the buffer after the Fwht has room for all of it, so
        # that b's consumer (host_o) never stops the Fwht, nor a's blocks with it
        lay_b = element_layout(self.width_b + p.log2_b, p.lanes)
        m.submodules.b_buf = b_buf = SyncFIFOBuffered(width=lay_b.size, depth=2 * beats)
        room = Signal(range(2 * beats + 1), init=2 * beats)  # b_buf's entries not promised
        b_pop = Signal()
        m.d.comb += [
            self.b_o.payload.eq(b_buf.r_data),
            self.b_o.valid.eq(b_buf.r_rdy),
            b_buf.r_en.eq(self.b_o.ready),
            b_pop.eq(b_buf.r_rdy & self.b_o.ready),
        ]
        b_reserve = self._arbiter(m, fw, data.View(lay_a, a_buf.r_data), a_buf, room)
        m.d.sync += room.eq(room - Mux(b_reserve, beats, 0) + b_pop)

        # out: each block's beats to the stream its tag names
        to_b = fw.o.payload.side[0]
        b_in = data.View(lay_b, b_buf.w_data)
        m.d.comb += [
            self.a_o.valid.eq(fw.o.valid & ~to_b),
            b_buf.w_en.eq(fw.o.valid & to_b),
            fw.o.ready.eq(Mux(to_b, b_buf.w_rdy, self.a_o.ready)),
        ]
        for dst in (self.a_o.payload, b_in):
            m.d.comb += [
                dst.first.eq(fw.o.payload.first),
                dst.last.eq(fw.o.payload.last),
                *(dst.data[k].eq(fw.o.payload.data[k]) for k in range(p.lanes)),
            ]
        return m

    def _arbiter(self, m: Module, fw: Fwht, a_pl, a_buf, room) -> Signal:
        """In: a whole block from one stream, the streams taking turns when both can
        start one. Returns the strobe that promises b_buf a block's room."""
        b, beats = self.b_i, self.beats
        pos = Signal(range(beats))  # beats of the current block already in
        cur_b = Signal()  # the current block's stream (from its first beat)
        last_b = Signal()  # the stream of the last block begun
        a_can = a_buf.level >= beats  # a whole block is buffered
        b_can = b.valid & (room >= beats)
        start = pos == 0
        pick_b = Mux(a_can & b_can, ~last_b, b_can)
        sel_b = Signal()
        m.d.comb += sel_b.eq(Mux(start, pick_b, cur_b))
        offer = Mux(start, a_can | b_can, Mux(cur_b, b.valid, a_buf.r_rdy))
        go = Signal()
        m.d.comb += [
            fw.i.valid.eq(offer),
            fw.i.payload.first.eq(Mux(sel_b, b.payload.first, a_pl.first)),
            fw.i.payload.last.eq(Mux(sel_b, b.payload.last, a_pl.last)),
            fw.i.payload.side.eq(sel_b),
            go.eq(offer & fw.i.ready),
            a_buf.r_en.eq(go & ~sel_b),
            b.ready.eq(fw.i.ready & sel_b & (~start | b_can)),
        ]
        for k in range(self.p.lanes):  # sign-extended to the Fwht's width
            m.d.comb += fw.i.payload.data[k].eq(Mux(sel_b, b.payload.data[k], a_pl.data[k]))
        with m.If(go):
            m.d.sync += pos.eq(Mux(pos == beats - 1, 0, pos + 1))
            with m.If(start):
                m.d.sync += [cur_b.eq(sel_b), last_b.eq(sel_b)]
        return go & start & sel_b
