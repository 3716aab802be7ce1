"""Formal proofs (SymbiYosys, z3) of the deadline rules the aggregator is built on.

For every state and input (free AnyConst values, ticks assumed not to overflow):
a phase is always over by its deadline, never ends after it, never ends in the
future, and never ends early without a reason. A deliberately broken variant must
fail, so the proof itself is shown able to fail.
"""

import pytest
from amaranth import Module, Mux, Signal
from amaranth.hdl import Assert, Assume
from amaranth.lib.wiring import Component, In

from optireduce.hw.deadline import TICK_BITS, PhaseTimer, Reason
from optireduce.sim.formal import run_sby

# Headroom so that anchor + T and friends never wrap in the proof.
SAFE = 1 << (TICK_BITS - 2)


def harness(broken: bool = False) -> Module:
    m = Module()
    m.submodules.t = t = PhaseTimer()
    ins = {name: Signal(len(getattr(t, name)), name=f"in_{name}") for name in (
        "active", "start", "anchor", "has_arrival", "last_arrival", "last_gone", "all_in",
        "in_or_gone", "all_flagged", "timeout", "idle", "floor", "now")}  # fmt: skip
    from amaranth.asserts import AnyConst

    for name, sig in ins.items():
        m.d.comb += sig.eq(AnyConst(len(sig)))
        m.d.comb += getattr(t, name).eq(sig)
    s = ins
    deadline = Signal(TICK_BITS + 1)
    m.d.comb += deadline.eq(Mux(s["anchor"] + s["timeout"] > s["floor"],
                                s["anchor"] + s["timeout"], s["floor"]))  # fmt: skip
    m.d.comb += [
        Assume(s["start"] < SAFE), Assume(s["anchor"] < SAFE), Assume(s["floor"] < SAFE),
        Assume(s["now"] < SAFE), Assume(s["last_arrival"] < SAFE), Assume(s["last_gone"] < SAFE),
        Assume(s["start"] <= s["anchor"]),
        Assume(s["start"] <= s["now"]),
        Assume(~s["has_arrival"] | (s["last_arrival"] <= s["now"])),
        Assume(s["last_gone"] <= s["now"]),
        Assume(s["floor"] <= s["now"]),
        Assume(s["idle"] >= 1),
        Assume(~s["all_in"] | s["in_or_gone"]),  # all in implies in-or-gone
        # The aggregator evaluates every timer before it takes an event, so no packet
        # and no "gone" notice was ever taken after the phase's deadline.
        Assume(~s["has_arrival"] | (s["last_arrival"] <= deadline)),
        Assume(s["last_gone"] <= deadline),
    ]  # fmt: skip
    due, end, reason = t.due, t.end_tick, t.reason
    claim = deadline - 1 if broken else deadline  # broken: one tick early, must be refuted
    # the timer's stage is registered: its outputs hold for the inputs LATENCY cycles on
    # (the inputs are held here; the owners settle after every change)
    warm = Signal(range(PhaseTimer.LATENCY + 1))
    with m.If(warm < PhaseTimer.LATENCY):
        m.d.sync += warm.eq(warm + 1)
    with m.If(warm == PhaseTimer.LATENCY):
        m.d.comb += [
            # always over by the deadline
            Assert(~(s["active"] & (s["now"] >= claim)) | due),
            # never after the deadline, never in the future
            Assert(~due | (end <= claim)),
            Assert(~due | (end <= s["now"])),
            # never over early without a rule that says so
            Assert(~due | (reason == Reason.DEADLINE) | s["in_or_gone"] | s["all_flagged"]),
            Assert(~due | s["active"]),
        ]
    return m


class _Top(Component):
    def __init__(self, broken: bool) -> None:
        self.broken = broken
        super().__init__({"dummy": In(1)})

    def elaborate(self, platform):
        return harness(self.broken)


def test_a_phase_always_ends_by_its_deadline():
    run_sby(_Top(False), "phase_timer_deadline", mode="prove", depth=PhaseTimer.LATENCY + 2)


def test_the_proof_can_fail():
    with pytest.raises(AssertionError, match="FAIL"):
        run_sby(_Top(True), "phase_timer_broken", mode="bmc", depth=PhaseTimer.LATENCY + 1)
