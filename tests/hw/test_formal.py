"""Formal proofs (SymbiYosys, z3) of the deadline rules the aggregator is built on.

For every state and input (free AnyConst values) within the tick contract of
hw/deadline.py ("Ticks"): a phase is always over by its deadline, never ends after it,
never ends in the future, and never ends early without a reason. The clock is anywhere
(`origin` is free), so the proof covers every wrap of the ticks (32 bits, and the
25F's 24: NicParams.tick_bits): each tick is
origin + its distance from it, and the harness computes the model's rules on the
distances, with integers that do not wrap. A deliberately broken variant must fail, so
the proof itself is shown able to fail.
"""

import pytest
from amaranth import Module, Mux, Signal
from amaranth.hdl import Assert, Assume
from amaranth.lib.wiring import Component, In

from optireduce.hw.board_colorlight import PARAMS as SLIM
from optireduce.hw.deadline import PhaseTimer, Reason
from optireduce.params import NicParams
from optireduce.sim.formal import run_sby

# The tick widths proven: the default's and the 25F's.
WIDTHS = sorted({NicParams().tick_bits, SLIM.tick_bits})


def harness(tick_bits: int, broken: bool = False) -> Module:
    """Distances from the origin: `now` is 2^(w-2) after it, every tick of the phase and
    the floor within 2^(w-2) before `now`; T < 2^(w-4) (NicParams.t_b_bits); so none is
    2^(w-1) or more."""
    from amaranth.asserts import AnyConst

    tb, half = tick_bits, 1 << (tick_bits - 2)
    m = Module()
    m.submodules.t = t = PhaseTimer(tb)
    origin = AnyConst(tb)
    d = {name: Signal(tb, name=f"d_{name}") for name in (
        "start", "anchor", "last_arrival", "last_gone", "floor")}  # fmt: skip
    flags = {name: Signal(name=f"in_{name}") for name in (
        "active", "has_arrival", "all_in", "in_or_gone", "all_flagged", "floor_live")}  # fmt: skip
    timeout, idle = Signal(tb - 4, name="in_timeout"), Signal(tb - 3, name="in_idle")
    now = half * 2  # the distance of `now`
    for sig in (*d.values(), *flags.values(), timeout, idle):
        m.d.comb += sig.eq(AnyConst(len(sig)))
    for name, dist in d.items():
        m.d.comb += getattr(t, name).eq(origin + dist)
    m.d.comb += [getattr(t, name).eq(flag) for name, flag in flags.items()]
    m.d.comb += [t.timeout.eq(timeout), t.idle.eq(idle), t.now.eq(origin + now)]
    deadline = Signal(tb + 1)
    floor = Mux(flags["floor_live"], d["floor"], 0)  # a retired floor is below every tick
    m.d.comb += deadline.eq(Mux(d["anchor"] + timeout > floor, d["anchor"] + timeout, floor))
    m.d.comb += [
        # the contract (hw/deadline.py, "Ticks"): a phase began less than 2^(w-2) ticks
        # ago, its arrivals and "gone" notices are in [start, now] (PhaseContexts.begin),
        # its deadline is anchored at or after its start; T < 2^(w-4), the idle gap <= T;
        # a live floor is at most 2^(w-2) old, and it is in the past
        Assume(d["start"] >= half), Assume(d["start"] <= now),
        Assume(d["anchor"] >= d["start"]), Assume(d["anchor"] < now + half),
        Assume(d["last_arrival"] >= d["start"]), Assume(d["last_arrival"] <= now),
        Assume(d["last_gone"] >= d["start"]), Assume(d["last_gone"] <= now),
        Assume(d["floor"] >= half), Assume(d["floor"] <= now),
        Assume(timeout < (1 << (tb - 4))),
        Assume(idle >= 1), Assume(idle <= timeout),
        Assume(~flags["all_in"] | flags["in_or_gone"]),  # all in implies in-or-gone
        # The aggregator evaluates every timer before it takes an event, so no packet
        # and no "gone" notice was ever taken after the phase's deadline.
        Assume(~flags["has_arrival"] | (d["last_arrival"] <= deadline)),
        Assume(d["last_gone"] <= deadline),
    ]  # fmt: skip
    due, reason = t.due, t.reason
    end = Signal(tb + 1)  # the end tick's distance from the origin
    m.d.comb += end.eq((t.end_tick - origin)[:tb])
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
    def __init__(self, tick_bits: int, broken: bool) -> None:
        self.tick_bits, self.broken = tick_bits, broken
        super().__init__({"dummy": In(1)})

    def elaborate(self, platform):
        return harness(self.tick_bits, self.broken)


@pytest.mark.parametrize("tick_bits", WIDTHS)
def test_a_phase_always_ends_by_its_deadline(tick_bits):
    run_sby(_Top(tick_bits, False), f"phase_timer_deadline_{tick_bits}", mode="prove",
            depth=PhaseTimer.LATENCY + 2)  # fmt: skip


@pytest.mark.parametrize("tick_bits", WIDTHS)
def test_the_proof_can_fail(tick_bits):
    with pytest.raises(AssertionError, match="FAIL"):
        run_sby(_Top(tick_bits, True), f"phase_timer_broken_{tick_bits}", mode="bmc",
                depth=PhaseTimer.LATENCY + 1)  # fmt: skip
