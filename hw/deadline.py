"""The phase-1 end rules of one op context, as comparators on tick counters.

Models `host/deadline.py: PhaseTracker.due(now, timeout, floor)`. The aggregator
keeps, per context, what the tracker keeps (start, anchor, last arrival, last
"gone" tick) and, instead of per-sender vectors, three incrementally maintained
facts: every expected packet is in, every sender still owing is gone, every
expected sender's LAST is in. This block turns them and the live T into
(due, end tick, reason), purely combinationally; the aggregator registers it.

  complete   all in                       -> max(start, last arrival)
  early      all in or gone               -> max(start, last arrival, last gone)
  early      LAST from all, idle gap      -> max(max(start, last arrival) + idle, floor)
             (only if before the deadline)
  deadline   anchor + T                   -> max(anchor + T, floor)

`idle` = max(1, alpha_q8 * T >> 8) is computed once for all contexts (`idle_gap`).
Ticks are TICK_BITS wide: 2^48 microseconds is about 9 years of uptime.
"""

from __future__ import annotations

import enum

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

TICK_BITS = 48


class Reason(enum.IntEnum):
    """End reason codes (host/deadline.py COMPLETE, EARLY, DEADLINE)."""

    NONE = 0
    COMPLETE = 1
    EARLY = 2
    DEADLINE = 3


REASON_NAMES = {Reason.COMPLETE: "complete", Reason.EARLY: "early", Reason.DEADLINE: "deadline"}


def idle_gap(m: Module, alpha_q8, timeout) -> Signal:
    """max(1, (alpha_q8 * T) >> 8): the early timeout's idle gap, for every context."""
    prod = Signal(len(timeout) + 9)
    gap = Signal(len(timeout) + 1)
    m.d.comb += prod.eq(alpha_q8 * timeout)
    m.d.comb += gap.eq(Mux((prod >> 8) == 0, 1, prod >> 8))
    return gap


def _max(a, b):
    return Mux(a > b, a, b)


class PhaseTimer(wiring.Component):
    """When (and why) a phase ends, given its state, the live T and `now`.

    Inputs mirror PhaseTracker: `active` = begun and not ended; `has_arrival` =
    last_arrival is not None; `all_in`, `in_or_gone`, `all_flagged` as above.
    Outputs: `due` (the phase is over at `now`), `end_tick` (its end tick), `reason`.
    """

    LATENCY = 0  # combinational

    def __init__(self) -> None:
        t = TICK_BITS
        super().__init__(
            {
                "active": In(1),
                "start": In(t),
                "anchor": In(t),
                "has_arrival": In(1),
                "last_arrival": In(t),
                "last_gone": In(t),
                "all_in": In(1),
                "in_or_gone": In(1),
                "all_flagged": In(1),
                "timeout": In(32),
                "idle": In(33),
                "floor": In(t),
                "now": In(t),
                "due": Out(1),
                "end_tick": Out(t),
                "reason": Out(Reason),
            }
        )

    def elaborate(self, platform):
        m = Module()
        t = TICK_BITS
        base = Signal(t)
        m.d.comb += base.eq(
            Mux(self.has_arrival & (self.last_arrival > self.start), self.last_arrival, self.start)
        )
        deadline = Signal(t + 1)
        early = Signal(t + 1)
        m.d.comb += [
            deadline.eq(_max(self.anchor + self.timeout, self.floor)),
            early.eq(_max(base + self.idle, self.floor)),
        ]
        with m.If(~self.active):
            m.d.comb += self.reason.eq(Reason.NONE)
        with m.Elif(self.all_in):
            m.d.comb += [self.due.eq(1), self.end_tick.eq(base), self.reason.eq(Reason.COMPLETE)]
        with m.Elif(self.in_or_gone):
            m.d.comb += [
                self.due.eq(1),
                self.end_tick.eq(_max(base, self.last_gone)),
                self.reason.eq(Reason.EARLY),
            ]
        with m.Elif(self.all_flagged & (early <= self.now) & (early < deadline)):
            m.d.comb += [self.due.eq(1), self.end_tick.eq(early), self.reason.eq(Reason.EARLY)]
        with m.Elif(deadline <= self.now):
            m.d.comb += [
                self.due.eq(1),
                self.end_tick.eq(deadline),
                self.reason.eq(Reason.DEADLINE),
            ]
        return m
