"""The bit-exact, event-driven model of one OptiReduce NIC.

Host port: start_op() (a chunk, its op id and the agreed exponent) in, OpResult out.
Network port: receive() takes Ethernet frames (receive_datagram() bare UBT
datagrams), and the NIC emits Tx frames. Time is the caller's: every call carries
`now` in microsecond ticks, and next_timer() says when the NIC next needs a call
even if nothing arrives. Trace replay, the live driver and the virtual-time
cluster all drive this one object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from optireduce import ubt
from optireduce.counters import COUNTERS
from optireduce.frame_checks import check_op, check_peer
from optireduce.host.model.aggregator import Aggregator
from optireduce.host.model.codec import decode, encode
from optireduce.host.model.deadline import PhaseTracker, TcEstimator, agreed_timeout
from optireduce.host.model.gather_buffer import GatherBuffer
from optireduce.host.model.packetizer import OpContext, gather_frames, scatter_frames
from optireduce.host.model.quantize import EXP_MAX, EXP_MIN
from optireduce.op_stats import OpStats
from optireduce.params import NicParams

# The result of an op with a non-finite input anywhere: float32 quiet NaN, every element.
NONFINITE_RESULT = 0x7FC00000


@dataclass(frozen=True)
class Tx:
    """A frame the NIC puts on its network port."""

    time_us: int
    dst: int
    frame: bytes
    phase: int  # 1 scatter, 2 gather
    op_id: int
    pkt_index: int


# How this NIC chose its ops' exponents (docs/numerics.md 1). Not in COUNTERS: the
# gateware's register bank does not have them yet.
EXP_COUNTERS = (
    "exp_given",  # ops started with the host's exponent (reliable exchange: first K ops, fallback)
    "exp_inband",  # ops agreed in-band with every live rank's proposal in
    "exp_incomplete",  # ops agreed from the proposals that arrived, some live peer's missing
    "exp_followed",  # in-band ops that took the other exponent peers ahead already sent
    "exp_missing",  # live peers' proposals missing at the start of those ops, summed
    "exp_saturated",  # in-band ops whose quantizer saturated here: the host should fall back
)


class InbandExponent(NamedTuple):
    """What the proposals that arrived say about an op's exponent."""

    exponent: int | None  # their max; None when a rank has no proposal (`unknown`)
    missing: tuple[int, ...]  # live peers whose proposal has not arrived
    unknown: tuple[int, ...]  # ranks that sent "no proposal" (this one too, if it gave none)


@dataclass
class OpResult:
    op_id: int
    data: np.ndarray  # float32: the estimated mean
    stats: OpStats


def check_world(p: NicParams, rank: int, world: int) -> None:
    """A NIC's place: 2 <= world <= n_max, 0 <= rank < world (a ValueError otherwise)."""
    if not 2 <= world <= p.n_max:
        raise ValueError(f"world={world}: must be in 2..n_max={p.n_max}")
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank}: must be in 0..world-1={world - 1}")


class _Op:
    """State of one op in the window."""

    def __init__(self, nic: NicModel, op_id: int, n: int, exponent: int) -> None:
        p, world, rank = nic.p, nic.world, nic.rank
        self.op_id, self.n, self.exponent = op_id, n, exponent
        self.n_packets = p.packets_for(n)
        self.started = False
        self.done = False
        # a non-finite input here or in a peer's accepted frame: the gather frames (if
        # set when phase 1 ends) carry FLAG_NONFINITE and the result is NaN; the scatter
        # frames carry it for this rank's own input only (docs/numerics.md 2)
        self.nonfinite = False
        self.agg = Aggregator(p, rank, world, self.n_packets)
        self.gather = GatherBuffer(p, self.n_packets)
        # packets expected from each rank: in phase 1 one per slot we own, in phase 2
        # the slots the sender owns
        mine = len(self.agg.slots)
        owned = np.array([len(range(r, self.n_packets, world)) for r in range(world)])
        exp1 = np.full(world, mine)
        exp1[rank] = 0
        owned[rank] = 0
        self.p1 = PhaseTracker(exp1, p.alpha_q8)
        self.p2 = PhaseTracker(owned, p.alpha_q8)
        self.stats = OpStats(op_id=op_id, rank=rank, world=world, n=n, exponent=exponent)
        self.ctx = OpContext(p, rank, world, op_id, exponent, n, nic.addressing)

    @property
    def phase(self) -> int:
        if self.done:
            return 3
        if not self.started:
            return 0
        return 1 if self.p1.end is None else 2


