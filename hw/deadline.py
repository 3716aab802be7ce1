"""The phase-1 end rules of one op context, as comparators on tick counters.

Models `host/model/deadline.py: PhaseTracker.due(now, timeout, floor)`. The aggregator
keeps, per context, what the tracker keeps (start, anchor, last arrival, last
"gone" tick) and, instead of per-sender vectors, three incrementally maintained
facts: every expected packet is in, every sender still owing is gone, every
expected sender's LAST is in. This block turns them and the live T into
(due, end tick, reason): the base tick, the deadline and base + idle registered, then
the early end and the rule, then compared with the live `now` (PhaseTimer.LATENCY = 2);
`PhaseContexts` runs one timer over its contexts in turn and registers the results; the
blocks settle `settle_cycles(n_ctx)` cycles after every change.

  complete   all in                       -> max(start, last arrival)
  early      all in or gone               -> max(start, last arrival, last gone)
  early      LAST from all, idle gap      -> max(max(start, last arrival) + idle, floor)
             (only if before the deadline)
  deadline   anchor + T                   -> max(anchor + T, floor)

`idle` = max(1, alpha_q8 * T >> 8) is computed once for all contexts (`idle_gap`).

Ticks. A tick is `NicParams.tick_bits` = w bits (32 by default: it wraps every 71.6
minutes; the 25F's 24 every 16.8 s): ticks are serial numbers (as TCP's sequence
numbers), compared by the sign of their difference (`tick_before`), and sums wrap. That
order is the model's (unbounded integers) for any two ticks less than 2^(w-1) apart,
and every pair the blocks compare is, by three rules:
  - a phase lasts less than 2^(w-3) ticks: T <= t_B < 2^(w-4) (NicParams.t_b_bits, the
    CSR register's width), phase 1 ends by start + T, phase 2 by p1_start + t1 + T;
  - a context's begin sets start and anchor, and moves the arrival and "gone" ticks
    taken before it to start (the model's max(start, ...) takes start for them): an
    active phase's ticks are all in [start, now], however long its context waited;
  - the t_C floor, the only tick kept across ops, is retired (`floor_live` low) once it
    is 2^(w-2) ticks old: by then every live phase began after it, and max(x, floor) = x.
One 32-bit tick is half the carry chains and flip-flops of the 48-bit ones before it
(about 2 400 LUTs and 1 900 flip-flops of the 25F core, docs/boards.md).
"""

from __future__ import annotations

import enum

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw import wide_multiplier as wmul


def tick_before(a, b) -> Value:
    """Tick `a` comes before tick `b` (serial-number order, module docstring "Ticks"):
    the sign bit of a - b, one carry chain as a compare. Both are ticks, of one width."""
    a, b = Value.cast(a), Value.cast(b)
    if len(a) != len(b):
        raise ValueError(f"tick_before: ticks of {len(a)} and {len(b)} bits")
    return (a - b)[len(a) - 1]


def tick_sum(a, b) -> Value:
    """Tick `a` plus duration `b` on the wrapping tick clock (a's width)."""
    a = Value.cast(a)
    return (a + b)[: len(a)]


def op_order_bits(n_ctx: int) -> int:
    """Low bits of an op id that order two ops of one receive window (`op_at_most`)."""
    return (n_ctx - 1).bit_length() + 2


def op_at_most(a, b, n_ctx: int) -> Value:
    """Op `a` <= op `b`, for two ops less than 2 * n_ctx apart, from their low
    `op_order_bits(n_ctx)` bits: the sign of b - a, as the ticks' serial order.

    Every op an owner orders is so: a context whose phase has not ended holds an op not
    done, in the receive window [base, base + 2K) (n_ctx >= 2K), and an event's op is in
    [base - K - 1, base + 2K) (base may pass it while the event waits: a START can slip
    in after a frame was judged), so op - K is in [base - 2K - 1, base + K): b - a is in
    [-4K, 2K), and -4K >= -2 n_ctx is still read right. A 32-bit compare was a carry
    chain per pair of contexts in each owner's picks, and one per context for the
    sender's finished ops.
    """
    w = op_order_bits(n_ctx)
    return ~(b[:w] - a[:w])[w - 1]


