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
from types import SimpleNamespace

from amaranth import Array, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.host.model.nic_model import NicModel
from optireduce.hw import event_counts
from optireduce.hw.deadline import PhaseContexts, Reason, Settle, tick_before, tick_sum
from optireduce.hw.peer_progress import PeerProgress, peer_layout
from optireduce.hw.serial_divider import SerialDivider
from optireduce.hw.staged_write import StagedWrite
from optireduce.hw.tc_estimator import owner_estimator, owner_estimator_port, tc_bits
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
            "t_c": tc_bits(p),
            "at": p.tick_bits,
            "p1_start": p.tick_bits,
            "t1": p.t_b_bits,  # T <= t_B
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
    (2 n_ctx + 18 cycles per event). The first event of an
    op claims its context: max(n_max, c/p) + about 10 cycles more.
    MODEL: host/model/nic_model.py NicModel phase 2 (_accept, _peer_progress, _end_phase2).
    """

    MODEL = NicModel  # phase 2: p2, tc[1], _peer_progress

    def __init__(self, p: NicParams, tick0: int = 0, *, tc_external: bool = False) -> None:
        self.p, self.tick0 = p, tick0  # tick0: `now` after reset (a test starts near the wrap)
        self.tc_external = tc_external  # the t_C estimator is a bank of the core's (`tc`)
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
                "t_c_min": In(tc_bits(p), init=p.t_c_min_us),
                "t_c_init": In(tc_bits(p), init=p.t_c_init),
                "alpha_q8": In(9),
                # time: the latest tick the block may advance to
                "time": In(p.tick_bits),
                "now": Out(p.tick_bits),
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
                "end_tick": Out(p.tick_bits),
                "end_timeout": Out(p.t_b_bits),  # T <= t_B
                "end_received": Out(range(self.npk_max + 1)),
                "end_expected": Out(range(self.npk_max + 1)),
                # status
                "timeout": Out(32),
                "own_tc": Out(tc_bits(p)),
                **owner_estimator_port(p, tc_external),
                **event_counts.ports(),  # rx / duplicate / late: counts and strobes
            }
        )

    def elaborate(self, platform):
        m = Module()
        s = self._state(m)  # time, t_C and T, the contexts, the memories, the event
        m.submodules.divider = s.div = SerialDivider(_bits(s.npk + 1), range(s.n_max + 1))
        m.submodules.peer_progress = s.pp = PeerProgress(s.n_ctx, s.n_max, s.rcv_shape)
        m.d.comb += [s.div.den.eq(self.world), s.pp.hit.eq(s.peer_hit), s.pp.sender.eq(s.ev.sender)]
        with m.FSM() as fsm:
            self._take_states(m, s)  # IDLE: the clock, due phases, the next event; HIT, LOOKUP
            self._claim_states(m, s)  # a new op's context: CLEAR, EXPECT, EXPECT_SET
            self._dispatch_states(m, s)  # DISPATCH by kind; TC; GONE (peer progress)
            self._slot_states(m, s)  # LATE, SLOT_REG, SLOT: a gather frame's verdict
            self._end_states(m, s)  # POST, FIRE*, SETTLE: the phases the event made due
        # no event: ready as the clock allows (a serial compare with the idle payload's
        # tick 0 is not "at or after" once the clock is past half its wrap)
        early = self.ev.valid & tick_before(s.now, self.ev.payload.at)
        m.d.comb += self.ev.ready.eq(fsm.ongoing("IDLE") & ~s.idle_found & ~early)
        return m

    def _state(self, m: Module) -> SimpleNamespace:
        """The block's registers, memories and shared signals, by section."""
        p = self.p
        s = SimpleNamespace(p=p)
        s.n_ctx, s.n_max, s.npk = n_ctx, n_max, npk = self.n_ctx, p.n_max, self.npk_max
        s.cb, s.sb, s.ib = _bits(n_ctx), _bits(n_max), _bits(npk)
        s.n_cnt = n_cnt = range(n_max + 1)
        s.tot = tot = range(npk + 1)
        s.rcv_shape = range(self.own_max + 1)

        s.now = Signal(p.tick_bits, init=self.tick0)
        m.d.comb += self.now.eq(s.now)

        # ---- t_C and T of phase 2 -----------------------------------------------------
        tc = s.tc = owner_estimator(m, self, s.now)

        # ---- per-op contexts ------------------------------------------------------------
        s.cx = cx = PhaseContexts(n_ctx, tot, n_cnt, p.tick_bits)
        for name, field in zip(PhaseContexts.FIELDS, cx.fields(), strict=True):
            setattr(s, f"c_{name}", field)
        # divmod(n_packets, world)
        s.c_q = Array(Signal(tot, name=f"q{k}") for k in range(n_ctx))
        s.c_rem = Array(Signal(n_cnt, name=f"rem{k}") for k in range(n_ctx))
        # per-context end evaluation, registered (the FSM settles after a change)
        s.T, s.due, s.due_end, s.due_reason = cx.evaluate(m, tc, self.alpha_q8, s.now)
        m.d.comb += self.timeout.eq(s.T)
        s.settle = Settle(n_ctx)  # cycles the end evaluation has been stable

        # ---- memories: per-sender state and the slot bitmap, per context ------------------
        s.peer_layout = peer_layout(s.rcv_shape)
        m.submodules.peers = pm = Memory(shape=s.peer_layout, depth=n_ctx << s.sb, init=[])
        s.pm_rd = pm.read_port()
        s.pm_wr = StagedWrite(m, pm.write_port(), "peers")
        m.submodules.have = hv = Memory(shape=1, depth=n_ctx << s.ib, init=[])
        s.hv_rd = hv.read_port()
        s.hv_wr = StagedWrite(m, hv.write_port(), "have")

        # ---- the event being handled ----------------------------------------------------
        s.ev = ev = Signal(event_layout(p))
        s.ev_now = Signal(p.tick_bits)
        s.c = Signal(s.cb)
        m.d.comb += s.c.eq(ev.op_id[: s.cb])
        s.n_pk = Signal(range(npk + 1))
        m.d.comb += s.n_pk.eq(
            ((ev.op_len + (p.b - 1)) >> p.log2_b) << (p.log2_b - (p.p.bit_length() - 1))
        )
        # facts of the event, each registered a state before its use (125 MHz): which
        # contexts hold its op, the packets of its op, the ops its sender is done with
        # (op <= op_id - K), what the sender owes
        s.hits, s.done = cx.event_registers()
        s.n_pk_r = Signal(range(npk + 1))
        s.peer_hit = Signal(n_ctx)  # ... and the sender still owes it packets
        s.me = Signal()  # the sender is this rank
        s.q_e, s.lt_e = Signal(tot), Signal()  # the event's context: q, sender < rem
        s.exp_e = Signal(s.rcv_shape)  # packets it expects from the sender
        s.p1_anchor = Signal(p.tick_bits)  # a PHASE1_END's p1_start + t1
        s.accepted = Signal()
        s.clr = Signal(range(max(n_max, npk) + 1))  # the entry being cleared

        # selection of the next phase to end: by (end tick, op) among the due, or by op
        # among the due ops <= ev.op_id - K (the ones the event's sender is done with)
        s.idle_found, s.idle_pick, s.post_found, s.post_pick = cx.picks(m, s.due, s.due_end, s.done)
        s.fire_c, s.ret_post, s.post_b = cx.fire_c, cx.ret_post, cx.post_b

        s.counts = event_counts.EventCounts(m)
        s.counts.drive(m, self)
        m.d.sync += [self.end_valid.eq(0), self.verdict_valid.eq(0)]
        return s

    def _expected(self, s: SimpleNamespace, q, lt):
        """Packets a context expects from the sender, from its registered q and
        sender < rem: q + (sender < rem), none from this rank (NicModel)."""
        return Mux(s.me, 0, q + lt)

    def _take_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, now, K = s.ev, s.c, s.now, self.p.ops_in_flight
        target = Signal(self.p.tick_bits)
        m.d.comb += target.eq(Mux(self.ev.valid, self.ev.payload.at, self.time))
        with m.State("IDLE"):
            # the event's registers load in every IDLE cycle (as in the aggregator)
            m.d.sync += [
                ev.eq(self.ev.payload),
                s.ev_now.eq(now),
                s.post_b.eq(0),
                s.accepted.eq(0),
            ]
            with m.If(s.idle_found):
                m.d.sync += [s.fire_c.eq(s.idle_pick), s.ret_post.eq(0)]
                m.next = "FIRE"
            with m.Elif(tick_before(now, target)):
                # NicModel.advance(target): ends come out in (end tick, op) order
                m.d.sync += [now.eq(target), s.settle.restart()]
                m.next = "SETTLE"
            with m.Elif(self.ev.valid):
                m.next = "HIT"

        with m.State("HIT"):
            s.cx.take_event(m, ev.op_id, K)
            m.d.sync += [
                s.n_pk_r.eq(s.n_pk),
                s.me.eq(ev.sender == self.rank),
                s.p1_anchor.eq(tick_sum(ev.p1_start, ev.t1)),
            ]
            m.next = "LOOKUP"

        with m.State("LOOKUP"):
            with m.If(~s.hits.bit_select(c, 1)):
                # claim the context: the op it held is done (the receive window)
                m.d.sync += [*s.cx.claim(c, ev.op_id), s.clr.eq(0)]
                m.d.comb += [s.div.go.eq(1), s.div.num.eq(s.n_pk_r)]  # n_packets divmod world
                m.next = "CLEAR"
            with m.Else():
                m.next = "DISPATCH"

    def _claim_states(self, m: Module, s: SimpleNamespace) -> None:
        c, n_max, npk, clr = s.c, s.n_max, s.npk, s.clr
        n_clear = max(n_max, npk)
        with m.State("CLEAR"):
            m.d.sync += [
                s.pm_wr.addr.eq(Cat(clr[: s.sb], c)),
                s.pm_wr.en.eq(clr < n_max),
                s.pm_wr.data.eq(0),
                s.hv_wr.addr.eq(Cat(clr[: s.ib], c)),
                s.hv_wr.en.eq(clr < npk),
                s.hv_wr.data.eq(0),
            ]
            m.d.sync += clr.eq(clr + 1)
            with m.If(clr == n_clear - 1):
                m.next = "EXPECT"

        own = Signal(s.tot)
        nsend = Signal(s.n_cnt)
        with m.State("EXPECT"), m.If(~s.div.busy):
            q, rem = s.div.q, s.div.rem[: len(s.div.q)]
            m.d.sync += [
                s.c_q[c].eq(q),
                s.c_rem[c].eq(rem),
                own.eq(q + (self.rank < rem)),
                nsend.eq(Mux(s.n_pk_r < self.world, s.n_pk_r, self.world)),
            ]
            m.next = "EXPECT_SET"
        with m.State("EXPECT_SET"):
            senders = nsend - (self.rank < s.n_pk_r)
            m.d.sync += [
                s.c_exp[c].eq(s.n_pk_r - own),
                s.c_unflag[c].eq(senders),
                s.c_owing[c].eq(senders),
            ]
            m.next = "DISPATCH"

    def _dispatch_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, ev_now, pp, tc = s.ev, s.c, s.ev_now, s.pp, s.tc
        # the event's facts over the contexts, all in parallel (registered)
        with m.State("DISPATCH"):
            owes = [(s.c_q[k] != 0) | (ev.sender < s.c_rem[k]) for k in range(s.n_ctx)]
            fin = s.cx.mark_done(m)
            m.d.sync += [
                s.peer_hit.eq(Cat(
                    s.c_valid[k] & ~s.c_ended[k] & ~s.me & owes[k] & fin[k]
                    for k in range(s.n_ctx)
                )),
                s.q_e.eq(s.c_q[c]),
                s.lt_e.eq(ev.sender < s.c_rem[c]),
            ]  # fmt: skip
            with m.Switch(ev.kind):
                with m.Case(Kind.GATHER):
                    m.next = "TC"
                with m.Case(Kind.SCATTER):
                    m.d.comb += pp.start.eq(1)
                    m.next = "GONE"
                with m.Case(Kind.START):
                    m.d.sync += s.settle.restart()
                    m.next = "POST"
                with m.Case(Kind.PHASE1_END):
                    m.d.sync += [
                        *s.cx.begin(
                            c, ev_now, Mux(tick_before(ev_now, s.p1_anchor), s.p1_anchor, ev_now)
                        ),
                        s.settle.restart(),
                    ]
                    m.next = "POST"

        with m.State("TC"):  # the sender's piggybacked phase-2 t_C
            m.d.sync += s.exp_e.eq(self._expected(s, s.q_e, s.lt_e))
            m.d.comb += [
                tc.update.valid.eq(1),
                tc.update.payload.rank.eq(ev.sender),
                tc.update.payload.value.eq(ev.t_c),
                tc.update.payload.at.eq(ev_now),
            ]
            with m.If(tc.update.ready):
                m.d.comb += pp.start.eq(1)
                m.next = "GONE"

        # peer progress: the sender has finished every op <= ev.op_id - K; what it owes a
        # context, from registers loaded the cycle before the scan samples it (125 MHz)
        q_g, lt_g = Signal(s.tot), Signal()
        m.d.comb += pp.owed.eq(self._expected(s, q_g, lt_g))
        with m.State("GONE"):
            pp.serve(m, s.pm_rd, s.pm_wr, s.cx, ev_now)
            m.d.sync += [q_g.eq(s.c_q[pp.ctx]), lt_g.eq(ev.sender < s.c_rem[pp.ctx])]
            with m.If(pp.done):
                with m.If(ev.kind == Kind.GATHER):
                    m.next = "LATE"
                with m.Else():
                    m.d.sync += s.settle.restart()
                    m.next = "POST"

    def _slot_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, ev_now, ib, sb = s.ev, s.c, s.ev_now, s.ib, s.sb
        # the sender's expected count, registered a state ahead of its use (125 MHz)
        exp_r = Signal(s.rcv_shape)
        exp_z = Signal()  # exp_r == 0
        # and the memories' outputs registered (a *_REG state) before any logic
        pm_q = Signal(s.peer_layout)
        hv_q = Signal()
        with m.State("LATE"):
            m.d.comb += [
                s.hv_rd.addr.eq(Cat(ev.pkt_index[:ib], c)),
                s.pm_rd.addr.eq(Cat(ev.sender[:sb], c)),
            ]
            # rcv + 1 == exp, as old.rcv == exp - 1 (never when exp is 0)
            m.d.sync += [exp_r.eq(s.exp_e - 1), exp_z.eq(s.exp_e == 0)]
            with m.If(s.c_ended[c]):
                m.d.sync += [
                    *s.counts.step("late"),
                    self.verdict_valid.eq(1),
                    self.verdict.eq(Verdict.LATE),
                    self.verdict_op.eq(ev.op_id),
                    self.verdict_index.eq(ev.pkt_index),
                    s.settle.restart(),
                ]
                m.next = "POST"
            with m.Else():
                m.next = "SLOT_REG"

        with m.State("SLOT_REG"):
            m.d.sync += [pm_q.eq(s.pm_rd.data), hv_q.eq(s.hv_rd.data)]
            m.next = "SLOT"
        with m.State("SLOT"):
            m.d.sync += [
                self.verdict_valid.eq(1),
                self.verdict_op.eq(ev.op_id),
                self.verdict_index.eq(ev.pkt_index),
                s.settle.restart(),
            ]
            with m.If(hv_q):
                m.d.sync += [*s.counts.step("duplicate"), self.verdict.eq(Verdict.DUPLICATE)]
            with m.Else():
                m.d.sync += [
                    s.hv_wr.addr.eq(Cat(ev.pkt_index[:ib], c)),
                    s.hv_wr.en.eq(1),
                    s.hv_wr.data.eq(1),
                    s.pm_wr.addr.eq(Cat(ev.sender[:sb], c)),
                    s.pm_wr.en.eq(1),
                    s.pm_wr.data.rcv.eq(pm_q.rcv + 1),
                    s.pm_wr.data.flagged.eq(pm_q.flagged | ev.last),
                    s.pm_wr.data.gone.eq(pm_q.gone),
                ]
                m.d.sync += [
                    self.verdict.eq(Verdict.ACCEPT),
                    s.accepted.eq(1),
                    *s.counts.step("rx"),
                    *s.cx.arrival(c, ev_now),
                ]
                with m.If(ev.last & ~pm_q.flagged):
                    m.d.sync += s.c_unflag[c].eq(s.c_unflag[c] - 1)
                with m.If((pm_q.rcv == exp_r) & ~exp_z & ~pm_q.gone):
                    m.d.sync += s.c_owing[c].eq(s.c_owing[c] - 1)
            m.next = "POST"

    def _end_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c = s.ev, s.c
        # end what the event made due, in the model's order: the ops its sender is done
        # with (_peer_progress, op order), then the event's own op (_progress after an
        # accepted gather frame or the phase-1 end), the rest in IDLE (advance)
        own_due = s.due[c]  # context c holds the event's op from LOOKUP on
        own_ok = (ev.kind == Kind.PHASE1_END) | ((ev.kind == Kind.GATHER) & s.accepted)
        peer_ev = (ev.kind == Kind.SCATTER) | (ev.kind == Kind.GATHER)
        s.cx.post_state(m, s.settle, s.tc, c, peer_ev, own_ok & own_due)
        # an end in three states (125 MHz)
        s.cx.end_states(m, self, s.tc, s.T, s.due_end, s.due_reason, s.settle)
