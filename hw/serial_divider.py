"""Restoring division, one quotient bit a cycle: num divmod den for small counts.

The phase owners divide packet counts by the world size when an op claims a context
(hw/aggregator.py: the slots this rank owns, hw/gather_tracker.py: divmod(n_packets,
world)) and the aggregator a packet index by it (its slot row). The operands are a few
bits wide and an op claims its context rarely, so a bit a cycle is enough and keeps
the divider a few LUTs and a short path (125 MHz).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class SerialDivider(wiring.Component):
    """`go` (one cycle) loads `num`; `busy` falls LATENCY cycles later, and from then on
    `q` = num // den and `rem` = num % den until the next `go` (`den` held throughout,
    den >= 1). A `go` while busy restarts the division."""

    def __init__(self, qbits: int, den_shape) -> None:
        self.qbits = qbits
        self.LATENCY = qbits
        super().__init__(
            {
                "go": In(1),
                "num": In(qbits),
                "den": In(den_shape),
                "q": Out(qbits),
                "rem": Out(qbits + 1),
                "busy": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        qbits = self.qbits
        num = Signal(qbits)  # the dividend's bits not yet brought down, top first
        k = Signal(range(qbits + 1))
        with m.If(self.go):
            m.d.sync += [num.eq(self.num), self.rem.eq(0), k.eq(qbits), self.busy.eq(1)]
        with m.Elif(self.busy):
            rem2 = Cat(num[qbits - 1], self.rem[:qbits])
            ge = rem2 >= self.den
            m.d.sync += [
                self.rem.eq(Mux(ge, rem2 - self.den, rem2)),
                self.q.eq(Cat(ge, self.q[: qbits - 1])),
                num.eq(num << 1),
                k.eq(k - 1),
            ]
            with m.If(k == 1):
                m.d.sync += self.busy.eq(0)
        return m