def op_same(a, b, n_ctx: int) -> Value:
    """Op `a` is op `b`, for two ops less than 4 * n_ctx apart, from their low
    `op_order_bits(n_ctx)` bits. A context lookup is so: the op asked about is in
    [base - K - 1, base + 2K) (op_at_most), and a valid context holds an op
    >= base - n_ctx (every op below base had its events, or its START, in its slot, and
    a claim never goes back)."""
    w = op_order_bits(n_ctx)
    return a[:w] == b[:w]


# Other compares are written as `<` and `>=` only: yosys maps those to a CCU2C carry chain
# alone, but `>` and `<=` to the chain and an equality tree beside it (three more logic
# levels; docs/gateware.md, "Timing"). A tick compare is one subtraction's sign bit.


class Reason(enum.IntEnum):
    """End reason codes (host/model/deadline.py COMPLETE, EARLY, DEADLINE)."""

    NONE = 0
    COMPLETE = 1
    EARLY = 2
    DEADLINE = 3


REASON_NAMES = {Reason.COMPLETE: "complete", Reason.EARLY: "early", Reason.DEADLINE: "deadline"}


def idle_gap(m: Module, alpha_q8, timeout) -> Signal:
    """max(1, (alpha_q8 * T) >> 8), registered in IDLE_LATENCY steps (125 MHz): each
    DSP's partial product (a piece of T times alpha), then their sum and the floor at 1.
    The floor is read from the partials, beside the sum: the gap is 0 exactly when every
    piece above the lowest is 0 and the lowest is under 256."""
    pieces = wmul.pieces(timeout, len(timeout))
    parts = []
    for k, piece in enumerate(pieces):
        part = Signal(len(piece) + len(alpha_q8), name=f"idle_pp{k}")
        m.d.sync += part.eq(piece * alpha_q8)
        parts.append(part)
    zero = (parts[0] < 256) & ~Cat(*parts[1:]).any()
    total = sum(part << (wmul.CHUNK * k) for k, part in enumerate(parts))
    gap = Signal(len(timeout) + 1)
    m.d.sync += gap.eq(Mux(zero, 1, total >> 8))
    return gap


IDLE_LATENCY = 2


class PhaseTimer(wiring.Component):
    """When (and why) a phase ends, given its state, the live T and `now`.

    Inputs mirror PhaseTracker: `active` = begun and not ended; `has_arrival` =
    last_arrival is not None; `all_in`, `in_or_gone`, `all_flagged` as above.
    Outputs: `due` (the phase is over at `now`), `end_tick` (its end tick), `reason`;
    the last two are those of the rule that will end it, and mean something while `due`
    (`reason` is NONE for an inactive phase).
    """

    # Two register stages at the core's 52.08 MHz, two carry chains and their muxes
    # each (it had five at 125 MHz, a chain each: 400 flip-flops more per timer), then
    # the rule's end tick is compared with the live `now` (the owner registers the
    # outputs). One timer serves every context of an owner in turn
    # (`PhaseContexts.evaluate`), so the inputs of one context may follow those of
    # another in the next cycle: each per-context value
    # travels with its context from stage to stage, flags included ("due" only ever follows
    # an `active` LATENCY cycles before; the cut timers of the formal harness assume it).
    # `timeout`, `idle` and `floor` are the owner's, the same for every context: they are
    # read where they are used, and the owner settles after they change.
    LATENCY = 2

    def __init__(self, tick_bits: int) -> None:
        self.tick_bits = t = tick_bits
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
                "timeout": In(t - 4),  # T <= t_B < 2^(tick_bits - 4) ("Ticks")
                "idle": In(t - 3),
                "floor": In(t),
                "floor_live": In(1),
                "now": In(t),
                "due": Out(1),
                "end_tick": Out(t),
                "reason": Out(Reason),
            }
        )

    def elaborate(self, platform):
        m = Module()
        t = self.tick_bits

        def stage(name: str, value, width: int = t) -> Signal:
            r = Signal(width, name=name)
            m.d.sync += r.eq(value)
            return r

        floor = self.floor  # the owner's: held while it settles

        def above_floor(x):  # max(x, floor) = x (a retired floor is below every live tick)
            return ~self.floor_live | tick_before(floor, x)

        flags = Cat(self.active, self.all_in, self.in_or_gone, self.all_flagged)
        # stage A: the base tick (start or last arrival); the deadline max(anchor + T,
        # floor); base + idle; the "gone" end max(base, last gone)
        arr_gt = self.has_arrival & tick_before(self.start, self.last_arrival)
        base_c = Mux(arr_gt, self.last_arrival, self.start)
        dl_sum = tick_sum(self.anchor, self.timeout)
        gone_c = Mux(tick_before(self.last_gone, base_c), base_c, self.last_gone)
        deadline_a = stage("deadline_a", Mux(above_floor(dl_sum), dl_sum, floor))
        e_sum = stage("e_sum_a", tick_sum(base_c, self.idle))
        base, gone_end = stage("base_a", base_c), stage("gone_end_a", gone_c)
        active, all_in, in_or_gone, all_flagged = stage("flags_a", flags, 4)
        # stage B: the early end max(base + idle, floor); does it beat the deadline
        # (max(e_sum, floor) < deadline <=> both are); the end if all are in or gone
        early = stage("early_b", Mux(above_floor(e_sum), e_sum, floor))
        deadline = stage("deadline_b", deadline_a)
        beats = tick_before(e_sum, deadline_a) & above_floor(deadline_a)
        use_early = stage("use_early", all_flagged & beats, 1)
        fixed = stage("fixed", Mux(all_in, base, gone_end))  # all in, or in or gone
        settled_in = all_in | in_or_gone
        imm = stage("imm", active & settled_in, 1)  # due whatever the clock
        wait = stage("wait", active & ~settled_in, 1)
        imm_reason = stage("imm_reason", Mux(all_in, Reason.COMPLETE, Reason.EARLY), 2)
        # then the rule's end tick against the live clock; the end tick and reason do not
        # wait for the compare (they mean something while `due`)
        reached = ~tick_before(self.now, Mux(use_early, early, deadline))
        m.d.comb += [
            self.due.eq(imm | (wait & reached)),
            self.end_tick.eq(Mux(imm, fixed, Mux(use_early, early, deadline))),
            self.reason.eq(
                Mux(imm, imm_reason,
                    Mux(wait, Mux(use_early, Reason.EARLY, Reason.DEADLINE), Reason.NONE))
            ),
        ]  # fmt: skip
        return m


