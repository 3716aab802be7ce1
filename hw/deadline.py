"""The phase-1 end rules of one op context, as comparators on tick counters.

Models `host/deadline.py: PhaseTracker.due(now, timeout, floor)`. The aggregator
keeps, per context, what the tracker keeps (start, anchor, last arrival, last
"gone" tick) and, instead of per-sender vectors, three incrementally maintained
facts: every expected packet is in, every sender still owing is gone, every
expected sender's LAST is in. This block turns them and the live T into
(due, end tick, reason): the base tick and anchor + T registered, then the candidate
end ticks, then compared with the live `now` (PhaseTimer.LATENCY = 2 register stages);
`PhaseContexts` registers the result and the blocks settle SETTLE cycles after every
change.

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

from amaranth import Array, Cat, Const, Module, Mux, Signal
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
    """max(1, (alpha_q8 * T) >> 8), registered in IDLE_LATENCY steps (125 MHz): the
    product (a DSP with its output register), then the floor at 1."""
    prod = Signal(len(timeout) + 9)
    gap = Signal(len(timeout) + 1)
    m.d.sync += prod.eq(alpha_q8 * timeout)
    m.d.sync += gap.eq(Mux((prod >> 8) == 0, 1, prod >> 8))
    return gap


IDLE_LATENCY = 2


def _max(a, b):
    return Mux(a > b, a, b)


class PhaseTimer(wiring.Component):
    """When (and why) a phase ends, given its state, the live T and `now`.

    Inputs mirror PhaseTracker: `active` = begun and not ended; `has_arrival` =
    last_arrival is not None; `all_in`, `in_or_gone`, `all_flagged` as above.
    Outputs: `due` (the phase is over at `now`), `end_tick` (its end tick), `reason`.
    """

    # Three stages, for 125 MHz: the base tick (start or last arrival) and anchor + T are
    # registered from the state, then the candidate end ticks, then they are compared
    # with the live `now`. After a change of the inputs (but `now`, which may move any
    # time), the outputs are valid LATENCY cycles later (owners settle).
    LATENCY = 2

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
        # stage 0: the base tick and anchor + T, registered with the flags
        base0 = Signal(t)
        dl_sum = Signal(t + 1)
        gone0 = Signal(t)
        f0 = Signal(4)
        m.d.sync += [
            base0.eq(
                Mux(self.has_arrival & (self.last_arrival > self.start), self.last_arrival,
                    self.start)
            ),
            dl_sum.eq(self.anchor + self.timeout),
            gone0.eq(self.last_gone),
            f0.eq(Cat(self.active, self.all_in, self.in_or_gone, self.all_flagged)),
        ]  # fmt: skip
        # stage 1: the candidate end ticks, registered
        deadline = Signal(t + 1)
        early = Signal(t + 1)
        base_r = Signal(t)
        gone_end = Signal(t)
        active, all_in, in_or_gone, flagged = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [
            deadline.eq(_max(dl_sum, self.floor)),
            early.eq(_max(base0 + self.idle, self.floor)),
            base_r.eq(base0),
            gone_end.eq(_max(base0, gone0)),
            Cat(active, all_in, in_or_gone, flagged).eq(f0),
        ]
        # stage 2: against the live clock
        with m.If(~active):
            m.d.comb += self.reason.eq(Reason.NONE)
        with m.Elif(all_in):
            m.d.comb += [self.due.eq(1), self.end_tick.eq(base_r), self.reason.eq(Reason.COMPLETE)]
        with m.Elif(in_or_gone):
            m.d.comb += [self.due.eq(1), self.end_tick.eq(gone_end), self.reason.eq(Reason.EARLY)]
        with m.Elif(flagged & (early <= self.now) & (early < deadline)):
            m.d.comb += [self.due.eq(1), self.end_tick.eq(early), self.reason.eq(Reason.EARLY)]
        with m.Elif(deadline <= self.now):
            m.d.comb += [
                self.due.eq(1),
                self.end_tick.eq(deadline),
                self.reason.eq(Reason.DEADLINE),
            ]
        return m


# Cycles from a change (with the t_C estimator idle) to a trustworthy end evaluation
# and pick: T, the idle gap's two steps, the PhaseTimer's stages, the due registers,
# pick_first.
PICK_LATENCY = 2  # cycles from stable `eligible` and keys to a valid `pick_first`
SETTLE = 2 + IDLE_LATENCY + PhaseTimer.LATENCY + PICK_LATENCY  # 8


def settle_step(m: Module, settle, tc):
    """One cycle of an owner's settle count (Signal(range(SETTLE + 1))): back to 0 while
    the t_C estimator is busy, else up to SETTLE. Returns "settled" for this cycle."""
    with m.If(tc.busy):
        m.d.sync += settle.eq(0)
    with m.Elif(settle != SETTLE):
        m.d.sync += settle.eq(settle + 1)
    return ~tc.busy & (settle == SETTLE)


class PhaseContexts:
    """The per-op-context phase state that the aggregator (phase 1) and the gather
    tracker (phase 2) both keep in registers, and its end evaluation.

    Fields (Arrays by context): valid, begun, ended, op, start, anchor, has_arr,
    last_arr, last_gone, recv, exp (packets received / expected), unflag (expected
    senders whose LAST is not in), owing (senders still owing and not gone).
    """

    FIELDS = ("valid", "begun", "ended", "op", "start", "anchor", "has_arr", "last_arr",
              "last_gone", "recv", "exp", "unflag", "owing")  # fmt: skip

    def __init__(self, n_ctx: int, tot_shape, n_cnt) -> None:
        self.n_ctx = n_ctx
        shapes = {"op": 32, "start": TICK_BITS, "anchor": TICK_BITS, "last_arr": TICK_BITS,
                  "last_gone": TICK_BITS, "recv": tot_shape, "exp": tot_shape,
                  "unflag": n_cnt, "owing": n_cnt}  # fmt: skip
        for f in self.FIELDS:
            shape = shapes.get(f, 1)
            setattr(self, f, Array(Signal(shape, name=f"{f}{k}") for k in range(n_ctx)))

    def fields(self) -> tuple:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def evaluate(self, m: Module, tc, alpha_q8, now):
        """Every context's phase end: T = tc.timeout and its idle gap registered, one
        PhaseTimer per context, and its outputs registered. Valid SETTLE cycles after
        the last change, with tc not busy throughout.

        Returns (T, due, due_end, due_reason): T registered, the rest Arrays by context.
        """
        T = Signal(32)
        m.d.sync += T.eq(tc.timeout)
        idle = idle_gap(m, alpha_q8, T)
        n = self.n_ctx
        due = Array(Signal(name=f"due{k}") for k in range(n))
        due_end = Array(Signal(TICK_BITS, name=f"due_end{k}") for k in range(n))
        due_reason = Array(Signal(Reason, name=f"due_reason{k}") for k in range(n))
        for k in range(n):
            pt = PhaseTimer()
            m.submodules[f"timer{k}"] = pt
            m.d.comb += [
                pt.active.eq(self.valid[k] & self.begun[k] & ~self.ended[k]),
                pt.start.eq(self.start[k]),
                pt.anchor.eq(self.anchor[k]),
                pt.has_arrival.eq(self.has_arr[k]),
                pt.last_arrival.eq(self.last_arr[k]),
                pt.last_gone.eq(self.last_gone[k]),
                pt.all_in.eq(self.recv[k] == self.exp[k]),
                pt.in_or_gone.eq(self.owing[k] == 0),
                pt.all_flagged.eq(self.unflag[k] == 0),
                pt.timeout.eq(T),
                pt.idle.eq(idle),
                pt.floor.eq(tc.floor),
                pt.now.eq(now),
            ]
            m.d.sync += [due[k].eq(pt.due), due_end[k].eq(pt.end_tick), due_reason[k].eq(pt.reason)]
        return T, due, due_end, due_reason

    def picks(self, m: Module, due, due_end, ev_op_id, ops_in_flight: int):
        """The next phase to end, registered (pick_first): by (end tick, op) among the
        due (NicModel.advance), and by op among the due ops <= ev_op_id - K, the ones
        the event's sender has finished (NicModel._peer_progress).

        Returns (idle_found, idle_pick, post_found, post_pick).
        """
        op, n = self.op, self.n_ctx

        def by_time(i, j):
            return (due_end[i] < due_end[j]) | ((due_end[i] == due_end[j]) & (op[i] <= op[j]))

        idle_found, idle_pick = pick_first(m, "pick_idle", list(due), by_time)
        post_found, post_pick = pick_first(
            m, "pick_post", [due[k] & ((op[k] + ops_in_flight) <= ev_op_id) for k in range(n)],
            lambda i, j: op[i] <= op[j],
        )  # fmt: skip
        return idle_found, idle_pick, post_found, post_pick


def pick_first(m: Module, name: str, eligible: list, le) -> tuple[Signal, Signal]:
    """The first eligible context in a total order, registered (PICK_LATENCY cycles).

    `le(i, j)` (i < j) says context i goes no later than j; ties go to the lower index,
    as a serial scan keeping the first strict minimum would. Stage 1 registers every
    pairwise order and the eligible bits (each pair one comparator, all in parallel);
    stage 2 finds the context that goes before every other eligible one.
    Returns (found, index).
    """
    n = len(eligible)
    el = [Signal(name=f"{name}_el{k}") for k in range(n)]
    m.d.sync += [el[k].eq(eligible[k]) for k in range(n)]
    le_r = {}
    for i in range(n):
        for j in range(i + 1, n):
            le_r[i, j] = Signal(name=f"{name}_le{i}_{j}")
            m.d.sync += le_r[i, j].eq(le(i, j))

    def before(k: int, j: int):
        return le_r[k, j] if k < j else ~le_r[j, k]

    found = Signal(name=f"{name}_found")
    index = Signal(range(max(2, n)), name=f"{name}_index")
    wins = []
    for k in range(n):
        w = el[k]
        for j in range(n):
            if j != k:
                w = w & (~el[j] | before(k, j))
        wins.append(w)
    sel = Const(0, len(index))
    for k in reversed(range(n)):
        sel = Mux(wins[k], k, sel)
    m.d.sync += [found.eq(Cat(*el).any()), index.eq(sel)]
    return found, index
