"""The rx / duplicate / late counts of a phase owner (the aggregator, the gather tracker).

Each is a 32-bit count, which the block's own tests compare with the model's, and a
one-cycle strobe in the cycle the count has its new value, which the NIC core's CSR bank
counts (hw/nic_core.py). The core reads only the strobes, so synthesis drops the counts.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib.wiring import Out

NAMES = ("rx", "duplicate", "late")


class EventCounts:
    """`count[name]` and `strobe[name]` for each of NAMES; `step(name)` is the statements
    (for m.d.sync) of one more, which the owner puts where the model counts it."""

    def __init__(self, m: Module) -> None:
        self.count = {n: Signal(32, name=f"cnt_{n}") for n in NAMES}
        self.strobe = {n: Signal(name=f"inc_{n}") for n in NAMES}
        m.d.sync += [s.eq(0) for s in self.strobe.values()]  # before any step: a pulse

    def step(self, name: str) -> list:
        return [self.count[name].eq(self.count[name] + 1), self.strobe[name].eq(1)]

    def drive(self, m: Module, owner) -> None:
        """The owner's `cnt_<name>` and `inc_<name>` ports."""
        for n in NAMES:
            m.d.comb += [getattr(owner, f"cnt_{n}").eq(self.count[n]),
                         getattr(owner, f"inc_{n}").eq(self.strobe[n])]  # fmt: skip


def ports() -> dict:
    """The ports EventCounts drives, for a component's signature."""
    return {**{f"cnt_{n}": Out(32) for n in NAMES}, **{f"inc_{n}": Out(1) for n in NAMES}}