# Cycles from a change (with the t_C estimator idle) to a trustworthy end evaluation
# and pick: T, the idle gap's two steps (the timer's first stage reads it), the turn's
# wait (n_ctx - 1) at the shared PhaseTimer, its stages, the due registers, pick_first.
PICK_LATENCY = 2  # cycles from stable `eligible` and keys to a valid `pick_first`


def settle_cycles(n_ctx: int) -> int:
    """Cycles an owner waits after a change before it trusts its end evaluation and picks."""
    return 2 + IDLE_LATENCY + (n_ctx - 1) + PhaseTimer.LATENCY + PICK_LATENCY  # 11 at 4


class Settle:
    """An owner's settle count: the cycles its end evaluation has been stable, with the t_C
    estimator idle. Its picks and due bits are valid once `settled` (settle_cycles(n_ctx)
    cycles after the last change). `restart()` after every change; `step(m, tc)` counts."""

    def __init__(self, n_ctx: int) -> None:
        self.target = settle_cycles(n_ctx)
        self.count = Signal(range(self.target + 1), name="settle")
        self.settled = self.count == self.target

    def restart(self):
        """The statement (for m.d.sync) that starts the count again."""
        return self.count.eq(0)

    def step(self, m: Module, tc):
        """One cycle of the count: back to 0 while the t_C estimator is busy, else up to
        the target. Returns "settled, estimator idle" for this cycle."""
        with m.If(tc.busy):
            m.d.sync += self.count.eq(0)
        with m.Elif(~self.settled):
            m.d.sync += self.count.eq(self.count + 1)
        return ~tc.busy & self.settled


