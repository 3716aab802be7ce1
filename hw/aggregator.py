"""Phase 1 at the owner: accumulate the scatter packets, end the phase, emit the means.

Models, for phase 1 only, what `host/model/nic_model.py: NicModel` does with
`host/model/aggregator.py: Aggregator` (sum, count, bitmap, duplicates; the mean through
`reciprocal_table` / `mean_by_reciprocal`), `host/model/deadline.py: PhaseTracker`
(hw/deadline.py) and the phase-1 `TcEstimator` + `agreed_timeout` (hw/tc_estimator.py).

Events. The model is a sequence of calls, each with a tick; the block takes the
same sequence on one event stream `ev`, each event stamped with `now` when it is
taken (the NIC top merges the parser's accepted frames and the host's commands
into it, so their order is explicit):

  SCATTER  a peer's scatter frame that passed checks 1-28 (docs/protocol.md):
           header fields on `ev`, then P elements on `i`
  GATHER   a gather frame that passed checks 1-28: only its (sender, op_id),
           which says the sender is done with ops <= op_id - K (peer progress)
  OWN      one owned packet of this node's own chunk (from the packetizer), then
           P elements on `i`; the OWN packets of an op come before its START
  START    the host starts op_id (op_len): phase 1 begins at `now`
           (= NicModel.start_op: own contributions added, then begin)

Ticks. `tick` is a one-cycle strobe per microsecond. `now` counts the strobes the
block has applied. An event taken by the block has tick `now`: it is the model's
call at that tick. Strobes that arrive while the block is busy are counted and
applied in order before the next event: `now` may lag the strobes by a few ticks
during a long stall, and the event order (hence every result) is the same as if it
had not. Phases end in the model's order, because the order of the t_C samples
changes the EWMA:
  - before an event, and at every applied tick, every phase due at `now`, earliest
    (end tick, op id) first (NicModel.advance);
  - after a SCATTER or GATHER event, first the phases of ops <= op_id - K that are
    due (NicModel._peer_progress; op-id order stands for the model's dict order),
    then the event's own op if due, after an accepted scatter frame, a gather
    frame or a START (NicModel._progress). A frame at a tick where a timer is due
    comes after that timer, as in the model.
Exact except two corners the block cannot see: the model's _peer_progress walks
ops in creation order (a peer frame can create op j + 1 before op j), and it skips
_progress after a gather frame that is late or a duplicate in phase 2 (the gather
buffer's business). Both matter only if two phases end at the same tick.

Outputs. When phase 1 of an op ends: one `end_valid` strobe with op id, reason,
end tick, the T in force, and received/expected packet counts (the model's
OpStats.phase1_*), then the op's owned slots in index order on `o` (P elements
each, first/last per slot) with `o_op`, `o_index`, `o_count` (contributors,
own included) valid on every beat. Counters `cnt_rx`, `cnt_duplicate`, `cnt_late`
are the model's rx_scatter / duplicate / late for scatter frames.

Structure. One control FSM owns the per-op contexts (registers), the per-sender
table (BRAM) and the slot bitmaps (BRAM) and handles one event at a time; the
accumulators are one BRAM of w_acc-bit lanes, read-modify-written at one beat per
cycle. A readout engine streams the means of an ended op through the reciprocal
multiplier. Nothing is cleared after a readout: an op that claims a context clears
its per-sender entries and slot bitmaps (max(n_max, slots) cycles), and the first
contribution to a slot overwrites its accumulator (so a reset needs no memory
clear either). The accumulator and bitmap memories have one read and one write
port each, so the FSM takes no event while a readout is pending; ticks and timers
still run during a readout. The readout emits one beat per cycle within a slot and
spends two cycles between slots on the contributor count. For 125 MHz the FSM's
decisions are registered a state before their use, and the memories' outputs and
writes are registered (docs/gateware.md, "Timing").

Contexts: the smallest power of two >= NicParams.rx_window (2K), op j in context
j mod n_ctx. The receive window [base, base + 2K) guarantees that the op a context
held before is done when a newer op claims it.

Not done here (documented gaps): the per-op exponent and op_len checks (27, 28)
and the start-time mismatch purge of NicModel.start_op; the parser or the top must
do them. Payload beats are counted (P / lanes per packet); first/last on `i` are
not checked.
"""

