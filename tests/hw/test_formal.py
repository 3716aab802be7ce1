"""Formal proofs (SymbiYosys, z3) of the deadline rules the aggregator is built on.

For every state and input (free AnyConst values) within the tick contract of
hw/deadline.py ("Ticks"): a phase is always over by its deadline, never ends after it,
never ends in the future, and never ends early without a reason. The clock is anywhere
(`origin` is free), so the proof covers every wrap of the 32-bit ticks: each tick is
origin + its distance from it, and the harness computes the model's rules on the
distances, with integers that do not wrap. A deliberately broken variant must fail, so
the proof itself is shown able to fail.
"""

import pytest
from amaranth import Module, Mux, Signal
from amaranth.hdl import Assert, Assume
from amaranth.lib.wiring import Component, In

from optireduce.hw.deadline import TICK_BITS, PhaseTimer, Reason
from optireduce.params import T_B_BITS
from optireduce.sim.formal import run_sby

# Distances from the origin: `now` is 2^30 after it, every tick of the phase and the
# floor within 2^30 before `now`; T < 2^T_B_BITS; so none is 2^31 or more.
HALF = 1 << (TICK_BITS - 2)


def harness(broken: bool = False) -> Module:
    from amaranth.asserts import AnyConst

    m = Module()
    m.submodules.t = t = PhaseTimer()
    origin = AnyConst(TICK_BITS)
    d = {name: Signal(TICK_BITS, name=f"d_{name}") for name in (
        "start", "anchor", "last_arrival", "last_gone", "floor")}  # fmt: skip
    flags = {name: Signal(name=f"in_{name}") for name in (
        "active", "has_arrival", "all_in", "in_or_gone", "all_flagged", "floor_live")}  # fmt: skip
    timeout, idle = Signal(32, name="in_timeout"), Signal(33, name="in_idle")
    now = HALF * 2  # the distance of `now`
    for sig in (*d.values(), *flags.values(), timeout, idle):
        m.d.comb += sig.eq(AnyConst(len(sig)))
    for name, dist in d.items():
        m.d.comb += getattr(t, name).eq(origin + dist)
    m.d.comb += [getattr(t, name).eq(flag) for name, flag in flags.items()]
    m.d.comb += [t.timeout.eq(timeout), t.idle.eq(idle), t.now.eq(origin + now)]
    deadline = Signal(TICK_BITS + 1)
    floor = Mux(flags["floor_live"], d["floor"], 0)  # a retired floor is below every tick
    m.d.comb += deadline.eq(Mux(d["anchor"] + timeout > floor, d["anchor"] + timeout, floor))
    m.d.comb += [
        # the contract (hw/deadline.py, "Ticks"): a phase began less than 2^30 ticks ago,
        # its arrivals and "gone" notices are in [start, now] (PhaseContexts.begin), its
        # deadline is anchored at or after its start; T < 2^T_B_BITS, the idle gap <= T;
        # a live floor is at most 2^30 old, and it is in the past
        Assume(d["start"] >= HALF), Assume(d["start"] <= now),
        Assume(d["anchor"] >= d["start"]), Assume(d["anchor"] < now + HALF),
        Assume(d["last_arrival"] >= d["start"]), Assume(d["last_arrival"] <= now),
        Assume(d["last_gone"] >= d["start"]), Assume(d["last_gone"] <= now),
        Assume(d["floor"] >= HALF), Assume(d["floor"] <= now),
        Assume(timeout < (1 << T_B_BITS)),
        Assume(idle >= 1), Assume(idle <= timeout),
        Assume(~flags["all_in"] | flags["in_or_gone"]),  # all in implies in-or-gone
        # The aggregator evaluates every timer before it takes an event, so no packet
        # and no "gone" notice was ever taken after the phase's deadline.
        Assume(~flags["has_arrival"] | (d["last_arrival"] <= deadline)),
        Assume(d["last_gone"] <= deadline),
    ]  # fmt: skip
    due, reason = t.due, t.reason
    end = Signal(TICK_BITS + 1)  # the end tick's distance from the origin
    m.d.comb += end.eq((t.end_tick - origin)[:TICK_BITS])
    claim = deadline - 1 if broken else deadline  # broken: one tick early, must be refuted
    # the timer's stage is registered: its outputs hold for the inputs LATENCY cycles on
    # (the inputs are held here; the owners settle after every change)
    warm = Signal(range(PhaseTimer.LATENCY + 1))
    with m.If(warm < PhaseTimer.LATENCY):
        m.d.sync += warm.eq(warm + 1)
    with m.If(warm == PhaseTimer.LATENCY):
        m.d.comb += [
            # always over by the deadline
            Assert(~(flags["active"] & (now >= claim)) | due),
            # never after the deadline, never in the future
            Assert(~due | (end <= claim)),
            Assert(~due | (end <= now)),
            # never over early without a rule that says so
            Assert(~due | (reason == Reason.DEADLINE) | flags["in_or_gone"]
                   | flags["all_flagged"]),
            Assert(~due | flags["active"]),
        ]  # fmt: skip
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