class PhaseContexts:
    """The per-op-context phase state that the aggregator (phase 1) and the gather
    tracker (phase 2) both keep in registers, and its end evaluation.

    Fields (Arrays by context): valid, begun, ended, op, start, anchor, has_arr,
    last_arr, last_gone, recv, exp (packets received / expected), unflag (expected
    senders whose LAST is not in), owing (senders still owing and not gone).
    """

    FIELDS = ("valid", "begun", "ended", "op", "start", "anchor", "has_arr", "last_arr",
              "last_gone", "recv", "exp", "unflag", "owing")  # fmt: skip

    def __init__(self, n_ctx: int, tot_shape, n_cnt, tick_bits: int) -> None:
        self.n_ctx, self.tick_bits = n_ctx, t = n_ctx, tick_bits
        shapes = {"op": 32, "start": t, "anchor": t, "last_arr": t,
                  "last_gone": t, "recv": tot_shape, "exp": tot_shape,
                  "unflag": n_cnt, "owing": n_cnt}  # fmt: skip
        for f in self.FIELDS:
            shape = shapes.get(f, 1)
            setattr(self, f, Array(Signal(shape, name=f"{f}{k}") for k in range(n_ctx)))

    def fields(self) -> tuple:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def claim(self, c, op_id) -> list:
        """Statements that give context `c` to op `op_id`: valid, not begun, nothing in
        (the per-sender counts are the owner's to set once it knows the op's size; its
        ticks mean nothing before `begin` sets them)."""
        return [
            self.valid[c].eq(1),
            self.op[c].eq(op_id),
            *(getattr(self, f)[c].eq(0) for f in ("begun", "ended", "has_arr", "recv")),
        ]

    def begin(self, c, start, anchor) -> list:
        """Statements that begin context `c`'s phase at tick `start`, with its deadline
        anchored at `anchor`. Arrivals and "gone" notices taken before the begin are no
        later than `start`, and the end rules take max(start, them): they become `start`,
        so that no tick of an active phase is older than its start."""
        return [
            self.begun[c].eq(1),
            self.start[c].eq(start),
            self.anchor[c].eq(anchor),
            self.last_arr[c].eq(start),
            self.last_gone[c].eq(start),
        ]

    def arrival(self, c, now) -> list:
        """Statements for an accepted packet of context `c` at tick `now`."""
        return [self.recv[c].eq(self.recv[c] + 1), self.last_arr[c].eq(now), self.has_arr[c].eq(1)]

    # What an event says of the contexts, registered a state before its use (125 MHz):
    # `hits` (context k holds the event's op) when the event is taken, `done` (context k's
    # op <= op id - K: one the event's sender has finished) once the op has its context.
    def event_registers(self) -> tuple[Signal, Signal]:
        """(hits, done), a bit per context; set by `take_event` and `mark_done`."""
        self.hits = Signal(self.n_ctx, name="hits")
        self.done = Signal(self.n_ctx, name="done")
        self._op_k = Signal(op_order_bits(self.n_ctx), name="op_k")  # op id - K, low bits
        self._op_k_ok = Signal(name="op_k_ok")  # op id >= K
        return self.hits, self.done

    def take_event(self, m: Module, op_id, ops_in_flight: int) -> None:
        """In the state after taking an event: each context's op against its op id
        (op_same)."""
        n = self.n_ctx
        m.d.sync += [
            self.hits.eq(Cat(self.valid[k] & op_same(self.op[k], op_id, n) for k in range(n))),
            self._op_k.eq(op_id - ops_in_flight),
            self._op_k_ok.eq(op_id >= ops_in_flight),
        ]

    def mark_done(self, m: Module) -> list:
        """In a state after the claim: registers `done`; returns its terms, per context."""
        n = self.n_ctx
        fin = [self._op_k_ok & op_at_most(self.op[k], self._op_k, n) for k in range(n)]
        m.d.sync += self.done.eq(Cat(fin))
        return fin

    def evaluate(self, m: Module, tc, alpha_q8, now):
        """Every context's phase end: T = tc.timeout and its idle gap registered, one
        PhaseTimer that takes the contexts in turn (a context a cycle), and its outputs
        registered by context. Valid `settle_cycles(n_ctx)` cycles after the last change,
        with tc not busy throughout.

        Returns (T, due, due_end, due_reason): T registered, the rest Arrays by context.
        """
        T = Signal(self.tick_bits - 4)  # T <= t_B < 2^(tick_bits - 4) ("Ticks")
        m.d.sync += T.eq(tc.timeout)
        idle = idle_gap(m, alpha_q8, T)
        n = self.n_ctx
        due = Array(Signal(name=f"due{k}") for k in range(n))
        due_end = Array(Signal(self.tick_bits, name=f"due_end{k}") for k in range(n))
        due_reason = Array(Signal(Reason, name=f"due_reason{k}") for k in range(n))
        # one timer for all contexts: a 48-bit timer per context was most of an owner's
        # carry chains and a sixth of the core's flip-flops (docs/gateware.md, "Timers")
        turn = Signal(range(max(2, n)), name="timer_turn")
        m.d.sync += turn.eq(Mux(turn == n - 1, 0, turn + 1))
        m.submodules.timer = pt = PhaseTimer(self.tick_bits)
        facts = {
            "all_in": Array(self.recv[k] == self.exp[k] for k in range(n)),
            "in_or_gone": Array(self.owing[k] == 0 for k in range(n)),
            "all_flagged": Array(self.unflag[k] == 0 for k in range(n)),
        }
        m.d.comb += [
            pt.active.eq(self.valid[turn] & self.begun[turn] & ~self.ended[turn]),
            pt.start.eq(self.start[turn]),
            pt.anchor.eq(self.anchor[turn]),
            pt.has_arrival.eq(self.has_arr[turn]),
            pt.last_arrival.eq(self.last_arr[turn]),
            pt.last_gone.eq(self.last_gone[turn]),
            *(getattr(pt, name).eq(fact[turn]) for name, fact in facts.items()),
            pt.timeout.eq(T),
            pt.idle.eq(idle),
            pt.floor.eq(tc.floor),
            pt.floor_live.eq(tc.floor_live),
            pt.now.eq(now),
        ]
        whose = turn  # the context whose result leaves the timer now
        for k in range(PhaseTimer.LATENCY):
            r = Signal.like(turn, name=f"timer_whose{k}")
            m.d.sync += r.eq(whose)
            whose = r
        m.d.sync += [
            due[whose].eq(pt.due),
            due_end[whose].eq(pt.end_tick),
            due_reason[whose].eq(pt.reason),
        ]
        return T, due, due_end, due_reason

    def picks(self, m: Module, due, due_end, done):
        """The next phase to end, registered (pick_first): by (end tick, op) among the
        due (NicModel.advance), and by op among the due ops the event's sender has
        finished (NicModel._peer_progress): `done`, a registered bit per context that
        its op <= the event's op id - K.

        Returns (idle_found, idle_pick, post_found, post_pick). Also makes the end's
        registers: `fire_c` (the context to end), `ret_post` (back to POST after it) and
        `post_b` (POST is done with the sender's older ops).
        """
        self.fire_c = Signal(max(1, (self.n_ctx - 1).bit_length()), name="fire_c")
        self.ret_post = Signal(name="ret_post")
        self.post_b = Signal(name="post_b")
        op, n = self.op, self.n_ctx

        def by_time(i, j):  # end tick, then op: each compare registered on its own
            return (tick_before(due_end[i], due_end[j]), due_end[i] == due_end[j],
                    op_at_most(op[i], op[j], n))  # fmt: skip

        idle_found, idle_pick = pick_first(m, "pick_idle", list(due), by_time)
        self.post_found, self.post_pick = pick_first(
            m, "pick_post", [due[k] & done[k] for k in range(n)],
            lambda i, j: (op_at_most(op[i], op[j], n),),
        )  # fmt: skip
        return idle_found, idle_pick, self.post_found, self.post_pick

    def post_state(self, m: Module, settle: Settle, tc, c, peer_ev, own_due) -> None:
        """The FSM state POST, after an event of context `c` (from `picks`' signals):
        once the end evaluation has settled, end the due ops the event's sender has
        finished, by op, if it came from a peer (`peer_ev`: NicModel._peer_progress),
        then the event's own op if `own_due` (NicModel._progress), then IDLE (where the
        rest end by (end tick, op): NicModel.advance). Call inside the owner's FSM."""
        fire_c, ret_post, post_b = self.fire_c, self.ret_post, self.post_b
        with m.State("POST"), m.If(settle.step(m, tc)):
            with m.If(~post_b):
                with m.If(peer_ev & self.post_found):
                    m.d.sync += [fire_c.eq(self.post_pick), ret_post.eq(1)]
                    m.next = "FIRE"
                with m.Else():
                    m.d.sync += post_b.eq(1)
            with m.Elif(own_due):
                m.d.sync += [fire_c.eq(c), ret_post.eq(1)]
                m.next = "FIRE"
            with m.Else():
                m.d.sync += ret_post.eq(0)
                m.next = "IDLE"

    def end_states(self, m: Module, owner, tc, T, due_end, due_reason, settle: Settle,
                   select=(), report=None) -> None:  # fmt: skip
        """The FSM states of a phase end of context `fire_c`, in three steps (125 MHz):
        FIRE selects the context's registers, FIRE_SMP subtracts the two completion-time
        samples, FIRE_END reports the end on `owner`'s end_* ports (one end_valid
        strobe), marks the context ended and gives tc its sample (PhaseTracker.finish);
        then POST if `ret_post`, else SETTLE, where the evaluation catches up before
        IDLE. Call inside the owner's `with m.FSM()`. `select`: the owner's own
        (register, value) pairs taken in FIRE; `report(m)`: its own statements in
        FIRE_END. The estimator is idle here (every path to FIRE waits).
        """
        f, ret_post = self.fire_c, self.ret_post
        t = self.tick_bits
        f_end, f_start, f_arr = Signal(t), Signal(t), Signal(t)
        f_reason, f_has, f_op = Signal(Reason), Signal(), Signal(32)
        f_recv, f_exp = Signal.like(self.recv[0]), Signal.like(self.exp[0])
        dl_smp, arr_smp, arr_ok = Signal(t), Signal(t), Signal()
        with m.State("FIRE"):
            m.d.sync += [
                f_end.eq(due_end[f]),
                f_reason.eq(due_reason[f]),
                f_start.eq(self.start[f]),
                f_arr.eq(self.last_arr[f]),
                f_has.eq(self.has_arr[f]),
                f_op.eq(self.op[f]),
                f_recv.eq(self.recv[f]),
                f_exp.eq(self.exp[f]),
                *(reg.eq(value) for reg, value in select),
            ]
            m.next = "FIRE_SMP"
        with m.State("FIRE_SMP"):
            m.d.sync += [
                dl_smp.eq(f_end - f_start),
                arr_smp.eq(f_arr - f_start),
                arr_ok.eq(f_has & tick_before(f_start, f_arr)),
            ]
            m.next = "FIRE_END"
        with m.State("FIRE_END"):
            m.d.sync += [
                self.ended[f].eq(1),
                owner.end_valid.eq(1),
                owner.end_op.eq(f_op),
                owner.end_reason.eq(f_reason),
                owner.end_tick.eq(f_end),
                owner.end_timeout.eq(T),
                owner.end_received.eq(f_recv),
                owner.end_expected.eq(f_exp),
                settle.restart(),
            ]
            if report is not None:
                report(m)
            deadline = f_reason == Reason.DEADLINE
            m.d.comb += [
                tc.sample.valid.eq(deadline | arr_ok),
                tc.sample.payload.value.eq(Mux(deadline, dl_smp, arr_smp)),
                tc.sample.payload.at.eq(f_end),
            ]
            with m.If(ret_post):
                m.next = "POST"
            with m.Else():
                m.next = "SETTLE"
        with m.State("SETTLE"), m.If(settle.step(m, tc)):
            m.next = "IDLE"


