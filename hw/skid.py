"""A skid buffer: the upstream's `ready` from a register, no added latency.

A pipeline that moves on one enable (`en = o.ready | ~o.valid`) puts its consumer's
`ready`, and whatever logic makes it, in front of every register it has: inside the
whole NIC that chain crossed three blocks (docs/gateware.md, "Timing"). Between the two,
`Skid` gives the pipeline `i.ready = ~held`, a flip-flop. A beat offered while the
consumer stalls is held in one spare register and is offered first; until it leaves,
`i.ready` is low. While nothing is held the beat passes straight through
(`o` = `i`), so the latency is 0 and a continuous stream keeps one beat per cycle.

`Skid(shape, registered=True)` adds an output register after it (LATENCY 1): then
neither `o.valid` and `o.payload` nor `i.ready` has logic in front of it, which cuts a
chain between blocks in both directions (the board's shell, hw/nic_shell.py).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class Skid(wiring.Component):
    """`i` -> `o` in order, every beat once; `i.ready` is a register (and with
    `registered`, `o.valid` and `o.payload` too)."""

    def __init__(self, payload_shape, *, registered: bool = False) -> None:
        self.registered = registered
        self.LATENCY = int(registered)
        super().__init__(
            {"i": In(stream.Signature(payload_shape)), "o": Out(stream.Signature(payload_shape))}
        )

    def elaborate(self, platform):
        m = Module()
        held = Signal()
        spare = Signal.like(self.i.payload, reset_less=True)
        valid, payload, ready = Signal(), Signal.like(self.i.payload), Signal()
        m.d.comb += [
            self.i.ready.eq(~held),
            valid.eq(held | self.i.valid),
            payload.eq(Mux(held, spare, self.i.payload)),
        ]
        with m.If(ready):
            m.d.sync += held.eq(0)
        with m.Elif(~held & self.i.valid):  # the consumer stalls: keep the offered beat
            m.d.sync += held.eq(1)
        with m.If(~held):  # the spare copies the input while empty: its enable is `held`
            m.d.sync += spare.eq(self.i.payload)  # alone, not the upstream's valid logic

        if not self.registered:
            m.d.comb += [self.o.valid.eq(valid), self.o.payload.eq(payload), ready.eq(self.o.ready)]
            return m
        advance = ~self.o.valid | self.o.ready
        m.d.comb += ready.eq(advance)
        with m.If(advance):
            m.d.sync += [self.o.valid.eq(valid), self.o.payload.eq(payload)]
        return m
