"""Phase 2 at every receiver: which gather packets count, and when the gather phase ends.

Models, for phase 2 only, what `host/model/nic_model.py: NicModel` does with each op's
`p2` (`host/model/deadline.py: PhaseTracker`), the phase-2 `TcEstimator` and
`agreed_timeout` (hw/tc_estimator.py, a second instance), the gather duplicate and
late drops of `_accept`, the peers-gone rule of `_peer_progress` and the end of
`_end_phase2`. The payloads are the gather buffer's business (hw/gather_buffer.py):
this block says which packets it may write (`verdict`), and when an op's phase 2 is
over (`end_*`, then the top drains the buffer).

Expected packets of op j from rank s: the slots s owns, len(range(s, n_packets, N))
= q + (s < rem) with (q, rem) = divmod(n_packets, N), none from this rank (it placed
its own means). A packet of op j from rank s (scatter or gather) proves s finished
every op <= j - K: what s still owes those ops will never come.

Events. One ordered stream `ev`; each event carries `at`, the tick at which the
model handles it. Before it takes an event the block advances its clock `now` to
`at` (NicModel.advance: every phase due on the way ends, earliest (end tick, op id)
first); with no event waiting it advances to the `time` input. Kinds:

  GATHER     a gather frame that passed checks 1-28 (docs/protocol.md): sender,
             op_id, op_len, pkt_index, last, t_c. The sender's phase-2 t_C enters the
             table, peer progress, then late (phase 2 over) / duplicate (slot already
             in) / accepted: one `verdict_valid` strobe, then the op's phase 2 ends if due
  SCATTER    a scatter frame that passed checks 1-28: only sender, op_id (peer progress)
  START      the host starts op_id (op_len): makes the op's context, if no frame did
  PHASE1_END the aggregator ended phase 1 of op_id at tick `at`; `p1_start` is the op's
             start tick and `t1` the phase-1 T in force then (aggregator `end_timeout`).
             Phase 2 begins at `at`, anchored at max(at, p1_start + t1).

Every event names op_id and op_len (the op's context is made from them if absent).

Ordering contract (the top's job): events in the model's order, `at` non-decreasing,
a PHASE1_END stamped with its end tick; `time` never ahead of a phase-1 end not yet
on `ev`. With the aggregator: stamp frames and STARTs with the aggregator's `now`
when it takes them, push its end strobes as PHASE1_END in the same FIFO, and drive
`time` with the aggregator's `now` of the last cycle its `ev.ready` was high (then
every phase-1 end up to that tick is already in the FIFO). A frame whose `at` is
below `now` is handled at `now`.

Exact but for one corner the block cannot see: at one tick, the model ends the
phases of the ops its advance() and _peer_progress() walk in its own order (op id, or
dict order), ending a phase 2 that is over at its very begin in between; here such
ends (they never give a t_C sample, so T and every other result are the same) may
come in another order within that tick.

Outputs: `verdict_valid` (one cycle per GATHER) with `verdict` (ACCEPT, DUPLICATE,
LATE), `verdict_op`, `verdict_index`; `end_valid` (one cycle per phase-2 end) with
op, reason, end tick, T at the end, received/expected packets (OpStats.phase2_*,
p2_received/p2_expected); `own_tc` (this node's phase-2 t_C: what its gather frames
carry), `timeout` (the live phase-2 T); counters rx_gather / duplicate / late for
gather frames.

Not done here (documented gaps): NicModel.exclude (a dead peer reported by the
driver) and the start-time purge of an op whose peers used another exponent or
length (start_op); the top must do them or they stay with the host.

Structure: one FSM; per-op contexts in registers (n_ctx = smallest power of two
>= 2K, op j in context j mod n_ctx), a per-sender table (rcv, flagged, gone) and a
slot bitmap in memories, both cleared when an op claims its context. For 125 MHz the
FSM's decisions are registered a state before their use, and the memories' outputs and
writes are registered (docs/gateware.md, "Timing").
"""

from __future__ import annotations

