"""Bounded model checks of hw/aggregator.py: Aggregator.

Checked by Yosys's SAT solver (`sim/formal_harness.py`; smtbmc + z3 took minutes for 20
cycles), from reset, at the smallest legal sizes: P = 1, B = 2, C = 4 (4 packets per
op), n_max = 2 (so world = 2), K = 2 (4 contexts, op ids 0..1), lanes = 1, with ticks
built 10 bits wide (NicParams.tick_bits; t_C values are then 6). Every input
is free (AnySeq / AnyConst) except for the documented input contract, which is assumed:
  - reset in the first cycle only; configuration static: rank < world = 2,
    1 <= t_b < 2^6 (the tick contract of hw/deadline.py at 10-bit ticks: t_B below
    2^(tick_bits - 4)), 1 <= alpha_q8 <= 256;
  - valid/ready on `ev` and `i`: once valid, valid and payload hold until ready;
  - every event passed checks 1-28 (docs/protocol.md): op_id in the receive window
    (here op_id < N_OPS <= n_ctx, so no context is reused within the bound),
    1 <= op_len <= C and the same for every event of an op (22, 28), a scatter's or
    gather's sender < world and != rank (19, 20), t_c >= 1 (16), a scatter's pkt_index
    in range (25) and owned by this rank (26); OWN packets are owned in-range slots of the
    op, each once, after the op's START (the overflow check allows them before it too: a
    superset); one START per op;
  - (deadline only) ticks at least `tick_gap` cycles apart: more than an owner needs to
    take one (IDLE, then its settle count), as the real tick, one strobe per
    microsecond, is 52 cycles of the boards' 52.08 MHz core clock (TICK_GAP).
The harness keeps its own shadow of what the contract says must happen (which frames are
accepted, late or duplicates, each slot's distinct contributors, the exact sum of the
accepted payloads of one symbolic element, each op's start tick) and watches the
accumulator and bitmap write ports and the outputs:
  overflow   the accumulator write of the watched element is the exact (wide) sum of
             what was accepted for it, and that sum fits w_acc bits;
  range      every accumulator write is a beat of an accepted, owned, in-range packet at
             its own slot, and there is one per accepted beat; every bitmap write is the
             clear of the context being claimed or the accepted packet's own slot;
  duplicate  every bitmap write holds exactly the slot's distinct accepted contributors
             and their count, readout counts are that number, and cnt_rx, cnt_duplicate,
             cnt_late equal the harness's counts;
  deadline   the block takes a tick that came within TAKE_BOUND cycles; a started
             phase whose deadline max(start + T, floor) has passed ends within
             DEADLINE_BOUND cycles of the block's clock catching up with the ticks (not
             counting, in either, cycles waiting for a payload beat); its reported end
             tick is >= start, <= now and <= the deadline.
For the first three, the PhaseTimer and the t_C estimator are cut (free outputs, with
"due" only for an active phase, as test_formal.py proves), and for range/duplicate the
accumulator memory too: an over-approximation. These are bounded checks (depth DEPTH
cycles from reset, every input sequence), not proofs for all time.

Each property is also run on a mutant of hw/aggregator.py with one deliberate bug
(MUTANTS), which it must refute, to show the check catches that bug: accumulators one
bit too narrow (overflow), a payload written at the wrong row (range), the duplicate test
removed (duplicate), the deadline anchored one tick late (deadline). And the range check
without the parser's checks 25/26 in the contract must fail: the block does not check
the index itself, it relies on the parser (hw/parser.py drops "index out of range" and
"wrong owner" frames before they reach it).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from amaranth import Cat, Const, Module, Mux, ResetSignal, Signal, signed
from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import Assert, Assume
from amaranth.lib.wiring import Component, In

from optireduce.hw import aggregator
from optireduce.hw.aggregator import _bits
from optireduce.hw.deadline import PhaseTimer, settle_cycles
from optireduce.params import NicParams
from optireduce.sim.formal_harness import mutant, prepare_sat_bmc, solve_sat_bmc

# The smallest legal sizes: 1 element per packet, blocks of 2, 4 packets per op, 2 ranks.
P = NicParams(p=1, b=2, c=4, n_max=2, ops_in_flight=2, lanes=1, t_b_us=4, tick_bits=10)
N_OPS = 2  # op ids 0..N_OPS-1 (each its own context)
# Cycles beyond an owner's settle count between two ticks. An owner takes a pending tick
# before it fires a due phase (IDLE), then settles: ticks closer than that would keep a
# due phase from ever firing, which the real clock (52 cycles a tick) never does. At 4
# cycles apart (this constant's old meaning) the check saw such a starved phase once
# the settle count came down to 11 cycles; at 14 it had run out of depth first.
TICK_GAP = 4


def _popcount(bits, n):
    return sum((bits >> k) & 1 for k in range(n))


def harness(prop: str, variant: str = "holds", mod=aggregator, p: NicParams = P,
            n_ops: int = N_OPS) -> Module:  # fmt: skip
    """The check of `prop` on `mod.Aggregator` (the real one, or a mutant); variant "no_parser"
    drops the parser's checks 25/26 from the contract."""
    Kind = mod.Kind  # the mutant has its own enum
    m = Module()
    dut = mod.Aggregator(p)
    dut._MustUse__silence = True  # elaborated by hand below
    inner = dut.elaborate(None)
    m.submodules.dut = inner
    acc_wr = inner._named_submodules["acc"][0].write_ports[0]
    bm_wr = inner._named_submodules["bitmap"][0].write_ports[0]
    tc = inner._named_submodules["tc"][0]
    timer = inner._named_submodules["timer"][0]  # one for every context, in turn
    if prop in CUT_TIMING:
        # the timer and the t_C estimator are cut (their outputs free, see CUT_TIMING);
        # the timer only ever says "due" for a phase active LATENCY cycles before (its
        # stages are registered; proven in test_formal.py), and the context it speaks
        # of is the one it took then (PhaseContexts' timer_turn / timer_whose* chain,
        # which the cut leaves alone: it selects the timer cell, "c:timer", not "timer*")
        was = timer.active
        for d in range(PhaseTimer.LATENCY):
            prev = Signal(name=f"was_active{d}")
            m.d.sync += prev.eq(was)
            was = prev
        m.d.comb += Assume(~timer.due | was)

    n_ctx, npk, beats, n_max = dut.n_ctx, dut.npk_max, dut.beats, p.n_max
    cb, rb, bb = _bits(n_ctx), _bits(dut.rows_max), _bits(beats)
    w_acc = p.w_acc
    assert n_ops <= n_ctx and p.lanes == 1

    first = Signal(init=1, reset_less=True)
    m.d.sync += first.eq(0)
    m.d.comb += Assume(ResetSignal() == first)

    # ---- configuration -------------------------------------------------------------
    rank, world = AnyConst(len(dut.rank)), AnyConst(len(dut.world))
    t_b, alpha = AnyConst(32), AnyConst(9)
    if n_max == 2:  # world <= n_max: the only world is 2 (a constant keeps the model small)
        world = Const(2, len(dut.world))
    m.d.comb += [
        dut.rank.eq(rank), dut.world.eq(world), dut.t_b.eq(t_b), dut.alpha_q8.eq(alpha),
        Assume(world >= 2), Assume(world <= n_max), Assume(rank < world),
        Assume(t_b >= 1), Assume(alpha >= 1), Assume(alpha <= 256),
        # the tick contract (hw/deadline.py, "Ticks"): t_B < 2^(tick bits - 4)
        Assume(t_b < (1 << (len(dut.now) - 4))),
    ]  # fmt: skip

    # ---- time --------------------------------------------------------------------------
    tick = AnySeq(1)
    m.d.comb += dut.tick.eq(tick)
    if prop == "deadline":
        gap = settle_cycles(n_ctx) + TICK_GAP
        since = Signal(range(gap + 1), init=gap)
        m.d.sync += since.eq(Mux(tick, 0, Mux(since == gap, gap, since + 1)))
        m.d.comb += Assume(~tick | (since >= gap - 1))

    # ---- streams: free, with the valid/ready rule --------------------------------------
    def stream_in(s):
        pl = s.payload.as_value()
        m.d.comb += [s.valid.eq(AnySeq(1)), pl.eq(AnySeq(len(pl)))]
        pv, pr, pp = Signal(), Signal(), Signal(len(pl))
        m.d.sync += [pv.eq(s.valid), pr.eq(s.ready), pp.eq(pl)]
        m.d.comb += Assume(~(pv & ~pr) | (s.valid & (pl == pp)))

    stream_in(dut.ev)
    # op ids 0..n_ops-1 only: the high bits are constant zero (so the solver does not carry
    # 32-bit op compares; the assumption below says the same)
    m.d.comb += dut.ev.payload.op_id.eq(AnySeq(_bits(n_ops)))
    stream_in(dut.i)
    m.d.comb += dut.o.ready.eq(AnySeq(1))

    # ---- the contract on events ---------------------------------------------------------
    e = dut.ev.payload
    op_len = [AnyConst(len(e.op_len)) for _ in range(n_ops)]
    for o in range(n_ops):
        m.d.comb += [Assume(op_len[o] >= 1), Assume(op_len[o] <= p.c)]

    def n_packets(length):  # packets_for(op_len)
        return ((length + p.b - 1) >> p.log2_b) << (p.log2_b - (p.p.bit_length() - 1))

    def owned(idx, length):  # checks 25 and 26 for a scatter (and the packetizer for OWN)
        return (idx < n_packets(length)) & ((idx % world) == rank)

    started = [Signal(name=f"started{o}") for o in range(n_ops)]
    own_seen = [[Signal(name=f"own_seen{o}_{i}") for i in range(npk)] for o in range(n_ops)]
    v = dut.ev.valid
    is_sc, is_own = e.kind == Kind.SCATTER, e.kind == Kind.OWN
    is_ga, is_start = e.kind == Kind.GATHER, e.kind == Kind.START
    m.d.comb += [
        Assume(~v | (e.op_id < n_ops)),
        Assume(~v | ~(is_sc | is_ga) | ((e.sender < world) & (e.sender != rank))),
        Assume(~v | ~is_sc | (e.t_c >= 1)),
        Assume(~v | ~is_own | owned(e.pkt_index, e.op_len)),
    ]
    # (the out-of-range check relaxes 25/26 for scatter frames to show that the block
    # relies on the parser for them)
    if variant != "no_parser":
        m.d.comb += Assume(~v | ~is_sc | owned(e.pkt_index, e.op_len))
    for o in range(n_ops):
        this = v & (e.op_id == o)
        m.d.comb += [
            Assume(~this | (e.op_len == op_len[o])),
            Assume(~this | ~is_start | ~started[o]),
        ]
        # OWN after START; the overflow check also lets OWN come before it (a superset of
        # the contract: the order plays no part in a sum, and it keeps the check short)
        if prop != "overflow":
            m.d.comb += Assume(~this | ~is_own | started[o])
        for i in range(npk):
            m.d.comb += Assume(~this | ~is_own | (e.pkt_index != i) | ~own_seen[o][i])

    # ---- shadow: events taken, ends, contributors ---------------------------------------
    hs = dut.ev.valid & dut.ev.ready
    ended = [Signal(name=f"ended{o}") for o in range(n_ops)]
    ended_now = [ended[o] | (dut.end_valid & (dut.end_op == o)) for o in range(n_ops)]
    for o in range(n_ops):
        m.d.sync += ended[o].eq(ended_now[o])
    # seen[o][i]: bitmap of distinct contributors (own = rank) accepted for slot i of op o
    seen = [[Signal(n_max, name=f"seen{o}_{i}") for i in range(npk)] for o in range(n_ops)]

    def pick(rows, op, idx):
        out = Const(0, len(rows[0][0]))
        for o in range(n_ops):
            for i in range(npk):
                out = Mux((op == o) & (idx == i), rows[o][i], out)
        return out

    def pick1(vec, op):
        out = Const(0, len(vec[0]))
        for o in range(n_ops):
            out = Mux(op == o, vec[o], out)
        return out

    who = Mux(is_own, rank, e.sender)
    e_seen = pick(seen, e.op_id, e.pkt_index)
    e_late = pick1(ended_now, e.op_id)
    e_dup = is_sc & e_seen.bit_select(who, 1)
    accept = is_own | (is_sc & ~e_late & ~e_dup)

    cur = Signal(e.shape())  # the event being handled
    cur_acc = Signal()
    hb = Signal(bb + 1)  # payload beats taken since the event
    h_rx, h_dup, h_late = Signal(8), Signal(8), Signal(8)
    with m.If(hs):
        m.d.sync += [cur.eq(e), cur_acc.eq(accept), hb.eq(0)]
        with m.If(is_sc):
            m.d.sync += [
                h_rx.eq(h_rx + accept),
                h_late.eq(h_late + e_late),
                h_dup.eq(h_dup + (~e_late & e_dup)),
            ]
        for o in range(n_ops):
            with m.If(e.op_id == o):
                with m.If(is_start):
                    m.d.sync += started[o].eq(1)
                for i in range(npk):
                    with m.If(e.pkt_index == i):
                        with m.If(accept):
                            m.d.sync += seen[o][i].eq(seen[o][i] | (Const(1, n_max) << who))
                        with m.If(is_own):
                            m.d.sync += own_seen[o][i].eq(1)
    i_hs = dut.i.valid & dut.i.ready
    with m.If(i_hs):
        m.d.sync += hb.eq(hb + 1)

    cur_ctx = cur.op_id[:cb]
    cur_row = (cur.pkt_index // world)[:rb]
    cur_mask = pick(seen, cur.op_id, cur.pkt_index)

    if prop == "overflow":
        # (1) one symbolic element: the exact sum of what was accepted for it
        w_op, w_idx, w_beat = AnyConst(range(n_ops)), AnyConst(range(npk)), AnyConst(bb)
        m.d.comb += [
            Assume(w_op < n_ops),
            Assume(w_idx < npk),
            Assume(w_beat < beats),
            Assume(w_idx % world == rank),
        ]  # an owned slot (others share its row)
        w_addr = Cat(w_beat, (w_idx // world)[:rb], w_op[:cb])
        ssum = Signal(signed(w_acc + 4))
        hit = (cur.op_id == w_op) & (cur.pkt_index == w_idx) & (hb == w_beat)
        with m.If(i_hs & cur_acc & hit):
            m.d.sync += ssum.eq(ssum + dut.i.payload.data[0].as_signed())
        lo, hi = -(1 << (w_acc - 1)), (1 << (w_acc - 1)) - 1
        wr = acc_wr.en & (acc_wr.addr == w_addr)
        m.d.comb += [
            Assert(~wr | ((ssum >= lo) & (ssum <= hi))),
            Assert(~wr | (acc_wr.data.as_signed() == ssum)),
        ]

    if prop == "range":
        # (2) every accumulator write is a beat of an accepted, owned, in-range packet,
        # at that packet's own slot; every bitmap write is the clear of the context being
        # claimed or the slot of the accepted packet
        exp_v = i_hs & cur_acc & ((cur.kind == Kind.SCATTER) | (cur.kind == Kind.OWN))
        exp_addr = Cat(hb[:bb], cur_row, cur_ctx)
        for d in range(mod.Aggregator.ACC_WRITE_DELAY):  # the write's pipeline
            v, a = Signal(name=f"exp_v{d}"), Signal(len(acc_wr.addr), name=f"exp_addr{d}")
            m.d.sync += [v.eq(exp_v), a.eq(exp_addr)]
            exp_v, exp_addr = v, a
        cur_owned = owned(cur.pkt_index, cur.op_len)
        bm_ctx, bm_row = bm_wr.addr[rb:], bm_wr.addr[:rb]
        bm_data = bm_wr.data.as_value()
        m.d.comb += [
            Assert(acc_wr.en == exp_v),
            Assert(~acc_wr.en | (acc_wr.addr == exp_addr)),
            Assert(~acc_wr.en | cur_owned),
            Assert(~bm_wr.en | (bm_ctx == cur_ctx)),
            Assert(~bm_wr.en | (bm_data == 0) | ((bm_row == cur_row) & cur_acc & cur_owned)),
        ]

    if prop == "duplicate":
        # (3) whenever the block writes a slot's bitmap, it holds exactly the distinct
        # contributors the contract accepted for it and its count is their number; the
        # readout's count is that number; and, whenever the block is idle, it has counted
        # exactly the harness's accepted frames, duplicates and late frames
        row_write = bm_wr.en & (bm_wr.data.as_value() != 0)
        # the counters are settled when the block is idle, and from the payload on
        settled = dut.ev.ready | dut.i.ready
        rx = h_rx
        m.d.comb += [
            Assert(~row_write | (bm_wr.data.count == _popcount(cur_mask, n_max))),
            Assert(~row_write | (bm_wr.data.bits == cur_mask)),
            Assert(
                ~(dut.o.valid & (dut.o_op < n_ops))
                | (dut.o_count == _popcount(pick(seen, dut.o_op, dut.o_index), n_max))
            ),
            Assert(~settled | (dut.cnt_rx == rx)),
            Assert(~settled | (dut.cnt_duplicate == h_dup)),
            Assert(~settled | (dut.cnt_late == h_late)),
        ]

    if prop == "deadline":
        # (4) the block takes each tick within TAKE_BOUND cycles; an active phase whose
        # deadline max(start + T, floor) has passed ends within BOUND cycles once the
        # block's clock has caught up with the ticks (not counting, in either, cycles
        # spent waiting for a payload beat); the end tick it reports is never after its
        # deadline nor in the future. The block takes a pending tick before it fires a
        # due phase, so a phase due at an earlier tick waits for the ticks that came
        # during an event (its end is the rule's tick, not the clock's)
        waiting = dut.i.ready & ~dut.i.valid
        came = Signal(len(dut.now))  # ticks that came (tick0 = 0)
        m.d.sync += came.eq(came + tick)
        caught_up = dut.now == came
        behind = Signal(8)  # cycles since the block's clock last moved, while behind
        now_q = Signal(len(dut.now))
        m.d.sync += [
            now_q.eq(dut.now),
            behind.eq(Mux(caught_up | (dut.now != now_q), 0, behind + ~waiting)),
        ]
        m.d.comb += Assert(behind < TAKE_BOUND)
        start = [Signal(len(dut.now), name=f"start{o}") for o in range(n_ops)]
        with m.If(hs & is_start):
            for o in range(n_ops):
                with m.If(e.op_id == o):
                    m.d.sync += start[o].eq(dut.now)
        floor_q = Signal(len(tc.floor))
        m.d.sync += floor_q.eq(tc.floor)
        for o in range(n_ops):
            dl = Signal(len(dut.now) + 1, name=f"deadline{o}")
            a = start[o] + dut.timeout
            m.d.comb += dl.eq(Mux(a > tc.floor, a, tc.floor))
            over = Signal(8, name=f"overdue{o}")
            active = started[o] & ~ended_now[o]
            with m.If(active & (dut.now >= dl) & ~tc.busy & caught_up):
                m.d.sync += over.eq(over + ~waiting)
            with m.Else():
                m.d.sync += over.eq(0)
            m.d.comb += Assert(over < DEADLINE_BOUND)
            a_end = start[o] + dut.end_timeout
            dl_end = Mux(a_end > floor_q, a_end, floor_q)
            claim = dl_end
            fired = dut.end_valid & (dut.end_op == o)
            m.d.comb += [
                Assert(~fired | started[o]),
                Assert(~fired | (dut.end_tick <= claim)),
                Assert(~fired | (dut.end_tick <= dut.now)),
                Assert(~fired | (dut.end_tick >= start[o])),
            ]
    return m


# A started phase past its deadline ends within DEADLINE_BOUND cycles: the rest of the
# event in progress, then the settle count and the three states of an end. The worst case
# by hand, with the control registered a state ahead (settle 11 with a timer per context;
# 14 with one timer of five stages over the four contexts, 11 with two stages; the bound
# was set at 14 and kept): the t_C estimator goes idle in a scatter
# frame's peer scan, then the scan's rest, LATE, ROW_*, the payload, POST (SETTLE), IDLE
# and FIRE x 3, about 28-30 cycles (the count restarts while the estimator is busy). 30
# fails at depth 60 (it held at 54 with a timer per context), 33 at 63; 36 holds at 63
# (34 and 35 were not tried). It is well under one
# real tick (52 cycles at the boards' 52.08 MHz core clock), so a phase still ends in the
# microsecond of its deadline.
DEADLINE_BOUND = 36
# A tick waits for the event in progress, the ends it made due (POST, FIRE x 3 each) and
# their settle count: it is taken within one real tick (52 cycles at 52.08 MHz), so
# ticks never pile up at the real rate
TAKE_BOUND = 52
# Unloaded, each solve takes 5-250 s; alone on a loaded machine the deadline pair took 335 s
# and 599 s, and beside the rest of the suite on 2 cores one passed 900 s: room for that.
SOLVE_TIMEOUT_S = 1800
# two solver queues, and room; `make deep` (alone: 10-15 min of both cores, over half of
# make test's budget beside the suite, where it took 34 min)
pytestmark = [pytest.mark.timeout(2 * SOLVE_TIMEOUT_S + 300), pytest.mark.deep]
# Props that do not depend on when a phase ends: the PhaseTimer and the t_C estimator are
# replaced by free outputs (yosys cutpoint), an over-approximation.
CUT_TIMING = ("overflow", "range", "duplicate")
PROPS = ("overflow", "range", "duplicate", "deadline")
# Bounds (cycles from reset). An event costs about 33 cycles here (the control is
# registered a state ahead and the end evaluation pipelined: hw/deadline.py settle_cycles),
# the first one of an op more (context claim): 51 reaches the accumulation of a second
# contribution (at world = 2 the own one; the overflow check lets OWN come before START,
# so an OWN may claim the context: on a trace of the contract the second contribution
# needs a START first, its mutant was refuted only at 70, and that check ran past 40 min;
# in the contract's order the sums are checked bit for bit by tests/hw/test_aggregator.py
# and the replays, as is the readout's wait for the own packets, which no property here
# covers),
# 53 a second frame from the same sender (the duplicate mutant needs it),
# 63 a phase ended by its deadline a few ticks after START, with a second op's context
# claim on the way. Each mutant is refuted at its depth; with a timer per context (settle
# 11) the least depths were 48, 50 and 54, and 60 does not refute the deadline mutant now
# (a larger DEADLINE_BOUND lets its late end run longer before it shows).
# The range mutant is refuted from 21 (the first payload's writes); its check runs to 44,
# to take more events in at little cost.
DEPTH = {"overflow": 51, "range": 44, "duplicate": 53, "deadline": 63}


# A mutant per property: the aggregator's own source with one deliberate bug (see
# sim/formal_harness.py: mutant). Each must be refuted, which shows the check catches it.
MUTANTS = {
    "overflow": (  # accumulators of w_wire bits: the sum of two contributions can wrap
        {"w_acc, lanes = p.w_acc, p.lanes": "w_acc, lanes = p.w_wire, p.lanes"}
    ),
    "range": (  # payload written at row pkt_index mod rows (not pkt_index // world)
        {"Cat(beat, row, c)": "Cat(beat, s.ev.pkt_index[: s.rb], c)"}
    ),
    "duplicate": (  # no bitmap check: a second frame from the same sender is added again
        {"& (bm_q.bits & who_bit).any()),": "& (bm_q.bits & who_bit).any() & 0),"}
    ),
    "deadline": (  # the deadline anchored one tick after START
        {"*s.cx.begin(c, ev_now, ev_now),": "*s.cx.begin(c, ev_now, ev_now + 1),"}
    ),
}
# (prop, variant): "holds" must pass; "mutant" and "no_parser" (the range check without
# the parser's checks 25/26 in the contract: the block relies on them) must fail.
CHECKS = [(prop, "holds") for prop in PROPS] + [(prop, "mutant") for prop in PROPS]
CHECKS.append(("range", "no_parser"))


class _Top(Component):
    def __init__(self, prop: str, variant: str, mod) -> None:
        self.prop, self.variant, self.mod = prop, variant, mod
        super().__init__({"dummy": In(1)})

    def elaborate(self, platform):
        return harness(self.prop, self.variant, self.mod)


def prepare(prop: str, variant: str = "holds", depth: int | None = None):
    """Convert one check and write its solver script."""
    name = f"agg_{prop}" + ("" if variant == "holds" else f"_{variant}")
    script = ""
    if prop in CUT_TIMING:
        script += f"cutpoint {name}.dut/c:timer {name}.dut/c:tc\n"  # cells, not wires
    if prop in ("range", "duplicate"):  # the sums play no part: cut the accumulators
        script += f"cutpoint {name}.dut/acc\n"
    mod = mutant(aggregator.__name__, MUTANTS[prop]) if variant == "mutant" else aggregator
    return prepare_sat_bmc(_Top(prop, variant, mod), name, depth or DEPTH[prop], script)


def _solve(d):
    t0 = time.monotonic()
    try:
        solve_sat_bmc(d, timeout_s=SOLVE_TIMEOUT_S)
        verdict = "PASS"
    except AssertionError as e:
        verdict = str(e)
    return verdict, time.monotonic() - t0


def test_aggregator_properties_hold_and_catch_their_mutants():
    """Every check of this file in one test, so that `pytest -n 2` runs the set once: each
    check is converted one by one, then solved two at a time (the solver is
    single-threaded, the machine has two cores). Every property must hold on the
    aggregator; every mutant, and the range check without the parser's checks, must fail."""
    jobs = {k: prepare(*k) for k in CHECKS}
    order = sorted(jobs, key=lambda k: -DEPTH[k[0]])  # the longest first
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(_solve, jobs[k]) for k in order}
        out = {k: f.result() for k, f in futures.items()}
    wrong = []
    for (prop, variant), (verdict, secs) in out.items():
        first = verdict.splitlines()[0][:70]
        print(f"{prop} ({variant}): depth {DEPTH[prop]}, {secs:.1f} s, {first}")
        if variant == "holds" and verdict != "PASS":
            wrong.append(f"{prop} does not hold: {verdict}")
        if variant == "mutant" and "FAIL" not in verdict:
            wrong.append(f"the {prop} mutant {MUTANTS[prop]} was not refuted: {verdict}")
        if variant == "no_parser" and "FAIL" not in verdict:
            wrong.append(f"range without checks 25/26 was not refuted: {verdict}")
    assert not wrong, "\n".join(wrong)
