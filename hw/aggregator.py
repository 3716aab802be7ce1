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
  START    the host starts op_id (op_len): phase 1 begins at `now`
           (= NicModel.start_op: own contributions added, then begin)
  OWN      one owned packet of this node's own chunk (from the packetizer), then
           P elements on `i`; the OWN packets of an op come after its START, among
           the network's events, and all before the next START

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
Own packets after the START. The model adds the own contributions at the START; here
they come while the host's data encodes, so that the network's packets need not wait
for it. Sums and counts do not depend on the order, and COMPLETE is judged on the
peers' packets alone (`mine x (world - 1)` expected). What could differ is a phase that
ends before its own packets are in: its end is reported at its tick (the model's order
of ends and t_C samples), but its means wait. Each context counts the own packets still
to come (set by the START, from its op length); the readout does not start a context
while its count is not zero, and while that readout waits (`own_only`) the block takes
OWN events only: other events wait, ticks and timers run, as during any readout. So
every event after the end is taken after its record, as in the model.

Exact except two corners the block cannot see: the model's _peer_progress walks
ops in creation order (a peer frame can create op j + 1 before op j), and it skips
_progress after a gather frame that is late or a duplicate in phase 2 (the gather
buffer's business). Both matter only if two phases end at the same tick.

Outputs. When phase 1 of an op ends: one `end_valid` strobe with op id, reason,
end tick, the T in force, and received/expected packet counts (the model's
OpStats.phase1_*), then the op's owned slots in index order on `o` (P elements
each, first/last per slot) with `o_op`, `o_index`, `o_count` (contributors,
own included) valid on every beat. Counters `cnt_rx`, `cnt_duplicate`, `cnt_late`
are the model's rx_scatter / duplicate / late for scatter frames, each with a strobe
(`inc_*`) in the cycle it moves (hw/event_counts.py).

Structure. One control FSM owns the per-op contexts (registers), the per-sender
table (BRAM) and the slot bitmaps (BRAM) and handles one event at a time; the
accumulators are one BRAM of w_acc-bit lanes, read-modify-written at one beat per
cycle. A readout engine streams the means of an ended op through the reciprocal
multiplier. Nothing is cleared after a readout: an op that claims a context clears
its per-sender entries and slot bitmaps (max(n_max, slots) cycles), and the first
contribution to a slot overwrites its accumulator (so a reset needs no memory
clear either). The accumulator and bitmap memories have one read and one write
port each, so the FSM takes no event while a readout is pending (but OWN events while
it waits for them, above); ticks and timers still run during a readout. The readout
emits one beat per cycle within a slot and spends two cycles between slots on the
contributor count. For 125 MHz the FSM's
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
from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.hw import event_counts
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.carry_select import masked_add
from optireduce.hw.deadline import PhaseContexts, Reason, Settle
from optireduce.hw.mean_readout import MeanReadout
from optireduce.hw.peer_progress import PeerProgress, peer_layout
from optireduce.hw.serial_divider import SerialDivider
from optireduce.hw.staged_write import StagedWrite
from optireduce.hw.streams import element_stream
from optireduce.hw.tc_estimator import owner_estimator, owner_estimator_port, tc_bits
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
            "t_c": tc_bits(p),
        }
    )


def _bits(n: int) -> int:
    """Bits to index n items (at least 1)."""
    return max(1, (n - 1).bit_length())


