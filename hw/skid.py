"""A skid buffer: the upstream's `ready` from a register, no added latency.

A pipeline that moves on one enable (`en = o.ready | ~o.valid`) puts its consumer's
`ready`, and whatever logic makes it, in front of every register it has: inside the
whole NIC that chain crossed three blocks (docs/gateware.md, "Timing"). Between the two,
`Skid` gives the pipeline `i.ready = ~held`, a flip-flop. A beat offered while the
consumer stalls is held in one spare register and is offered first; until it leaves,
`i.ready` is low. While nothing is held the beat passes straight through
(`o` = `i`), so the latency is 0 and a continuous stream keeps one beat per cycle.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class Skid(wiring.Component):
    """`i` -> `o` in order, every beat once; `i.ready` is a register."""

    LATENCY = 0

    def __init__(self, payload_shape) -> None:
        super().__init__(
            {"i": In(stream.Signature(payload_shape)), "o": Out(stream.Signature(payload_shape))}
        )

    def elaborate(self, platform):
        m = Module()
        held = Signal()
        spare = Signal.like(self.i.payload, reset_less=True)
        m.d.comb += [
            self.i.ready.eq(~held),
            self.o.valid.eq(held | self.i.valid),
            self.o.payload.eq(Mux(held, spare, self.i.payload)),
        ]
        with m.If(self.o.ready):
            m.d.sync += held.eq(0)
        with m.Elif(~held & self.i.valid):  # the consumer stalls: keep the offered beat
            m.d.sync += [held.eq(1), spare.eq(self.i.payload)]
        return m