def pick_first(m: Module, name: str, eligible: list, le) -> tuple[Signal, Signal]:
    """The first eligible context in a total order, registered (PICK_LATENCY cycles).

    `le(i, j)` (i < j) says context i goes no later than j: a tuple (a,) or (a, b, c) for
    a | (b & c), each term registered on its own (a key of two compares); ties go to the
    lower index, as a serial scan keeping the first strict minimum would. Stage 1
    registers every pairwise order's terms and the eligible bits (all in parallel);
    stage 2 finds the context that goes before every other eligible one.
    Returns (found, index).
    """
    n = len(eligible)
    el = [Signal(name=f"{name}_el{k}") for k in range(n)]
    m.d.sync += [el[k].eq(eligible[k]) for k in range(n)]
    le_r = {}
    for i in range(n):
        for j in range(i + 1, n):
            terms = []
            parts = le(i, j)
            assert len(parts) in (1, 3), "le(i, j) is (a,) or (a, b, c) for a | (b & c)"
            for t, term in enumerate(parts):
                r = Signal(name=f"{name}_le{i}_{j}_{t}")
                m.d.sync += r.eq(term)
                terms.append(r)
            le_r[i, j] = terms[0] if len(terms) == 1 else terms[0] | (terms[1] & terms[2])

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