class NicModel:
    def __init__(
        self,
        p: NicParams,
        rank: int,
        world: int,
        *,
        addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
        first_op: int = 0,
    ) -> None:
        check_world(p, rank, world)
        self.p, self.rank, self.world, self.addressing = p, rank, world, addressing
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.exp_counters = dict.fromkeys(EXP_COUNTERS, 0)
        # target op -> {rank: proposal, None for "no proposal"}, targets in
        # (last_started, base + 2K + lead): a frame of op j proposes for j + lead
        self._proposals: dict[int, dict[int, int | None]] = {}
        # One t_C per phase (index 0: scatter, 1: gather): their durations differ.
        self.tc = (TcEstimator(p), TcEstimator(p))
        self.tc_table = np.full((2, world), p.t_c_init, dtype=np.int64)
        self._t_change = [0, 0]  # tick each phase's agreed timeout T last changed
        self._t_cache: dict[int, tuple] = {}  # phase -> ((phase, t_B), T)
        self.base = first_op  # oldest op not completed: the window is [base, base + K)
        self.last_started = first_op - 1
        self.ops: dict[int, _Op] = {}
        self.gone: set[int] = set()  # peers known dead: nothing more will come from them
        # per peer, the last op it is known to be done with (progress_ahead)
        self.peer_done = [first_op - 1] * self.world
        self._tx: list[Tx] = []
        self._results: list[OpResult] = []

    # ---- host port ---------------------------------------------------------------
    def start_op(
        self,
        now: int,
        op_id: int,
        data: np.ndarray,
        exponent: int | None,
        *,
        next_proposal: int | None = None,
    ) -> None:
        """Begin op op_id with this worker's chunk (float32) and the agreed exponent.

        With NicParams.exp_inband: exponent None takes the in-band agreed value
        (inband_exponent), or the exponent of this op's frames that peers ahead already
        sent, when that differs (the first rank to start an op fixes it). next_proposal is
        this rank's proposal for op op_id + lead (NicParams.exp_lead_eff), carried in
        every packet of this op (None: no proposal; that op needs an exponent given).
        """
        p = self.p
        if not isinstance(data, np.ndarray) or data.dtype != np.float32 or data.ndim != 1:
            raise TypeError("start_op: data must be a 1-D numpy float32 array")
        if not 1 <= len(data) <= p.c:
            raise ValueError(f"start_op: {len(data)} elements; an op holds 1..c={p.c}")
        if (exponent is None or next_proposal is not None) and not p.exp_inband:
            raise ValueError("start_op: in-band exponents need NicParams.exp_inband")
        for name, v in (("exponent", exponent), ("next_proposal", next_proposal)):
            if v is not None and not EXP_MIN <= v <= EXP_MAX:
                raise ValueError(f"start_op: {name} {v} outside int8")
        if op_id != self.last_started + 1:
            raise ValueError(f"start_op: op {op_id} is not the next op ({self.last_started + 1})")
        if not self.base <= op_id < self.base + p.ops_in_flight:
            raise ValueError(
                f"start_op: op {op_id} outside the window [{self.base}, "
                f"{self.base + p.ops_in_flight}): wait for op {self.base} to complete"
            )
        source, missing = "exp_given", ()
        if exponent is None:
            inb = self.inband_exponent(op_id)
            if inb.exponent is None:
                raise ValueError(
                    f"start_op: op {op_id} has no in-band exponent (no proposal from ranks "
                    f"{list(inb.unknown)}): give one"
                )
            held, missing = self.ops.get(op_id), inb.missing
            if held is not None and held.exponent != inb.exponent:
                # peers ahead already sent this op with their exponent: follow them
                exponent, source = held.exponent, "exp_followed"
            else:
                exponent = inb.exponent
                source = "exp_incomplete" if missing else "exp_inband"
        self.advance(now)
        op = self.ops.get(op_id)
        if op is not None and (op.exponent != exponent or op.n != len(data)):
            # Peers sent this op with another exponent or length: theirs cannot be used.
            reason = "exponent_mismatch" if op.exponent != exponent else "bad_length"
            self.counters[reason] += op.agg.clear() + int(op.gather.have.sum())
            op = None
        if op is None:
            op = self.ops[op_id] = self._new_op(op_id, len(data), exponent, now)
        self.last_started = op_id
        self.counters["ops_started"] += 1
        op.started = True
        op.stats.start_us = now
        if p.exp_inband:
            self._proposals.pop(op_id, None)
            self._proposals.setdefault(op_id + p.exp_lead_eff, {})[self.rank] = next_proposal
            op.ctx = dataclasses.replace(op.ctx, reserved=ubt.proposal_word(next_proposal))

        enc = encode(data, exponent, op_id, p)
        st = op.stats
        st.sat_quantize, st.sat_transform, st.nonfinite = (
            enc.sat_quantize, enc.sat_transform, enc.nonfinite,
        )  # fmt: skip
        op.nonfinite = op.nonfinite or enc.nonfinite > 0
        self.exp_counters[source] += 1
        self.exp_counters["exp_missing"] += len(missing)
        if source != "exp_given" and enc.sat_quantize and not enc.nonfinite:
            self.exp_counters["exp_saturated"] += 1  # an inf is not a prediction too small
        packets = enc.y.reshape(op.n_packets, p.p)
        for i in op.agg.slots:
            op.agg.add(int(i), self.rank, packets[i])
        ctx = dataclasses.replace(op.ctx, nonfinite=enc.nonfinite > 0)
        for i, dst, frame in scatter_frames(packets, ctx, self.tc[0].tc):
            self._send(now, op, 1, dst, i, frame)
        op.p1.begin(now)
        self._progress(op, now)

    def poll_results(self) -> list[OpResult]:
        out, self._results = self._results, []
        return out

    def inband_exponent(self, op_id: int) -> InbandExponent:
        """The in-band agreement for op op_id as it stands: the max of the proposals that
        arrived (this rank's own included), which live peers are missing, who gave none."""
        rec = self._proposals.get(op_id, {})
        unknown = sorted(r for r in range(self.world) if rec.get(r) is None
                         and (r in rec or r == self.rank))  # fmt: skip
        missing = tuple(
            r for r in range(self.world) if r != self.rank and r not in self.gone and r not in rec
        )
        exp = None if unknown else max(rec.values())
        return InbandExponent(exp, missing, tuple(unknown))

    def put_proposal(self, op_id: int, rank: int, proposal: int | None) -> None:
        """A proposal the host learnt another way (a reliable fetch from `rank`): it
        replaces whatever arrived in-band for op op_id."""
        if not self.p.exp_inband:
            raise ValueError("put_proposal: in-band exponents need NicParams.exp_inband")
        if not 0 <= rank < self.world:
            raise ValueError(f"put_proposal: rank {rank} outside 0..{self.world - 1}")
        top = self.base + self.p.rx_window + self.p.exp_lead_eff
        if not self.last_started < op_id < top:
            raise ValueError(f"put_proposal: op {op_id} outside ({self.last_started}, {top})")
        if proposal is not None and not EXP_MIN <= proposal <= EXP_MAX:
            raise ValueError(f"put_proposal: proposal {proposal} outside int8")
        self._proposals.setdefault(op_id, {})[rank] = proposal

    # ---- network port ------------------------------------------------------------
    def receive(self, now: int, frame: bytes) -> None:
        """One Ethernet frame from the network port."""
        self.advance(now)
        r = ubt.parse_frame(frame, port=self.p.udp_port, rank=self.rank,
                            addressing=self.addressing, inband=self.p.exp_inband)  # fmt: skip
        self._accept(now, r)

    def receive_datagram(self, now: int, datagram: bytes) -> None:
        """One UBT datagram (the UDP payload), for transports that strip L2-L4."""
        self.advance(now)
        self._accept(now, ubt.parse_ubt(datagram, inband=self.p.exp_inband))

    def poll_tx(self) -> list[Tx]:
        out, self._tx = self._tx, []
        return out

    # ---- time ----------------------------------------------------------------------
    def next_timer(self) -> int | None:
        """Earliest tick at which a phase may end without another arrival."""
        times = [t for op in self.ops.values() if (t := self._op_timer(op)) is not None]
        return min(times) if times else None

    def advance(self, now: int) -> None:
        """Fire every timer due at or before `now`, earliest first."""
        while True:
            due = [
                (t, op.op_id) for op in self.ops.values() if (t := self._op_timer(op)) is not None
            ]
            if not due:
                return
            t, op_id = min(due)
            if t > now:
                return
            self._progress(self.ops[op_id], t)

    def set_t_b(self, t_b_us: int) -> None:
        """A new hard bound for every phase from now on (calibration): the agreed timeouts
        and the t_C estimators' clamp follow it."""
        p = self.p.replace(t_b_us=int(t_b_us))
        self.p = p
        for est in self.tc:
            est.p = p

    def exclude(self, now: int, rank: int) -> None:
        """The driver learnt that `rank` is dead: stop waiting for it, now and later."""
        if rank == self.rank or rank in self.gone:
            return
        self.gone.add(rank)
        for op in list(self.ops.values()):
            if not op.done:
                op.p1.sender_gone(now, rank)
                op.p2.sender_gone(now, rank)
                self._progress(op, now)

    # ---- internals -----------------------------------------------------------------
    def _new_op(self, op_id: int, n: int, exponent: int, now: int) -> _Op:
        op = _Op(self, op_id, n, exponent)
        for r in self.gone:
            op.p1.sender_gone(now, r)
            op.p2.sender_gone(now, r)
        if self.p.progress_ahead:
            for r in range(self.world):
                if self.peer_done[r] >= op_id:
                    op.p1.sender_gone(now, r)
                    op.p2.sender_gone(now, r)
        return op

    def _drop(self, reason: str, op: _Op | None = None) -> None:
        self.counters[reason] += 1
        if op is not None and reason in ("late", "duplicate"):
            setattr(op.stats, reason, getattr(op.stats, reason) + 1)

    def _timeout(self, phase: int) -> int:
        """The agreed timeout T = min(median t_C of the world, t_B), as it stands now."""
        key = (phase, self.p.t_b_us)  # t_B changes on set_t_b
        if self._t_cache.get(phase, (None,))[0] != key:
            self._t_cache[phase] = (key, agreed_timeout(self.tc_table[phase - 1], self.p.t_b_us))
        return self._t_cache[phase][1]

    def _set_tc(self, phase: int, rank: int, tc: int, now: int) -> None:
        if self.tc_table[phase - 1, rank] != tc:
            self.tc_table[phase - 1, rank] = tc
            self._t_change[phase - 1] = now
            self._t_cache.pop(phase, None)

    def _op_timer(self, op: _Op) -> int | None:
        ph = op.p1 if op.phase == 1 else op.p2 if op.phase == 2 else None
        if ph is None:
            return None
        return ph.next_timer(self._timeout(op.phase), self._t_change[op.phase - 1])

    def _accept(self, now: int, r: ubt.ParsedFrame | str) -> None:
        if isinstance(r, str):
            return self._drop(r)
        h, p, world = r.header, self.p, self.world
        reason = check_peer(h, p, self.rank, world) or check_op(h, p, self.rank, world, self.base)
        if p.exp_inband and reason in (None, "stale_op"):
            self._note_proposal(h)  # even a frame dropped below, or of a completed op
        if reason == "future_op" and p.progress_ahead:  # far ahead: done with op_id - K
            self._peer_progress(now, h.sender, h.op_id)
        if reason:
            return self._drop(reason)
        op = self.ops.get(h.op_id)
        if op is None:  # a peer is ahead of us: keep what it sends
            op = self.ops[h.op_id] = self._new_op(h.op_id, h.op_len, h.exponent, now)
        if op.exponent != h.exponent:
            return self._drop("exponent_mismatch", op)
        if op.n != h.op_len:
            return self._drop("bad_length", op)
        phase = 1 if h.msg_type == ubt.MSG_SCATTER else 2
        # piggybacked t_C of a valid peer frame, at most t_c_max_us (above every t_B)
        self._set_tc(phase, h.sender, min(h.t_c_us, self.p.t_c_max_us), now)
        scatter = phase == 1
        self._peer_progress(now, h.sender, h.op_id)
        last = bool(h.flags & ubt.FLAG_LAST)
        values = ubt.payload_values(r.payload)
        if scatter:
            if op.p1.end is not None or op.done:
                return self._drop("late", op)
            if not op.agg.add(h.pkt_index, h.sender, values):
                return self._drop("duplicate", op)
            op.p1.arrive(now, h.sender, last)
            self.counters["rx_scatter"] += 1
        else:
            if op.done:
                return self._drop("late", op)
            if not op.gather.place(h.pkt_index, values, h.contributors):
                return self._drop("duplicate", op)
            op.p2.arrive(now, h.sender, last)
            self.counters["rx_gather"] += 1
        if h.flags & ubt.FLAG_NONFINITE:
            op.nonfinite = True
        self._progress(op, now)
        return None

    def _note_proposal(self, h: ubt.UbtHeader) -> None:
        """Keep the sender's proposal for op_id + lead if that op has not started (the
        first one heard wins: every packet of an op carries the same)."""
        target = h.op_id + self.p.exp_lead_eff
        if target > self.last_started:
            self._proposals.setdefault(target, {}).setdefault(h.sender, ubt.proposal_of(h.reserved))

    def _peer_progress(self, now: int, sender: int, op_id: int) -> None:
        """A NIC starts op j only after op j - K is complete: sender is done with those."""
        done = op_id - self.p.ops_in_flight
        self.peer_done[sender] = max(self.peer_done[sender], done)
        for o in list(self.ops.values()):
            if o.op_id <= done and not o.done:
                o.p1.sender_gone(now, sender)
                o.p2.sender_gone(now, sender)
                self._progress(o, now)

    def _progress(self, op: _Op, now: int) -> None:
        """End whatever phases of op are over at `now`."""
        if op.phase == 1 and (d := op.p1.due(now, self._timeout(1), self._t_change[0])):
            self._end_phase1(op, *d)
        if op.phase == 2 and (d := op.p2.due(now, self._timeout(2), self._t_change[1])):
            self._end_phase2(op, *d)

    def _end_phase(self, phase: int, ph: PhaseTracker, t: int, reason: str) -> None:
        sample = ph.finish(t, reason, self._timeout(phase), self.p.tc_sample)
        if sample is not None:
            self._set_tc(phase, self.rank, self.tc[phase - 1].sample(sample), t)

    def _end_phase1(self, op: _Op, t: int, reason: str) -> None:
        self._end_phase(1, op.p1, t, reason)
        st = op.stats
        st.phase1_reason, st.phase1_end_us = reason, t
        st.phase1_timeout_us = op.p1.timeout
        st.p1_expected, st.p1_received = op.p1.expected, op.p1.received
        st.p1_missing_from = (op.p1.exp - op.p1.rcv).tolist()
        means = op.agg.means()
        for row, i in enumerate(op.agg.slots):
            op.gather.place(int(i), means[row], int(op.agg.count[row]))
        ctx = dataclasses.replace(op.ctx, nonfinite=op.nonfinite)
        g = gather_frames(op.agg.slots, means, op.agg.count, ctx, self.tc[1].tc)
        for i, dst, frame in g:
            self._send(t, op, 2, dst, i, frame)
        op.p2.begin(t, anchor=op.p1.start + op.p1.timeout)

    def _end_phase2(self, op: _Op, t: int, reason: str) -> None:
        p = self.p
        self._end_phase(2, op.p2, t, reason)
        st = op.stats
        st.phase2_reason, st.end_us = reason, t
        st.phase2_timeout_us = op.p2.timeout
        st.p2_expected, st.p2_received = op.p2.expected, op.p2.received
        st.p2_missing_from = (op.p2.exp - op.p2.rcv).tolist()
        st.contributor_hist = op.gather.histogram(self.world).tolist()
        dec = decode(op.gather.z.ravel(), op.gather.have, op.n, op.exponent, op.op_id, p)
        st.sat_output, st.empty_blocks = dec.sat_output, dec.empty_blocks
        x = dec.x
        if op.nonfinite:  # never a number: the same NaN on every rank
            x = np.full(op.n, NONFINITE_RESULT, dtype=np.uint32).view(np.float32)
            st.nonfinite_result = 1
        st.t_c_us = (self.tc[0].tc, self.tc[1].tc)
        op.done = True
        op.agg = op.gather = None  # free the buffers; the context stays for late frames
        self.counters["ops_completed"] += 1
        self._results.append(OpResult(op.op_id, x, st))
        while (o := self.ops.get(self.base)) is not None and o.done:
            del self.ops[self.base]
            self.base += 1

    def _send(self, now: int, op: _Op, phase: int, dst: int, pkt_index: int, frame: bytes) -> None:
        self.counters["tx_scatter" if phase == 1 else "tx_gather"] += 1
        self._tx.append(Tx(now, dst, frame, phase, op.op_id, pkt_index))
