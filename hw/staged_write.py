"""A memory write port driven from registers (125 MHz).

An FSM's write decision, its address mux and its data each cost logic levels in front of
the memory's write port; registered, they get a cycle of their own. A write asked for in
one cycle is made in the next, so the owner must not read an address in the cycle after
asking to write it (the blocks that use this read their memories states later).
"""

from __future__ import annotations

from amaranth import Module, Signal


class StagedWrite:
    """The port's `addr`, `data` (its shape: a struct keeps its fields) and `en` as
    registers: assign them with `m.d.sync` in an FSM state, and the port writes in the
    next cycle. `en` falls back to 0 in every cycle it is not set.
    """

    def __init__(self, m: Module, port, name: str) -> None:
        self.addr = Signal.like(port.addr, name=f"{name}_w_addr")
        self.data = Signal(port.data.shape(), name=f"{name}_w_data")
        self.en = Signal(name=f"{name}_w_en")
        m.d.sync += self.en.eq(0)  # placed before the FSM: its writes take priority
        m.d.comb += [port.addr.eq(self.addr), port.data.eq(self.data), port.en.eq(self.en)]