import enum

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.host.model.nic_model import NicModel
from optireduce.hw.deadline import TICK_BITS, PhaseContexts, Reason, settle_cycles, settle_step
from optireduce.hw.staged_write import StagedWrite
from optireduce.hw.tc_estimator import TC_BITS, TcEstimator
from optireduce.params import NicParams


class Kind(enum.IntEnum):
    GATHER = 0
    SCATTER = 1
    START = 2
    PHASE1_END = 3


class Verdict(enum.IntEnum):
    ACCEPT = 0
    DUPLICATE = 1
    LATE = 2


def event_layout(p: NicParams) -> data.StructLayout:
    return data.StructLayout(
        {
            "kind": Kind,
            "op_id": 32,
            "op_len": range(p.c + 1),
            "sender": range(p.n_max),
            "pkt_index": range(p.c // p.p),
            "last": 1,
            "t_c": TC_BITS,
            "at": TICK_BITS,
            "p1_start": TICK_BITS,
            "t1": 32,
        }
    )


def _bits(n: int) -> int:
    """Bits to index n items (at least 1)."""
    return max(1, (n - 1).bit_length())


class GatherTracker(wiring.Component):
    """Receiver-side phase 2 of up to n_ctx ops in flight (see the module docstring).

    LATENCY: cycles from taking a GATHER event (ev.valid & ev.ready) to its verdict
    strobe, no context to claim and no phase due: n_ctx + 9 (13 at K = 2); the next
    event is taken after the end evaluation settles (deadline.settle_cycles) and its picks
    (about 2 n_ctx + 15 cycles per event). The first event of an
    op claims its context: max(n_max, c/p) + about 10 cycles more.
    MODEL: host/model/nic_model.py NicModel phase 2 (_accept, _peer_progress, _end_phase2).
    """

    MODEL = NicModel  # phase 2: p2, tc[1], _peer_progress

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.n_ctx = 1 << _bits(p.rx_window)
        self.npk_max = p.c // p.p
        self.own_max = -(-self.npk_max // 2)  # world >= 2
        self.LATENCY = self.n_ctx + 9
        super().__init__(
            {
                # configuration (static while ops run)
                "rank": In(range(p.n_max)),
                "world": In(range(p.n_max + 1)),
                "t_b": In(32),
                "alpha_q8": In(9),
                # time: the latest tick the block may advance to
                "time": In(TICK_BITS),
                "now": Out(TICK_BITS),
                "ev": In(stream.Signature(event_layout(p))),
                # per gather packet
                "verdict_valid": Out(1),
                "verdict": Out(Verdict),
                "verdict_op": Out(32),
                "verdict_index": Out(range(self.npk_max)),
                # phase ends
                "end_valid": Out(1),
                "end_op": Out(32),
                "end_reason": Out(Reason),
                "end_tick": Out(TICK_BITS),
                "end_timeout": Out(32),
                "end_received": Out(range(self.npk_max + 1)),
                "end_expected": Out(range(self.npk_max + 1)),
                # status
                "timeout": Out(32),
                "own_tc": Out(TC_BITS),
                "cnt_rx": Out(32),
                "cnt_duplicate": Out(32),
                "cnt_late": Out(32),
            }
        )

    def elaborate(self, platform):
        p = self.p
        m = Module()
        n_ctx, n_max, npk = self.n_ctx, p.n_max, self.npk_max
        cb, sb, ib = _bits(n_ctx), _bits(n_max), _bits(npk)
        K = p.ops_in_flight
        n_cnt = range(n_max + 1)
        tot = range(npk + 1)

        now = Signal(TICK_BITS)
        m.d.comb += self.now.eq(now)

        # ---- t_C and T of phase 2 -----------------------------------------------------
        m.submodules.tc = tc = TcEstimator(p)
        m.d.comb += [tc.world.eq(self.world), tc.rank.eq(self.rank), tc.t_b.eq(self.t_b)]
        m.d.comb += self.own_tc.eq(tc.own_tc)

        # ---- per-op contexts ------------------------------------------------------------
        cx = PhaseContexts(n_ctx, tot, n_cnt)
        (c_valid, c_begun, c_ended, c_op, c_start, c_anchor, c_has_arr, c_last_arr,
         c_last_gone, c_recv, c_exp, c_unflag, c_owing) = cx.fields()  # fmt: skip
        # divmod(n_packets, world)
        c_q = Array(Signal(tot, name=f"q{k}") for k in range(n_ctx))
        c_rem = Array(Signal(n_cnt, name=f"rem{k}") for k in range(n_ctx))

        # per-context end evaluation, registered (the FSM settles after a change)
        T, due, due_end, due_reason = cx.evaluate(m, tc, self.alpha_q8, now)
        m.d.comb += self.timeout.eq(T)

        # ---- memories: per-sender state and the slot bitmap, per context ------------------
        peer_layout = data.StructLayout({"rcv": range(self.own_max + 1), "flagged": 1, "gone": 1})
        m.submodules.peers = pm = Memory(shape=peer_layout, depth=n_ctx << sb, init=[])
        pm_rd = pm.read_port()
        pm_wr = StagedWrite(m, pm.write_port(), "peers")
        m.submodules.have = hv = Memory(shape=1, depth=n_ctx << ib, init=[])
        hv_rd = hv.read_port()
        hv_wr = StagedWrite(m, hv.write_port(), "have")

        # ---- the event being handled ----------------------------------------------------
        ev = Signal(event_layout(p))
        ev_now = Signal(TICK_BITS)
        c = Signal(cb)
        m.d.comb += c.eq(ev.op_id[:cb])

        cnt_rx, cnt_dup, cnt_late = Signal(32), Signal(32), Signal(32)
        m.d.comb += [
            self.cnt_rx.eq(cnt_rx),
            self.cnt_duplicate.eq(cnt_dup),
            self.cnt_late.eq(cnt_late),
        ]
        m.d.sync += [self.end_valid.eq(0), self.verdict_valid.eq(0)]

        # divider (restoring, one quotient bit per cycle): n_packets divmod world
        qbits = _bits(npk + 1)
        div_num = Signal(qbits)
        div_rem = Signal(qbits + 1)
        div_q = Signal(qbits)
        div_k = Signal(range(qbits + 1))
        div_busy = Signal()

        n_pk = Signal(range(npk + 1))
        m.d.comb += n_pk.eq(
            ((ev.op_len + (p.b - 1)) >> p.log2_b) << (p.log2_b - (p.p.bit_length() - 1))
        )

        with m.If(div_busy):
            rem2 = Cat(div_num[qbits - 1], div_rem[:qbits])
            ge = rem2 >= self.world
            m.d.sync += [
                div_rem.eq(Mux(ge, rem2 - self.world, rem2)),
                div_q.eq(Cat(ge, div_q[: qbits - 1])),
                div_num.eq(div_num << 1),
                div_k.eq(div_k - 1),
            ]
            with m.If(div_k == 1):
                m.d.sync += div_busy.eq(0)

        # facts of the event, each registered a state before its use (125 MHz): which
        # contexts hold its op, the packets of its op, the ops its sender is done with
        # (op <= op_id - K), what the sender owes
        hits, done = cx.event_registers()
        n_pk_r = Signal(range(npk + 1))
        peer_hit = Signal(n_ctx)  # ... and the sender still owes it packets: gone_hit
        me = Signal()  # the sender is this rank
        q_e, lt_e = Signal(tot), Signal()  # the event's context: q, sender < rem
        exp_e = Signal(range(self.own_max + 1))  # packets it expects from the sender
        p1_anchor = Signal(TICK_BITS + 1)  # a PHASE1_END's p1_start + t1

        def expected(q, lt):
            """Packets a context expects from the sender, from its registered q and
            sender < rem: q + (sender < rem), none from this rank (NicModel)."""
            return Mux(me, 0, q + lt)

        # selection of the next phase to end: by (end tick, op) among the due, or by op
        # among the due ops <= ev.op_id - K (the ones the event's sender is done with)
        idle_found, idle_pick, post_found, post_pick = cx.picks(m, due, due_end, done)

        fire_c = Signal(cb)
        ret_post = Signal()
        # cycles the end evaluation has been stable: T, idle, the timer stage, due
        settle_n = settle_cycles(n_ctx)
        settle = Signal(range(settle_n + 1))
        settled = settle == settle_n
        post_b = Signal()  # the older ops are done; next, the event's own op
        accepted = Signal()
        gone_c = Signal(range(n_ctx + 1))
        n_clear = max(n_max, npk)
        clr = Signal(range(n_clear + 1))
        target = Signal(TICK_BITS)
        m.d.comb += target.eq(Mux(self.ev.valid, self.ev.payload.at, self.time))

        with m.FSM() as fsm:
            with m.State("IDLE"):
                # the event's registers load in every IDLE cycle (as in the aggregator)
                m.d.sync += [ev.eq(self.ev.payload), ev_now.eq(now), post_b.eq(0), accepted.eq(0)]
                with m.If(idle_found):
                    m.d.sync += [fire_c.eq(idle_pick), ret_post.eq(0)]
                    m.next = "FIRE"
                with m.Elif(now < target):
                    # NicModel.advance(target): ends come out in (end tick, op) order
                    m.d.sync += [now.eq(target), settle.eq(0)]
                    m.next = "SETTLE"
                with m.Elif(self.ev.valid):
                    m.next = "HIT"

            with m.State("HIT"):
                cx.take_event(m, ev.op_id, K)
                m.d.sync += [
                    n_pk_r.eq(n_pk),
                    me.eq(ev.sender == self.rank),
                    p1_anchor.eq(ev.p1_start + ev.t1),
                ]
                m.next = "LOOKUP"

            with m.State("LOOKUP"):
                with m.If(~hits.bit_select(c, 1)):
                    # claim the context: the op it held is done (the receive window)
                    m.d.sync += [
                        c_valid[c].eq(1),
                        c_op[c].eq(ev.op_id),
                        c_begun[c].eq(0),
                        c_ended[c].eq(0),
                        c_has_arr[c].eq(0),
                        c_last_arr[c].eq(0),
                        c_last_gone[c].eq(0),
                        c_start[c].eq(0),
                        c_anchor[c].eq(0),
                        c_recv[c].eq(0),
                        clr.eq(0),
                        div_num.eq(n_pk_r),
                        div_rem.eq(0),
                        div_k.eq(qbits),
                        div_busy.eq(1),
                    ]
                    m.next = "CLEAR"
                with m.Else():
                    m.next = "DISPATCH"

            with m.State("CLEAR"):
                m.d.sync += [
                    pm_wr.addr.eq(Cat(clr[:sb], c)),
                    pm_wr.en.eq(clr < n_max),
                    pm_wr.data.eq(0),
                    hv_wr.addr.eq(Cat(clr[:ib], c)),
                    hv_wr.en.eq(clr < npk),
                    hv_wr.data.eq(0),
                ]
                m.d.sync += clr.eq(clr + 1)
                with m.If(clr == n_clear - 1):
                    m.next = "EXPECT"

            own = Signal(tot)
            nsend = Signal(n_cnt)
            with m.State("EXPECT"), m.If(~div_busy):
                q, rem = div_q, div_rem[:qbits]
                m.d.sync += [
                    c_q[c].eq(q),
                    c_rem[c].eq(rem),
                    own.eq(q + (self.rank < rem)),
                    nsend.eq(Mux(n_pk_r < self.world, n_pk_r, self.world)),
                ]
                m.next = "EXPECT_SET"
            with m.State("EXPECT_SET"):
                senders = nsend - (self.rank < n_pk_r)
                m.d.sync += [
                    c_exp[c].eq(n_pk_r - own),
                    c_unflag[c].eq(senders),
                    c_owing[c].eq(senders),
                ]
                m.next = "DISPATCH"

            # the event's facts over the contexts, all in parallel (registered)
            with m.State("DISPATCH"):
                owes = [(c_q[k] != 0) | (ev.sender < c_rem[k]) for k in range(n_ctx)]
                fin = cx.mark_done(m)
                m.d.sync += [
                    peer_hit.eq(Cat(
                        c_valid[k] & ~c_ended[k] & ~me & owes[k] & fin[k]
                        for k in range(n_ctx)
                    )),
                    q_e.eq(c_q[c]),
                    lt_e.eq(ev.sender < c_rem[c]),
                ]  # fmt: skip
                with m.Switch(ev.kind):
                    with m.Case(Kind.GATHER):
                        m.next = "TC"
                    with m.Case(Kind.SCATTER):
                        m.d.sync += gone_c.eq(0)
                        m.next = "GONE_RD"
                    with m.Case(Kind.START):
                        m.d.sync += settle.eq(0)
                        m.next = "POST"
                    with m.Case(Kind.PHASE1_END):
                        m.d.sync += [
                            c_begun[c].eq(1),
                            c_start[c].eq(ev_now),
                            c_anchor[c].eq(Mux(ev_now < p1_anchor, p1_anchor, ev_now)),
                            settle.eq(0),
                        ]
                        m.next = "POST"

            with m.State("TC"):  # the sender's piggybacked phase-2 t_C
                m.d.sync += exp_e.eq(expected(q_e, lt_e))
                m.d.comb += [
                    tc.update.valid.eq(1),
                    tc.update.payload.rank.eq(ev.sender),
                    tc.update.payload.value.eq(ev.t_c),
                    tc.update.payload.at.eq(ev_now),
                ]
                with m.If(tc.update.ready):
                    m.d.sync += gone_c.eq(0)
                    m.next = "GONE_RD"

            # peer progress: the sender has finished every op <= ev.op_id - K
            gk = gone_c[:cb]
            gone_hit = Signal()
            m.d.comb += gone_hit.eq((gone_c < n_ctx) & peer_hit.bit_select(gk, 1))
            # the sender's expected count, registered a state ahead of its use (125 MHz)
            exp_r = Signal(range(self.own_max + 1))
            exp_z = Signal()  # exp_r == 0
            q_g, lt_g = Signal(tot), Signal()
            # and the memories' outputs registered (a *_REG state) before any logic
            pm_q = Signal(peer_layout)
            hv_q = Signal()
            with m.State("GONE_RD"):
                m.d.comb += pm_rd.addr.eq(Cat(ev.sender[:sb], gk))
                m.d.sync += [q_g.eq(c_q[gk]), lt_g.eq(ev.sender < c_rem[gk])]
                with m.If(gone_c == n_ctx):
                    with m.If(ev.kind == Kind.GATHER):
                        m.next = "LATE"
                    with m.Else():
                        m.d.sync += settle.eq(0)
                        m.next = "POST"
                with m.Elif(gone_hit):
                    m.next = "GONE_REG"
                with m.Else():
                    m.d.sync += gone_c.eq(gone_c + 1)
            with m.State("GONE_REG"):
                m.d.sync += [pm_q.eq(pm_rd.data), exp_r.eq(expected(q_g, lt_g))]
                m.next = "GONE_WR"
            with m.State("GONE_WR"):
                old = pm_q
                with m.If(~old.gone):
                    m.d.sync += [
                        pm_wr.addr.eq(Cat(ev.sender[:sb], gk)),
                        pm_wr.en.eq(1),
                        pm_wr.data.rcv.eq(old.rcv),
                        pm_wr.data.flagged.eq(old.flagged),
                        pm_wr.data.gone.eq(1),
                    ]
                    m.d.sync += c_last_gone[gk].eq(ev_now)
                    with m.If(old.rcv < exp_r):
                        m.d.sync += c_owing[gk].eq(c_owing[gk] - 1)
                m.d.sync += gone_c.eq(gone_c + 1)
                m.next = "GONE_RD"

            with m.State("LATE"):
                m.d.comb += [
                    hv_rd.addr.eq(Cat(ev.pkt_index[:ib], c)),
                    pm_rd.addr.eq(Cat(ev.sender[:sb], c)),
                ]
                # rcv + 1 == exp, as old.rcv == exp - 1 (never when exp is 0)
                m.d.sync += [exp_r.eq(exp_e - 1), exp_z.eq(exp_e == 0)]
                with m.If(c_ended[c]):
                    m.d.sync += [
                        cnt_late.eq(cnt_late + 1),
                        self.verdict_valid.eq(1),
                        self.verdict.eq(Verdict.LATE),
                        self.verdict_op.eq(ev.op_id),
                        self.verdict_index.eq(ev.pkt_index),
                        settle.eq(0),
                    ]
                    m.next = "POST"
                with m.Else():
                    m.next = "SLOT_REG"

            with m.State("SLOT_REG"):
                m.d.sync += [pm_q.eq(pm_rd.data), hv_q.eq(hv_rd.data)]
                m.next = "SLOT"
            with m.State("SLOT"):
                m.d.sync += [
                    self.verdict_valid.eq(1),
                    self.verdict_op.eq(ev.op_id),
                    self.verdict_index.eq(ev.pkt_index),
                    settle.eq(0),
                ]
                with m.If(hv_q):
                    m.d.sync += [cnt_dup.eq(cnt_dup + 1), self.verdict.eq(Verdict.DUPLICATE)]
                with m.Else():
                    old = pm_q
                    rcv1 = old.rcv + 1
                    m.d.sync += [
                        hv_wr.addr.eq(Cat(ev.pkt_index[:ib], c)),
                        hv_wr.en.eq(1),
                        hv_wr.data.eq(1),
                        pm_wr.addr.eq(Cat(ev.sender[:sb], c)),
                        pm_wr.en.eq(1),
                        pm_wr.data.rcv.eq(rcv1),
                        pm_wr.data.flagged.eq(old.flagged | ev.last),
                        pm_wr.data.gone.eq(old.gone),
                    ]
                    m.d.sync += [
                        self.verdict.eq(Verdict.ACCEPT),
                        accepted.eq(1),
                        cnt_rx.eq(cnt_rx + 1),
                        c_recv[c].eq(c_recv[c] + 1),
                        c_last_arr[c].eq(ev_now),
                        c_has_arr[c].eq(1),
                    ]
                    with m.If(ev.last & ~old.flagged):
                        m.d.sync += c_unflag[c].eq(c_unflag[c] - 1)
                    with m.If((old.rcv == exp_r) & ~exp_z & ~old.gone):
                        m.d.sync += c_owing[c].eq(c_owing[c] - 1)
                m.next = "POST"

            # end what the event made due, in the model's order: the ops its sender is done
            # with (_peer_progress, op order), then the event's own op (_progress after an
            # accepted gather frame or the phase-1 end), the rest in IDLE (advance)
            own_due = due[c]  # context c holds the event's op from LOOKUP on
            own_ok = (ev.kind == Kind.PHASE1_END) | ((ev.kind == Kind.GATHER) & accepted)
            peer_ev = (ev.kind == Kind.SCATTER) | (ev.kind == Kind.GATHER)
            with m.State("POST"):
                with m.If(tc.busy):
                    m.d.sync += settle.eq(0)
                with m.Elif(~settled):
                    m.d.sync += settle.eq(settle + 1)
                with m.Elif(~post_b):
                    with m.If(peer_ev & post_found):
                        m.d.sync += [fire_c.eq(post_pick), ret_post.eq(1)]
                        m.next = "FIRE"
                    with m.Else():
                        m.d.sync += post_b.eq(1)
                with m.Elif(own_ok & own_due):
                    m.d.sync += [fire_c.eq(c), ret_post.eq(1)]
                    m.next = "FIRE"
                with m.Else():
                    m.next = "IDLE"

            # an end in three states (125 MHz)
            cx.end_states(m, self, tc, T, fire_c, due_end, due_reason, settle, ret_post)

            # the evaluation catches up
            with m.State("SETTLE"), m.If(settle_step(m, settle, tc, settle_n)):
                m.next = "IDLE"

        m.d.comb += self.ev.ready.eq(
            fsm.ongoing("IDLE") & ~idle_found & (now >= self.ev.payload.at)
        )
        return m