class Aggregator(wiring.Component):
    """Owner-side phase 1 of up to n_ctx ops in flight (see the module docstring).

    latency(p): cycles from the `end_valid` strobe of a phase end to its first mean on `o`
    (no backpressure, no readout queued before it). Ingest takes P / lanes payload
    beats per packet at one beat per cycle; between packets the event costs about
    n_ctx + 11 cycles (its facts, context lookup, peer-progress scan, row division,
    bitmap check; 1.065 cycles per element in `bench rtl`'s ingest figure at P = 256),
    which the 74 bytes of frame headers ahead of each payload on the wire cover.
    """

    # 8 cycles and the readout's divider (a stage per quotient digit: 10 at w_acc = 35)
    LATENCY_BEFORE_DIVIDER = 8
    ACC_WRITE_DELAY = 2  # cycles from a payload beat's handshake to its accumulator write

    @staticmethod
    def latency(p: NicParams) -> int:
        """Cycles from a phase end's `end_valid` to its first mean (see above)."""
        return Aggregator.LATENCY_BEFORE_DIVIDER + MeanReadout.divider_latency(p)

    @staticmethod
    def sizes(p: NicParams) -> tuple[int, int, int]:
        """(contexts, owned rows per context, beats per packet): the accumulators are
        indexed Cat(beat, row, context)."""
        rows_max = -(-(p.c // p.p) // 2)  # world >= 2
        return 1 << _bits(p.rx_window), rows_max, p.p // p.lanes

    def __init__(
        self,
        p: NicParams,
        tick0: int = 0,
        *,
        tc_external: bool = False,
        **more_ports: wiring.Member,
    ) -> None:
        """`more_ports`: members a variant adds (its accumulator store's port)."""
        self.p, self.tick0 = p, tick0  # tick0: `now` after reset (a test starts near the wrap)
        self.tc_external = tc_external  # the t_C estimator is a bank of the core's (`tc`)
        self.n_ctx, self.rows_max, self.beats = self.sizes(p)
        self.npk_max = p.c // p.p
        super().__init__(
            {
                # configuration (static while ops run)
                "rank": In(range(p.n_max)),
                "world": In(range(p.n_max + 1)),
                "t_b": In(32),
                "t_c_min": In(tc_bits(p), init=p.t_c_min_us),
                "t_c_init": In(tc_bits(p), init=p.t_c_init),
                "alpha_q8": In(9),
                # time
                "tick": In(1),
                "now": Out(p.tick_bits),
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
                "end_tick": Out(p.tick_bits),
                "end_timeout": Out(p.t_b_bits),  # T <= t_B
                "end_received": Out(range(self.rows_max * p.n_max + 1)),
                "end_expected": Out(range(self.rows_max * p.n_max + 1)),
                # status
                "timeout": Out(32),
                "own_tc": Out(tc_bits(p)),
                "own_only": Out(1),  # only OWN events are taken now
                **owner_estimator_port(p, tc_external),
                **event_counts.ports(),  # rx / duplicate / late: counts and strobes
                **more_ports,
            }
        )

    def elaborate(self, platform):
        m = Module()
        s = self._state(m, platform)  # time, t_C and T, the contexts, the memories, the event
        m.submodules.divider = s.div = SerialDivider(_bits(self.npk_max + 1), s.world_shape)
        m.submodules.peer_progress = s.pp = PeerProgress(s.n_ctx, s.n_max, s.rcv_shape)
        m.submodules.readout = s.ro = MeanReadout(self.p, s.n_ctx, s.rows_max, s.w_acc)
        m.d.comb += [s.div.den.eq(self.world), s.pp.hit.eq(s.peer_hit), s.pp.sender.eq(s.ev.sender)]
        self._control(m, s)  # one event at a time, then the phase ends it made due
        self._accumulate(m, s)  # its payload into the accumulators
        self._readout(m, s)  # the means of ended ops onto `o`
        return m

    def _state(self, m: Module, platform) -> SimpleNamespace:
        """The block's registers, memories and shared signals, by section."""
        p = self.p
        s = SimpleNamespace(p=p, platform=platform)
        n_ctx, rows_max, beats, n_max = self.n_ctx, self.rows_max, self.beats, p.n_max
        s.n_ctx, s.rows_max, s.beats, s.n_max = n_ctx, rows_max, beats, n_max
        s.cb, s.rb, s.bb, s.sb = _bits(n_ctx), _bits(rows_max), _bits(beats), _bits(n_max)
        w_acc, lanes = p.w_acc, p.lanes
        s.w_acc, s.lanes = w_acc, lanes
        s.n_cnt = n_cnt = range(n_max + 1)
        s.rcv_shape = rcv_shape = range(rows_max + 1)
        tot_shape = range(rows_max * n_max + 1)
        s.world_shape = range(n_max + 1)

        # ---- time ------------------------------------------------------------------
        s.now = now = Signal(p.tick_bits, init=self.tick0)
        s.pend = Signal(16)  # strobes not yet applied
        s.consume = Signal()
        m.d.sync += s.pend.eq(s.pend + self.tick - s.consume)
        m.d.comb += self.now.eq(now)

        # ---- t_C and T ---------------------------------------------------------------
        tc = s.tc = owner_estimator(m, self, now)

        # ---- per-op contexts (registers) ----------------------------------------------
        s.cx = cx = PhaseContexts(n_ctx, tot_shape, n_cnt, p.tick_bits)
        for name, field in zip(PhaseContexts.FIELDS, cx.fields(), strict=True):
            setattr(s, f"c_{name}", field)
        s.c_mine = Array(Signal(rcv_shape, name=f"mine{k}") for k in range(n_ctx))
        # own packets still to come: the readout of an ended op waits for them
        s.c_own = Array(Signal(rcv_shape, name=f"own{k}") for k in range(n_ctx))
        # per-context end evaluation, registered (the FSM settles after a change)
        s.T, s.due, s.due_end, s.due_reason = cx.evaluate(m, tc, self.alpha_q8, now)
        m.d.comb += self.timeout.eq(s.T)
        s.settle = Settle(n_ctx)  # cycles the end evaluation has been stable

        # ---- memories ---------------------------------------------------------------
        self._accumulator_memory(m, s)
        s.bm_layout = data.StructLayout({"bits": n_max, "count": n_cnt})
        m.submodules.bitmap = bm = Memory(shape=s.bm_layout, depth=n_ctx * (1 << s.rb), init=[])
        s.bm_rd = bm.read_port()
        s.bm_wr = StagedWrite(m, bm.write_port(), "bitmap")
        s.peer_layout = peer_layout(rcv_shape)
        m.submodules.peers = pm = Memory(shape=s.peer_layout, depth=n_ctx * (1 << s.sb), init=[])
        s.pm_rd = pm.read_port()
        s.pm_wr = StagedWrite(m, pm.write_port(), "peers")

        # ---- the event being handled ----------------------------------------------------
        s.ev = ev = Signal(event_layout(p))
        s.ev_now = Signal(p.tick_bits)
        s.c = Signal(s.cb)
        m.d.comb += s.c.eq(ev.op_id[: s.cb])
        s.n_pk = Signal(range(self.npk_max + 1))
        m.d.comb += s.n_pk.eq(
            ((ev.op_len + (p.b - 1)) >> p.log2_b) << (p.log2_b - (p.p.bit_length() - 1))
        )
        # facts of the event, each registered a state before its use (125 MHz): which
        # contexts hold its op, the packets of its op, the ops its sender is done with
        # (op <= op_id - K) and still owes slots
        s.hits, s.done = cx.event_registers()
        s.n_pk_r = Signal(range(self.npk_max + 1))
        s.peer_hit = Signal(n_ctx)  # ... and the sender owes it slots
        s.me = Signal()  # the sender is this rank
        s.who_bit = Signal(n_max)  # the contributor's bit: 1 << (rank if OWN else sender)
        s.mine_e = Signal(rcv_shape)  # the event's context's slot count
        s.clr = Signal(range(max(n_max, rows_max) + 1))  # the entry being cleared
        s.mine_pending = Signal()  # the division in flight is the context's slot count
        s.row = Signal(s.rb)
        s.accepted = Signal()  # the scatter frame was added (not late, not a duplicate)
        s.drop = Signal()
        s.beat = Signal(s.bb)
        s.fresh = Signal()  # the slot's first contribution: it overwrites the accumulator
        s.in_payload = Signal()
        # the memories' outputs registered (a *_REG state) before any logic (125 MHz)
        s.pm_q = Signal(s.peer_layout)
        s.bm_q = Signal(s.bm_layout)

        # ---- phase ends: which is next, and the one being ended --------------------------
        # IDLE by (end, op); POST first the ops the event's sender has finished
        # (op <= ev.op_id - K), as NicModel._peer_progress ends them, in op order (end
        # ticks are all <= now there)
        s.idle_found, s.idle_pick, s.post_found, s.post_pick = cx.picks(m, s.due, s.due_end, s.done)
        s.fire_c, s.ret_post, s.post_b = cx.fire_c, cx.ret_post, cx.post_b
        m.d.sync += self.end_valid.eq(0)  # end report (one-cycle strobe)

        # counters
        s.counts = event_counts.EventCounts(m)
        s.counts.drive(m, self)
        return s

    def _accumulator_memory(self, m: Module, s: SimpleNamespace) -> None:
        """The accumulators: one block RAM of `lanes` w_acc-bit lanes per beat. No read
        sees a write in flight (_accumulate), the readout's included: a read that
        collides with a write is undefined (hw/block_ram.py)."""
        m.submodules.acc = acc = block_ram(
            shape=unsigned(s.lanes * s.w_acc), depth=s.n_ctx * (1 << s.rb) * (1 << s.bb)
        )
        s.acc_wr = acc.write_port()
        s.acc_rd = read_port(m, acc, (s.acc_wr,), platform=s.platform)
        s.i_room = 1  # a payload beat is taken every cycle (a dropped frame's always)
        s.mem_open = 1

    def _control(self, m: Module, s: SimpleNamespace) -> None:
        """The event FSM, its states in the order an event goes through them."""
        # IDLE takes an event, and `ev.ready` says so, on this one condition; a readout
        # waiting for its own packets lets OWN events (only) by
        s.can_take = Signal()
        own_ev = self.ev.payload.kind == Kind.OWN
        m.d.comb += s.can_take.eq(
            ~s.ro.busy & (~s.ro.pending | (self.own_only & own_ev)) & s.mem_open
        )
        with m.FSM() as fsm:
            self._take_states(m, s)  # IDLE: ticks, due phases, the next event; HIT, LOOKUP
            self._claim_states(m, s)  # a new op's context: CLEAR, MINE, MINE_SET
            self._dispatch_states(m, s)  # DISPATCH by kind; TC; GONE (peer progress)
            self._slot_states(m, s)  # LATE, ROW_*: the frame's slot; PAYLOAD
            self._end_states(m, s)  # POST, FIRE*, SETTLE: the phases the event made due
        m.d.comb += self.ev.ready.eq(
            fsm.ongoing("IDLE") & ~(s.pend != 0) & ~s.idle_found & s.can_take
        )

    def _take_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, K = s.ev, s.c, self.p.ops_in_flight
        with m.State("IDLE"):
            # the event's registers load in every IDLE cycle (only HIT on reads them):
            # their enable is the state alone, not the take decision (125 MHz)
            m.d.sync += [
                ev.eq(self.ev.payload),
                s.ev_now.eq(s.now),
                s.post_b.eq(0),
                s.accepted.eq(0),
            ]
            with m.If(s.pend != 0):
                m.d.comb += s.consume.eq(1)
                m.d.sync += [s.now.eq(s.now + 1), s.settle.restart(), s.ret_post.eq(0)]
                m.next = "SETTLE"
            with m.Elif(s.idle_found):
                m.d.sync += [s.fire_c.eq(s.idle_pick), s.ret_post.eq(0)]
                m.next = "FIRE"
            with m.Elif(s.can_take), m.If(self.ev.valid):
                m.next = "HIT"

        with m.State("HIT"):
            s.cx.take_event(m, ev.op_id, K)
            who = Mux(ev.kind == Kind.OWN, self.rank, ev.sender)
            m.d.sync += [
                s.n_pk_r.eq(s.n_pk),
                s.me.eq(ev.sender == self.rank),
                s.who_bit.eq(Const(1, s.n_max) << who),
            ]
            m.next = "LOOKUP"

        with m.State("LOOKUP"):
            # slots owned: (n_packets - 1 - rank) // world + 1, divided while clearing (a
            # claim) or, for a START of a context its peers made, its own packets' count
            claim = ~s.hits.bit_select(c, 1)
            m.d.sync += s.mine_pending.eq(s.n_pk_r > self.rank)
            m.d.comb += [
                s.div.num.eq(s.n_pk_r - 1 - self.rank),
                s.div.go.eq((claim | (ev.kind == Kind.START)) & (s.n_pk_r > self.rank)),
            ]
            with m.If(claim):
                # claim the context: its previous op is done (and read out)
                m.d.sync += [*s.cx.claim(c, ev.op_id), s.clr.eq(0)]
                m.next = "CLEAR"
            with m.Elif(ev.kind == Kind.START):
                m.next = "OWN_COUNT"
            with m.Else():
                m.next = "DISPATCH"

    def _claim_states(self, m: Module, s: SimpleNamespace) -> None:
        c, n_max, rows_max, clr = s.c, s.n_max, s.rows_max, s.clr
        n_clear = max(n_max, rows_max)
        with m.State("CLEAR"):  # the context's per-sender table and slot bitmaps
            m.d.sync += [
                s.pm_wr.addr.eq(Cat(clr[: s.sb], c)),
                s.pm_wr.en.eq(clr < n_max),
                s.pm_wr.data.eq(0),
                s.bm_wr.addr.eq(Cat(clr[: s.rb], c)),
                s.bm_wr.en.eq(clr < rows_max),
                s.bm_wr.data.eq(0),
            ]
            m.d.sync += clr.eq(clr + 1)
            with m.If(clr == n_clear - 1):
                m.next = "MINE"

        # the own packets to come are the START's (the host's op length, should the peers
        # that made the context have sent another: no count then waits for ever)
        with m.State("OWN_COUNT"), m.If(~s.div.busy):
            m.d.sync += s.c_own[c].eq(Mux(s.mine_pending, s.div.q + 1, 0))
            m.next = "DISPATCH"

        mine_r = Signal(s.rcv_shape)
        with m.State("MINE"), m.If(~s.div.busy):
            m.d.sync += mine_r.eq(Mux(s.mine_pending, s.div.q + 1, 0))
            m.next = "MINE_SET"
        with m.State("MINE_SET"):
            senders = Mux(mine_r != 0, self.world - 1, 0)
            m.d.sync += [
                s.c_mine[c].eq(mine_r),
                s.c_own[c].eq(mine_r),
                s.c_exp[c].eq(mine_r * (self.world - 1)),
                s.c_unflag[c].eq(senders),
                s.c_owing[c].eq(senders),
            ]
            m.next = "DISPATCH"

    def _dispatch_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, ev_now, pp = s.ev, s.c, s.ev_now, s.pp
        with m.State("DISPATCH"):
            # the event's facts over the contexts, all in parallel (registered)
            fin = s.cx.mark_done(m)
            m.d.sync += [
                s.peer_hit.eq(Cat(
                    s.c_valid[k] & ~s.c_ended[k] & (s.c_mine[k] != 0) & ~s.me & fin[k]
                    for k in range(s.n_ctx)
                )),
                s.mine_e.eq(s.c_mine[c]),
            ]  # fmt: skip
            with m.Switch(ev.kind):
                with m.Case(Kind.SCATTER):
                    m.d.comb += [s.div.go.eq(1), s.div.num.eq(ev.pkt_index)]  # its slot row
                    m.next = "TC"
                with m.Case(Kind.GATHER):
                    m.d.comb += pp.start.eq(1)
                    m.next = "GONE"
                with m.Case(Kind.OWN):
                    m.d.comb += [s.div.go.eq(1), s.div.num.eq(ev.pkt_index)]
                    m.next = "ROW_WAIT"
                with m.Case(Kind.START):
                    m.d.sync += [
                        *s.cx.begin(c, ev_now, ev_now),
                        s.settle.restart(),
                    ]
                    m.next = "POST"

        tc = s.tc
        with m.State("TC"):  # the sender's piggybacked t_C (frames past check 28)
            m.d.comb += [
                tc.update.valid.eq(1),
                tc.update.payload.rank.eq(ev.sender),
                tc.update.payload.value.eq(ev.t_c),
                tc.update.payload.at.eq(ev_now),
            ]
            with m.If(tc.update.ready):
                m.d.comb += pp.start.eq(1)
                m.next = "GONE"

        # peer progress: the sender has finished every op <= ev.op_id - K
        m.d.comb += pp.owed.eq(s.c_mine[pp.ctx])
        with m.State("GONE"):
            pp.serve(m, s.pm_rd, s.pm_wr, s.cx, ev_now)
            with m.If(pp.done):
                with m.If(ev.kind == Kind.SCATTER):
                    m.next = "LATE"
                with m.Else():
                    m.d.sync += s.settle.restart()
                    m.next = "POST"

    def _slot_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c, ev_now = s.ev, s.c, s.ev_now
        bm_q, pm_q, who_bit, row = s.bm_q, s.pm_q, s.who_bit, s.row
        with m.State("LATE"):
            with m.If(s.c_ended[c]):
                # the peer-progress and t_C changes before: settle from here on
                m.d.sync += [
                    *s.counts.step("late"),
                    s.drop.eq(1),
                    s.beat.eq(0),
                    s.settle.restart(),
                ]
                m.next = "PAYLOAD"
            with m.Else():
                m.next = "ROW_WAIT"

        with m.State("ROW_WAIT"), m.If(~s.div.busy):
            m.d.comb += [
                s.bm_rd.addr.eq(Cat(s.div.q[: s.rb], c)),
                s.pm_rd.addr.eq(Cat(ev.sender[: s.sb], c)),
            ]
            m.d.sync += row.eq(s.div.q)
            m.next = "ROW_REG"

        dup, last_new, owed = Signal(), Signal(), Signal()
        with m.State("ROW_REG"):
            m.d.sync += [bm_q.eq(s.bm_rd.data), pm_q.eq(s.pm_rd.data)]
            m.next = "ROW_FACTS"
        with m.State("ROW_FACTS"):
            m.d.sync += [
                dup.eq((ev.kind == Kind.SCATTER) & (bm_q.bits & who_bit).any()),
                last_new.eq(ev.last & ~pm_q.flagged),
                owed.eq((pm_q.rcv + 1 == s.mine_e) & ~pm_q.gone),
            ]
            m.next = "ROW_CHECK"

        with m.State("ROW_CHECK"):
            # a slot's first contribution overwrites: the accumulators need no clearing;
            # the context (and T) may change here: settle from here on
            m.d.sync += [
                s.drop.eq(0),
                s.beat.eq(0),
                s.fresh.eq(bm_q.count == 0),
                s.settle.restart(),
            ]
            with m.If(dup):
                m.d.sync += [*s.counts.step("duplicate"), s.drop.eq(1)]
            with m.Else():
                m.d.sync += [
                    s.bm_wr.addr.eq(Cat(row, c)),
                    s.bm_wr.en.eq(1),
                    s.bm_wr.data.bits.eq(bm_q.bits | who_bit),
                    s.bm_wr.data.count.eq(bm_q.count + 1),
                ]
                with m.If(ev.kind == Kind.SCATTER):
                    m.d.sync += [
                        s.pm_wr.addr.eq(Cat(ev.sender[: s.sb], c)),
                        s.pm_wr.en.eq(1),
                        s.pm_wr.data.rcv.eq(pm_q.rcv + 1),
                        s.pm_wr.data.flagged.eq(pm_q.flagged | ev.last),
                        s.pm_wr.data.gone.eq(pm_q.gone),
                    ]
                    m.d.sync += [
                        s.accepted.eq(1),
                        *s.counts.step("rx"),
                        *s.cx.arrival(c, ev_now),
                    ]
                    with m.If(last_new):
                        m.d.sync += s.c_unflag[c].eq(s.c_unflag[c] - 1)
                    with m.If(owed):
                        m.d.sync += s.c_owing[c].eq(s.c_owing[c] - 1)
            m.next = "PAYLOAD"

        with m.State("PAYLOAD"):
            m.d.comb += [s.in_payload.eq(1), self.i.ready.eq(s.i_room | s.drop)]
            # the context changed before the payload: the end evaluation settles meanwhile
            s.settle.step(m, s.tc)
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += s.beat.eq(s.beat + 1)
                with m.If(s.beat == s.beats - 1):
                    with m.If(ev.kind == Kind.OWN):
                        m.d.sync += s.c_own[c].eq(s.c_own[c] - 1)
                    m.next = "POST"

    def _end_states(self, m: Module, s: SimpleNamespace) -> None:
        ev, c = s.ev, s.c
        # end what the event made due, in the model's order: the ops its sender is done
        # with (_peer_progress), then the event's own op (_progress after an accepted
        # frame or a start), then the rest by (end tick, op) in IDLE (advance)
        own_due = s.due[c]  # context c holds the event's op from LOOKUP on
        own_ok = (
            (ev.kind == Kind.START)
            | (ev.kind == Kind.GATHER)
            | ((ev.kind == Kind.SCATTER) & s.accepted)
        )
        peer_ev = (ev.kind == Kind.SCATTER) | (ev.kind == Kind.GATHER)
        s.cx.post_state(m, s.settle, s.tc, c, peer_ev, own_ok & own_due)

        # an end in three states (125 MHz); an op with slots here is read out
        f_mine = Signal()

        def queue_readout(m):
            m.d.comb += [s.ro.push.eq(f_mine), s.ro.push_ctx.eq(s.fire_c)]

        s.cx.end_states(m, self, s.tc, s.T, s.due_end, s.due_reason, s.settle,
                        select=[(f_mine, s.c_mine[s.fire_c] != 0)],
                        report=queue_readout)  # fmt: skip

    def _accumulate(self, m: Module, s: SimpleNamespace) -> None:
        """Read-modify-write, one beat per cycle: the read issued, its output registered,
        added and written (ACC_WRITE_DELAY cycles after the beat); a packet's beats are
        distinct addresses, and the next packet comes many cycles later, so no read sees
        a write in flight."""
        beat, row, c, w_acc = s.beat, s.row, s.c, s.w_acc
        acc_rd, acc_wr = s.acc_rd, s.acc_wr
        acc_v, acc_v2 = Signal(), Signal()
        acc_addr, acc_addr2 = Signal(len(acc_wr.addr)), Signal(len(acc_wr.addr))
        acc_vals = Signal(data.ArrayLayout(signed(self.p.w_wire), s.lanes))
        acc_vals2 = Signal(data.ArrayLayout(signed(self.p.w_wire), s.lanes))
        acc_old = Signal(s.lanes * w_acc)
        addr = Cat(beat, row, c)
        m.d.sync += acc_v.eq(0)
        with m.If(s.in_payload & self.i.valid):
            m.d.comb += acc_rd.addr.eq(addr)
            m.d.sync += [
                acc_v.eq(~s.drop),
                acc_addr.eq(addr),
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
            for k in range(s.lanes):
                # a fresh slot's old word is ignored: in the adder's carry chain on the ECP5
                acc = masked_add(m, acc_vals2[k], acc_old[k * w_acc : (k + 1) * w_acc], ~s.fresh,
                                 platform=s.platform, name=f"acc_sum{k}", width=w_acc)  # fmt: skip
                m.d.comb += acc_wr.data[k * w_acc : (k + 1) * w_acc].eq(acc)

    def _readout(self, m: Module, s: SimpleNamespace) -> None:
        """The means of an ended op (hw/mean_readout.py) on the memories' read ports
        when no payload uses them."""
        ro = s.ro
        own_wait = s.c_own[ro.head] != 0  # the next readout's own packets are not all in
        m.d.comb += [
            ro.rank.eq(self.rank),
            ro.world.eq(self.world),
            ro.hold.eq(s.in_payload | own_wait),
            self.own_only.eq(ro.pending & own_wait),
            ro.head_mine.eq(s.c_mine[ro.head]),
            ro.op.eq(s.c_op[ro.ctx]),
            ro.bm_count.eq(s.bm_rd.data.count),
        ]
        with m.If(ro.bm_read):
            m.d.comb += s.bm_rd.addr.eq(ro.bm_addr)
        self._readout_memory(m, s)
        wiring.connect(m, ro.o, wiring.flipped(self.o))
        m.d.comb += [
            self.o_op.eq(ro.o_op),
            self.o_index.eq(ro.o_index),
            self.o_count.eq(ro.o_count),
        ]

    def _readout_memory(self, m: Module, s: SimpleNamespace) -> None:
        """The readout's accumulator reads: the memory's read port when no payload uses it."""
        ro = s.ro
        m.d.comb += ro.acc_data.eq(s.acc_rd.data)
        with m.If(~s.in_payload):
            m.d.comb += s.acc_rd.en.eq(ro.acc_en)
        with m.If(ro.acc_issue):
            m.d.comb += s.acc_rd.addr.eq(ro.acc_addr)