from __future__ import annotations

import enum

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.host.model.aggregator import reciprocal_shift, reciprocal_table
from optireduce.hw import wide_multiplier as wmul
from optireduce.hw.deadline import TICK_BITS, PhaseContexts, Reason, settle_cycles, settle_step
from optireduce.hw.staged_write import StagedWrite
from optireduce.hw.streams import element_stream
from optireduce.hw.tc_estimator import TC_BITS, TcEstimator
from optireduce.params import NicParams


class Kind(enum.IntEnum):
    SCATTER = 0
    GATHER = 1
    OWN = 2
    START = 3


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
        }
    )


def _bits(n: int) -> int:
    """Bits to index n items (at least 1)."""
    return max(1, (n - 1).bit_length())


class Aggregator(wiring.Component):
    """Owner-side phase 1 of up to n_ctx ops in flight (see the module docstring).

    LATENCY: cycles from the `end_valid` strobe of a phase end to its first mean on `o`
    (no backpressure, no readout queued before it). Ingest takes P / lanes payload
    beats per packet at one beat per cycle; between packets the event costs about
    n_ctx + 11 cycles (its facts, context lookup, peer-progress scan, row division,
    bitmap check; 1.065 cycles per element in `bench rtl`'s ingest figure at P = 256),
    which the 74 bytes of frame headers ahead of each payload on the wire cover.
    """

    LATENCY = 11  # 7 with the mean's product in one stage and no stage per carry chain
    ACC_WRITE_DELAY = 2  # cycles from a payload beat's handshake to its accumulator write

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.n_ctx = 1 << _bits(p.rx_window)
        self.npk_max = p.c // p.p
        self.rows_max = -(-self.npk_max // 2)  # world >= 2
        self.beats = p.p // p.lanes
        super().__init__(
            {
                # configuration (static while ops run)
                "rank": In(range(p.n_max)),
                "world": In(range(p.n_max + 1)),
                "t_b": In(32),
                "alpha_q8": In(9),
                # time
                "tick": In(1),
                "now": Out(TICK_BITS),
                # inputs
                "ev": In(stream.Signature(event_layout(p))),
                "i": In(element_stream(p.w_wire, p.lanes)),
                # means of ended phases
                "o": Out(element_stream(p.w_wire, p.lanes)),
                "o_op": Out(32),
                "o_index": Out(range(self.npk_max)),
                "o_count": Out(range(p.n_max + 1)),
                # phase ends
                "end_valid": Out(1),
                "end_op": Out(32),
                "end_reason": Out(Reason),
                "end_tick": Out(TICK_BITS),
                "end_timeout": Out(32),
                "end_received": Out(range(self.rows_max * p.n_max + 1)),
                "end_expected": Out(range(self.rows_max * p.n_max + 1)),
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
        n_ctx, rows_max, beats, n_max = self.n_ctx, self.rows_max, self.beats, p.n_max
        cb, rb, bb, sb = _bits(n_ctx), _bits(rows_max), _bits(beats), _bits(n_max)
        K = p.ops_in_flight
        w_acc, lanes = p.w_acc, p.lanes
        n_cnt = range(n_max + 1)
        rcv_shape = range(rows_max + 1)
        tot_shape = range(rows_max * n_max + 1)

        # ---- time ------------------------------------------------------------------
        now = Signal(TICK_BITS)
        pend = Signal(16)  # strobes not yet applied
        consume = Signal()
        m.d.sync += pend.eq(pend + self.tick - consume)
        m.d.comb += self.now.eq(now)

        # ---- t_C and T ---------------------------------------------------------------
        m.submodules.tc = tc = TcEstimator(p)
        m.d.comb += [tc.world.eq(self.world), tc.rank.eq(self.rank), tc.t_b.eq(self.t_b)]
        m.d.comb += self.own_tc.eq(tc.own_tc)

        # ---- per-op contexts (registers) ----------------------------------------------
        cx = PhaseContexts(n_ctx, tot_shape, n_cnt)
        (c_valid, c_started, c_ended, c_op, c_start, c_anchor, c_has_arr, c_last_arr,
         c_last_gone, c_recv, c_exp, c_unflag, c_owing) = cx.fields()  # fmt: skip
        c_mine = Array(Signal(rcv_shape, name=f"mine{k}") for k in range(n_ctx))

        # per-context end evaluation, registered (the FSM settles after a change)
        T, due, due_end, due_reason = cx.evaluate(m, tc, self.alpha_q8, now)
        m.d.comb += self.timeout.eq(T)

        # ---- memories ---------------------------------------------------------------
        m.submodules.acc = acc = Memory(
            shape=unsigned(lanes * w_acc), depth=n_ctx * (1 << rb) * (1 << bb), init=[]
        )
        acc_rd, acc_wr = acc.read_port(), acc.write_port()
        bm_layout = data.StructLayout({"bits": n_max, "count": n_cnt})
        m.submodules.bitmap = bm = Memory(shape=bm_layout, depth=n_ctx * (1 << rb), init=[])
        bm_rd = bm.read_port()
        bm_wr = StagedWrite(m, bm.write_port(), "bitmap")
        peer_layout = data.StructLayout({"rcv": rcv_shape, "flagged": 1, "gone": 1})
        m.submodules.peers = pm = Memory(shape=peer_layout, depth=n_ctx * (1 << sb), init=[])
        pm_rd = pm.read_port()
        pm_wr = StagedWrite(m, pm.write_port(), "peers")

        # ---- the event being handled ----------------------------------------------------
        ev = Signal(event_layout(p))
        ev_now = Signal(TICK_BITS)
        c = Signal(cb)
        m.d.comb += c.eq(ev.op_id[:cb])

        # readout queue (context indices, in end order)
        q = Array(Signal(cb, name=f"q{k}") for k in range(n_ctx))
        q_head, q_tail = Signal(cb), Signal(cb)
        q_n = Signal(range(n_ctx + 1))
        q_push, q_pop = Signal(), Signal()
        q_in = Signal(cb)
        with m.If(q_push):
            m.d.sync += [q[q_tail].eq(q_in), q_tail.eq(q_tail + 1)]
        with m.If(q_pop):
            m.d.sync += q_head.eq(q_head + 1)
        m.d.sync += q_n.eq(q_n + q_push - q_pop)
        ro_busy = Signal()

        # counters
        cnt_rx, cnt_dup, cnt_late = Signal(32), Signal(32), Signal(32)
        m.d.comb += [
            self.cnt_rx.eq(cnt_rx),
            self.cnt_duplicate.eq(cnt_dup),
            self.cnt_late.eq(cnt_late),
        ]

        # divider (restoring, one quotient bit per cycle): num // world
        qbits = _bits(self.npk_max + 1)
        div_num = Signal(qbits)
        div_rem = Signal(qbits + 1)
        div_q = Signal(qbits)
        div_k = Signal(range(qbits + 1))
        div_go = Signal()
        div_in = Signal(qbits)
        div_busy = Signal()  # div_q is valid while low
        mine_pending = Signal()  # the division in flight is the context's slot count
        row = Signal(rb)
        with m.If(div_go):
            m.d.sync += [
                div_num.eq(div_in),
                div_rem.eq(0),
                div_k.eq(qbits),
                div_busy.eq(1),
            ]
        with m.Elif(div_busy):
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

        # firing
        fire_c = Signal(cb)
        ret_post = Signal()
        # cycles the end evaluation has been stable (deadline.settle_cycles: it is valid)
        settle_n = settle_cycles(n_ctx)
        settle = Signal(range(settle_n + 1))
        settled = settle == settle_n
        post_b = Signal()  # POST has done the older ops; next, the event's own op
        accepted = Signal()  # the scatter frame was added (not late, not a duplicate)
        gone_c = Signal(range(n_ctx + 1))
        n_clear = max(n_max, rows_max)
        clr = Signal(range(n_clear + 1))
        drop = Signal()
        beat = Signal(bb)
        # accumulate stages: the read issued, its output registered, added and written
        # (ACC_WRITE_DELAY cycles after the beat); a packet's beats are distinct addresses,
        # and the next packet comes many cycles later, so no read sees a write in flight
        acc_v, acc_v2 = Signal(), Signal()
        fresh = Signal()
        acc_addr, acc_addr2 = Signal(len(acc_wr.addr)), Signal(len(acc_wr.addr))
        acc_vals = Signal(data.ArrayLayout(signed(p.w_wire), lanes))
        acc_vals2 = Signal(data.ArrayLayout(signed(p.w_wire), lanes))
        acc_old = Signal(lanes * w_acc)

        # facts of the event, each registered a state before its use (125 MHz): which
        # contexts hold its op, the packets of its op, the ops its sender is done with
        # (op <= op_id - K) and still owes slots
        hits, done = cx.event_registers()
        n_pk_r = Signal(range(self.npk_max + 1))
        peer_hit = Signal(n_ctx)  # ... and the sender owes it slots: gone_hit
        me = Signal()  # the sender is this rank
        who_bit = Signal(n_max)  # the contributor's bit: 1 << (rank if OWN else sender)
        mine_e = Signal(rcv_shape)  # the event's context's slot count
        # selection of the next phase to end: IDLE by (end, op); POST first the ops the
        # event's sender has finished (op <= ev.op_id - K), as NicModel._peer_progress
        # ends them, in op order (end ticks are all <= now there)
        idle_found, idle_pick, post_found, post_pick = cx.picks(m, due, due_end, done)

        # end report (one-cycle strobe)
        m.d.sync += self.end_valid.eq(0)

        n_pk = Signal(range(self.npk_max + 1))
        m.d.comb += n_pk.eq(
            ((ev.op_len + (p.b - 1)) >> p.log2_b) << (p.log2_b - (p.p.bit_length() - 1))
        )
        in_payload = Signal()

        with m.FSM() as fsm:
            with m.State("IDLE"):
                # the event's registers load in every IDLE cycle (only HIT on reads them):
                # their enable is the state alone, not the take decision (125 MHz)
                m.d.sync += [ev.eq(self.ev.payload), ev_now.eq(now), post_b.eq(0), accepted.eq(0)]
                with m.If(pend != 0):
                    m.d.comb += consume.eq(1)
                    m.d.sync += [now.eq(now + 1), settle.eq(0), ret_post.eq(0)]
                    m.next = "SETTLE"
                with m.Elif(idle_found):
                    m.d.sync += [fire_c.eq(idle_pick), ret_post.eq(0)]
                    m.next = "FIRE"
                with m.Elif(~ro_busy & (q_n == 0)), m.If(self.ev.valid):
                    m.next = "HIT"

            with m.State("HIT"):
                cx.take_event(m, ev.op_id, K)
                who = Mux(ev.kind == Kind.OWN, self.rank, ev.sender)
                m.d.sync += [
                    n_pk_r.eq(n_pk),
                    me.eq(ev.sender == self.rank),
                    who_bit.eq(Const(1, n_max) << who),
                ]
                m.next = "LOOKUP"

            with m.State("LOOKUP"):
                with m.If(~hits.bit_select(c, 1)):
                    # claim the context: its previous op is done (and read out)
                    m.d.sync += [
                        c_valid[c].eq(1),
                        c_op[c].eq(ev.op_id),
                        c_started[c].eq(0),
                        c_ended[c].eq(0),
                        c_has_arr[c].eq(0),
                        c_last_arr[c].eq(0),
                        c_last_gone[c].eq(0),
                        c_start[c].eq(0),
                        c_anchor[c].eq(0),
                        c_recv[c].eq(0),
                        clr.eq(0),
                    ]
                    # slots owned: (n_packets - 1 - rank) // world + 1, divided while clearing
                    m.d.sync += mine_pending.eq(n_pk_r > self.rank)
                    m.d.comb += [
                        div_go.eq(n_pk_r > self.rank),
                        div_in.eq(n_pk_r - 1 - self.rank),
                    ]
                    m.next = "CLEAR"
                with m.Else():
                    m.next = "DISPATCH"

            with m.State("CLEAR"):  # the context's per-sender table and slot bitmaps
                m.d.sync += [
                    pm_wr.addr.eq(Cat(clr[:sb], c)),
                    pm_wr.en.eq(clr < n_max),
                    pm_wr.data.eq(0),
                    bm_wr.addr.eq(Cat(clr[:rb], c)),
                    bm_wr.en.eq(clr < rows_max),
                    bm_wr.data.eq(0),
                ]
                m.d.sync += clr.eq(clr + 1)
                with m.If(clr == n_clear - 1):
                    m.next = "MINE"

            mine_r = Signal(rcv_shape)
            with m.State("MINE"), m.If(~div_busy):
                m.d.sync += mine_r.eq(Mux(mine_pending, div_q + 1, 0))
                m.next = "MINE_SET"
            with m.State("MINE_SET"):
                senders = Mux(mine_r != 0, self.world - 1, 0)
                m.d.sync += [
                    c_mine[c].eq(mine_r),
                    c_exp[c].eq(mine_r * (self.world - 1)),
                    c_unflag[c].eq(senders),
                    c_owing[c].eq(senders),
                ]
                m.next = "DISPATCH"

            with m.State("DISPATCH"):
                # the event's facts over the contexts, all in parallel (registered)
                fin = cx.mark_done(m)
                m.d.sync += [
                    peer_hit.eq(Cat(
                        c_valid[k] & ~c_ended[k] & (c_mine[k] != 0) & ~me & fin[k]
                        for k in range(n_ctx)
                    )),
                    mine_e.eq(c_mine[c]),
                ]  # fmt: skip
                with m.Switch(ev.kind):
                    with m.Case(Kind.SCATTER):
                        m.d.comb += [div_go.eq(1), div_in.eq(ev.pkt_index)]  # its slot row
                        m.next = "TC"
                    with m.Case(Kind.GATHER):
                        m.d.sync += gone_c.eq(0)
                        m.next = "GONE_RD"
                    with m.Case(Kind.OWN):
                        m.d.comb += [div_go.eq(1), div_in.eq(ev.pkt_index)]
                        m.next = "ROW_WAIT"
                    with m.Case(Kind.START):
                        m.d.sync += [
                            c_started[c].eq(1),
                            c_start[c].eq(ev_now),
                            c_anchor[c].eq(ev_now),
                            settle.eq(0),
                        ]
                        m.next = "POST"

            with m.State("TC"):  # the sender's piggybacked t_C (frames past check 28)
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
            gone_hit = Signal()
            gk = gone_c[:cb]
            m.d.comb += gone_hit.eq((gone_c < n_ctx) & peer_hit.bit_select(gk, 1))
            # the memories' outputs registered (a *_REG state) before any logic (125 MHz)
            pm_q = Signal(peer_layout)
            bm_q = Signal(bm_layout)
            mine_g = Signal(rcv_shape)
            with m.State("GONE_RD"):
                m.d.comb += pm_rd.addr.eq(Cat(ev.sender[:sb], gk))
                m.d.sync += mine_g.eq(c_mine[gk])
                with m.If(gone_c == n_ctx):
                    with m.If(ev.kind == Kind.SCATTER):
                        m.next = "LATE"
                    with m.Else():
                        m.d.sync += settle.eq(0)
                        m.next = "POST"
                with m.Elif(gone_hit):
                    m.next = "GONE_REG"
                with m.Else():
                    m.d.sync += gone_c.eq(gone_c + 1)
            with m.State("GONE_REG"):
                m.d.sync += pm_q.eq(pm_rd.data)
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
                    with m.If(old.rcv < mine_g):
                        m.d.sync += c_owing[gk].eq(c_owing[gk] - 1)
                m.d.sync += gone_c.eq(gone_c + 1)
                m.next = "GONE_RD"

            with m.State("LATE"):
                with m.If(c_ended[c]):
                    # the peer-progress and t_C changes before: settle from here on
                    m.d.sync += [cnt_late.eq(cnt_late + 1), drop.eq(1), beat.eq(0), settle.eq(0)]
                    m.next = "PAYLOAD"
                with m.Else():
                    m.next = "ROW_WAIT"

            with m.State("ROW_WAIT"), m.If(~div_busy):
                m.d.comb += [
                    bm_rd.addr.eq(Cat(div_q[:rb], c)),
                    pm_rd.addr.eq(Cat(ev.sender[:sb], c)),
                ]
                m.d.sync += row.eq(div_q)
                m.next = "ROW_REG"

            dup, last_new, owed = Signal(), Signal(), Signal()
            with m.State("ROW_REG"):
                m.d.sync += [bm_q.eq(bm_rd.data), pm_q.eq(pm_rd.data)]
                m.next = "ROW_FACTS"
            with m.State("ROW_FACTS"):
                m.d.sync += [
                    dup.eq((ev.kind == Kind.SCATTER) & (bm_q.bits & who_bit).any()),
                    last_new.eq(ev.last & ~pm_q.flagged),
                    owed.eq((pm_q.rcv + 1 == mine_e) & ~pm_q.gone),
                ]
                m.next = "ROW_CHECK"

            with m.State("ROW_CHECK"):
                bits = bm_q.bits
                # a slot's first contribution overwrites: the accumulators need no clearing;
                # the context (and T) may change here: settle from here on
                m.d.sync += [drop.eq(0), beat.eq(0), fresh.eq(bm_q.count == 0), settle.eq(0)]
                with m.If(dup):
                    m.d.sync += [cnt_dup.eq(cnt_dup + 1), drop.eq(1)]
                with m.Else():
                    m.d.sync += [
                        bm_wr.addr.eq(Cat(row, c)),
                        bm_wr.en.eq(1),
                        bm_wr.data.bits.eq(bits | who_bit),
                        bm_wr.data.count.eq(bm_q.count + 1),
                    ]
                    with m.If(ev.kind == Kind.SCATTER):
                        old = pm_q
                        rcv1 = old.rcv + 1
                        m.d.sync += [
                            pm_wr.addr.eq(Cat(ev.sender[:sb], c)),
                            pm_wr.en.eq(1),
                            pm_wr.data.rcv.eq(rcv1),
                            pm_wr.data.flagged.eq(old.flagged | ev.last),
                            pm_wr.data.gone.eq(old.gone),
                        ]
                        m.d.sync += [
                            accepted.eq(1),
                            cnt_rx.eq(cnt_rx + 1),
                            c_recv[c].eq(c_recv[c] + 1),
                            c_last_arr[c].eq(ev_now),
                            c_has_arr[c].eq(1),
                        ]
                        with m.If(last_new):
                            m.d.sync += c_unflag[c].eq(c_unflag[c] - 1)
                        with m.If(owed):
                            m.d.sync += c_owing[c].eq(c_owing[c] - 1)
                m.next = "PAYLOAD"

            with m.State("PAYLOAD"):
                m.d.comb += [in_payload.eq(1), self.i.ready.eq(1)]
                # the context changed before the payload: the end evaluation settles meanwhile
                m.d.sync += settle.eq(Mux(tc.busy, 0, Mux(settled, settle, settle + 1)))
                with m.If(self.i.valid):
                    m.d.sync += beat.eq(beat + 1)
                    with m.If(beat == beats - 1):
                        m.next = "POST"

            # end what the event made due, in the model's order: the ops its sender is done
            # with (_peer_progress), then the event's own op (_progress after an accepted
            # frame or a start), then the rest by (end tick, op) in IDLE (advance)
            own_due = due[c]  # context c holds the event's op from LOOKUP on
            own_ok = (
                (ev.kind == Kind.START)
                | (ev.kind == Kind.GATHER)
                | ((ev.kind == Kind.SCATTER) & accepted)
            )
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
                    m.d.sync += ret_post.eq(0)
                    m.next = "IDLE"

            # an end in three states (125 MHz); an op with slots here is read out
            f_mine = Signal()

            def queue_readout(m):
                m.d.comb += [q_push.eq(f_mine), q_in.eq(fire_c)]

            cx.end_states(m, self, tc, T, fire_c, due_end, due_reason, settle, ret_post,
                          select=[(f_mine, c_mine[fire_c] != 0)], report=queue_readout)  # fmt: skip

            # the evaluation catches up
            with m.State("SETTLE"), m.If(settle_step(m, settle, tc, settle_n)):
                m.next = "IDLE"

        m.d.comb += self.ev.ready.eq(
            fsm.ongoing("IDLE") & ~(pend != 0) & ~idle_found & ~ro_busy & (q_n == 0)
        )

        # ---- accumulate: read-modify-write, one beat per cycle -----------------------
        m.d.sync += acc_v.eq(0)
        with m.If(in_payload & self.i.valid):
            m.d.comb += acc_rd.addr.eq(Cat(beat, row, c))
            m.d.sync += [
                acc_v.eq(~drop),
                acc_addr.eq(Cat(beat, row, c)),
                acc_vals.eq(self.i.payload.data),
            ]
        m.d.sync += [
            acc_v2.eq(acc_v),
            acc_addr2.eq(acc_addr),
            acc_vals2.eq(acc_vals),
            acc_old.eq(acc_rd.data),
        ]
        with m.If(acc_v2):
            m.d.comb += [acc_wr.addr.eq(acc_addr2), acc_wr.en.eq(1)]
            for k in range(lanes):
                old = Mux(fresh, 0, acc_old[k * w_acc : (k + 1) * w_acc].as_signed())
                m.d.comb += acc_wr.data[k * w_acc : (k + 1) * w_acc].eq(old + acc_vals2[k])

        # ---- readout: means of an ended op, through the reciprocal table -------------
        table = reciprocal_table(p)
        s_shift = reciprocal_shift(p)
        rec_w = max(table).bit_length()
        recips = Array(Const(v, rec_w) for v in table)
        ro_c = Signal(cb)
        ro_mine = Signal(rcv_shape)  # the op's slot count: the rows to read out
        ro_row = Signal(rb + 1)
        ro_beat = Signal(bb + 1)
        ro_idx = Signal(range(self.npk_max + p.n_max + 1))
        ro_n = Signal(n_cnt)
        ro_rec = Signal(rec_w)
        adv = Signal()
        m.d.comb += adv.eq(~self.o.valid | self.o.ready)

        issue = Signal()
        # pipeline stages: 1 (memory output), 2 (its register), 3 (|S|), 4 (2|S| + n),
        # 5..7 (the product, wide_multiply), then o: the memory's output and each carry
        # chain get a cycle of their own (125 MHz)
        stage = data.StructLayout(
            {
                "v": 1,
                "first": 1,
                "last": 1,
                "n": n_cnt,
                "rec": rec_w,
                "op": 32,
                "idx": range(self.npk_max),
            }
        )
        s1, sr, sm, s2 = Signal(stage), Signal(stage), Signal(stage), Signal(stage)
        sp = [Signal(stage, name=f"sp{d}") for d in range(wmul.LATENCY)]  # beside the product
        num2 = [Signal(w_acc + 2, name=f"num2_{k}") for k in range(lanes)]
        neg2 = [Signal(name=f"neg2_{k}") for k in range(lanes)]

        with m.FSM() as ro:
            with m.State("IDLE"), m.If((q_n != 0) & ~in_payload):
                m.d.comb += q_pop.eq(1)
                m.d.sync += [
                    ro_c.eq(q[q_head]),
                    ro_mine.eq(c_mine[q[q_head]]),
                    ro_row.eq(0),
                    ro_idx.eq(self.rank),
                ]
                m.next = "ROW"
            with m.State("ROW"):
                # the read does not wait for the compare (a row past the last is not used)
                m.d.comb += bm_rd.addr.eq(Cat(ro_row[:rb], ro_c))
                with m.If(ro_row == ro_mine):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "COUNT"
            with m.State("COUNT"):
                m.d.sync += [
                    ro_n.eq(bm_rd.data.count),
                    ro_rec.eq(recips[bm_rd.data.count]),
                    ro_beat.eq(0),
                ]
                m.next = "STREAM"
            with m.State("STREAM"), m.If(adv):
                m.d.comb += issue.eq(1)
                m.d.sync += ro_beat.eq(ro_beat + 1)
                with m.If(ro_beat == beats - 1):
                    m.d.sync += [ro_row.eq(ro_row + 1), ro_idx.eq(ro_idx + self.world)]
                    m.next = "ROW"
        # busy until the memory's last output is taken (s1 moves on with adv): an event's
        # payload would otherwise drive the read port while `o` stalls the readout
        m.d.comb += ro_busy.eq(~ro.ongoing("IDLE") | s1.v)

        addr = Cat(ro_beat[:bb], ro_row[:rb], ro_c)
        with m.If(~in_payload):
            m.d.comb += acc_rd.en.eq(adv)
            with m.If(issue):
                m.d.comb += acc_rd.addr.eq(addr)
        with m.If(adv):
            m.d.sync += [
                s1.v.eq(issue),
                s1.first.eq(ro_beat == 0),
                s1.last.eq(ro_beat == beats - 1),
                s1.n.eq(ro_n),
                s1.rec.eq(ro_rec),
                s1.op.eq(c_op[ro_c]),
                s1.idx.eq(ro_idx),
                sr.eq(s1),
                sm.eq(sr),
                s2.eq(sm),
                sp[0].eq(s2),
                *(sp[d].eq(sp[d - 1]) for d in range(1, wmul.LATENCY)),
                self.o.valid.eq(sp[-1].v),
                self.o.payload.first.eq(sp[-1].first),
                self.o.payload.last.eq(sp[-1].last),
                self.o_op.eq(sp[-1].op),
                self.o_index.eq(sp[-1].idx),
                self.o_count.eq(sp[-1].n),
            ]
        for k in range(lanes):
            sv = Signal(signed(w_acc), name=f"sv_{k}")
            mag = Signal(w_acc, name=f"mag_{k}")
            neg_m = Signal(name=f"negm_{k}")
            negs = [Signal(name=f"neg{d}_{k}") for d in range(wmul.LATENCY)]
            with m.If(adv):
                m.d.sync += [
                    sv.eq(acc_rd.data[k * w_acc : (k + 1) * w_acc].as_signed()),
                    mag.eq(Mux(sv < 0, -sv, sv)),
                    neg_m.eq(sv < 0),
                    num2[k].eq((mag << 1) + sm.n),
                    neg2[k].eq(neg_m),
                ]
                m.d.sync += [negs[0].eq(neg2[k]), *(negs[d].eq(negs[d - 1]) for d in
                                                    range(1, wmul.LATENCY))]  # fmt: skip
            prod = wmul.wide_multiply(m, num2[k], s2.rec, adv, name=f"prod_{k}")
            q_mag = prod >> s_shift
            with m.If(adv):
                m.d.sync += self.o.payload.data[k].eq(Mux(negs[-1], -q_mag, q_mag))
        return m
