"""The NIC core: every datapath block wired into one component, event-equal to NicModel.

Model: `host/model/nic_model.py: NicModel` (one NIC, driven by host commands, network frames
and ticks). Interface: docs/nic_core.md (ports, host-port words, STATS record, idle).

Data path, in the order the data flows (elaborate() reads the same way):

  host_cmd/host_i ─► encoder ─► packetizer (source 0) ┬─► frames ─────────────► net_tx
                                                     └─► own packets ─► aggregator (OWN, START)
  net_rx ─► parser ─► op checks 27/28 ─┬─ SCATTER ─► aggregator (+ payload)
                                       └─ GATHER  ─► aggregator (peer progress)
                                                       └► tracker verdict ─► gather buffer
  aggregator ─┬─ phase-1 ends ─► tracker (PHASE1_END, in the tracker's event FIFO)
              └─ means ─┬─► packetizer (source 1) ─► net_tx
                        └─► gather buffer (own slots)
  tracker phase-2 end ─► drain queue ─► decoder (DRAIN) ─► host_o: n results, STATS record
  counters ─► CSR bank (every name of nic_model.COUNTERS)

Event order (what makes it exact): the aggregator takes one event at a time, stamped
with its `now`; every event it takes (but OWN) and every phase-1 end it reports go
into ONE FIFO, in that order, which is the gather tracker's event stream
(hw/gather_tracker.py, "Ordering contract"). The tracker's `time` is the
aggregator's `now` of the last cycle the aggregator could take an event, delayed a
few cycles so that a phase-1 end it reported is in the FIFO first. A gather frame's
payload waits in the parser until the tracker's verdict for it. A START is taken only
when no event is in flight anywhere: the model starts a queued op after the input
before it has had all its effects (and its scatter frames carry that moment's t_C).
The START goes to the aggregator once its context is made, before the op encodes; the
op's own packets follow among the network's events, first while a readout waits for
them (hw/aggregator.py, "Own packets after the START").

Contexts: op j lives in context j mod n_ctx (n_ctx = smallest power of two >= 2K, as
in the aggregator and the tracker); the gather buffer has n_ctx slots. A context is
made by the first accepted frame or START of its op; the receive window
[base, base + 2K) guarantees that the op a context held before is complete, and a
context whose op is still draining is not reused until its STATS record is out.

In-band exponents (NicParams.exp_inband): the parser's notes fill the proposal table
(hw/proposal_table.py); a START with `inband` takes its agreed value, or follows the
context peers ahead made (NicModel.start_op); the op's proposal word rides in `reserved`.

Accumulators and gather slots in SDRAM (NicParams.sdram_addr_bits): the aggregator is
SdramAggregator (hw/sdram_aggregator.py), its store on `acc_mem`, and the decoder's
gather buffer is SdramGatherBuffer (hw/sdram_gather_buffer.py) on `gather_mem`: two of
litedram's native ports in `sdram_domain`, the accumulators from word 0 and the gather
slots after them. Every result is the same, only its timing changes. `idle` waits for
the controller's init (no event is taken before it) and stays low after `sdram_fault`
(sticky, in `sdram_domain`: a read word the gather buffer had no room for; never, by
its depths), which a board shows on its LED.

One FWHT (NicParams.fwht_shared): the encoder's forward and the decoder's inverse
transform take turns in one SharedFwht, a whole block at a time (hw/shared_fwht.py):
an encode block once all of it is buffered, a decode block once there is room after it
for all of it, so neither host_i's words nor host_o's reader holds the other direction.

Documented gaps (docs/nic_core.md): NicModel.exclude and put_proposal (no port), the
start-time purge of an op whose peers used another exponent or length (the START uses
the context the frames made), an `inband` START with no in-band value (the model refuses
it; here it runs at the START's exponent), sat_output counts the padding of an op whose
n is not a whole number of blocks.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from optireduce import host_port, ubt
from optireduce.host.model.nic_model import NicModel
from optireduce.hw import gather_tracker as gt
from optireduce.hw.addresses import plus_base
from optireduce.hw.aggregator import Aggregator
from optireduce.hw.aggregator import Kind as AggKind
from optireduce.hw.csr import ALL_COUNTERS, HOST_COUNTERS, Csr
from optireduce.hw.deadline import op_same
from optireduce.hw.decoder import Decoder
from optireduce.hw.encoder import Encoder
from optireduce.hw.gather_buffer import GatherOp
from optireduce.hw.gather_tracker import GatherTracker, Verdict
from optireduce.hw.op_records import OpRecords
from optireduce.hw.packetizer import Packetizer
from optireduce.hw.parser import PARSER_CODES, PARSER_REASONS, Parser
from optireduce.hw.proposal_table import ProposalTable
from optireduce.hw.sdram_aggregator import SdramAggregator
from optireduce.hw.sdram_controller import native_port
from optireduce.hw.sdram_gather_buffer import SdramGatherBuffer
from optireduce.hw.shared_fwht import SharedFwht
from optireduce.hw.sign_flip_ahead import sign_words
from optireduce.hw.streams import float_stream, frame_stream
from optireduce.hw.tc_estimator import TcEstimator, changed, saturated_tc, tc_bits
from optireduce.params import NicParams

STATS_FIXED = len(host_port.STATS_FIELDS)  # record words before the histogram
HEAD_WORDS = len(host_port.HEAD_FIELDS)  # the record's first words lead an op's results
IDLE_HOLD = 4  # cycles the no-work condition must hold: covers the blocks' inner pipelines
TIME_DELAY = 2  # cycles the tracker's `time` lags the aggregator's idle `now`
TRACKER_FIFO_DEPTH = 16
SDRAM_PORTS = ("acc", "gather")  # the core's SDRAM users, a port each (`<name>_mem`)


def host_cmd_layout() -> data.StructLayout:
    """START: op id, length, the host's exponent; with NicParams.exp_inband, `inband` asks
    for the NIC's agreed exponent instead, and `proposal` is this rank's proposal word for
    op op_id + lead (ubt.proposal_word; 0: none)."""
    return data.StructLayout(
        {"op_id": 32, "n": 32, "exponent": signed(8), "inband": 1, "proposal": 16}
    )


def host_word_layout() -> data.StructLayout:
    """host_o: an op's HEAD_WORDS head words (`head` set: the op id, n and exponent, as
    its record will say), its n results, then its STATS record (`last` on its end)."""
    return data.StructLayout({"data": 32, "last": 1, "head": 1})


def end_strobe(m: Module, name: str, end_valid, busy) -> tuple[Signal, Signal]:
    """An owner's end strobe, held until its estimator bank is not busy: then own_tc holds
    the end's sample (the bank's requests may wait for the other's). The owner takes no
    event before that (it settles after the bank is idle), so the end's fields hold.
    Returns (the delayed strobe, an end is waiting)."""
    wait = Signal(name=f"{name}_wait")
    strobe = Signal(name=f"{name}_d")
    m.d.comb += strobe.eq(wait & ~busy)
    with m.If(end_valid):
        m.d.sync += wait.eq(1)
    with m.Elif(strobe):
        m.d.sync += wait.eq(0)
    return strobe, wait


def stats_len(world: int) -> int:
    """Words of one STATS record for this world size."""
    return STATS_FIXED + world + 1


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


class NicCore(wiring.Component):
    """One OptiReduce NIC (see the module docstring and docs/nic_core.md)."""

    MODEL = NicModel

    def __init__(
        self,
        p: NicParams,
        addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
        tick0: int = 0,
        *,
        sdram_domain: str = "sync",
    ) -> None:
        if p.lanes != 1:
            raise ValueError(f"NicCore: lanes={p.lanes}; the core runs one element per cycle")
        self.p, self.addressing = p, addressing
        self.tick0 = tick0  # `now` after reset (a test starts the clock near its wrap)
        self.n_ctx = 1 << _bits(p.rx_window)
        self.csr = Csr(p, addressing)
        self.sdram_domain = sdram_domain  # the SDRAM ports' clock
        # the SDRAM's ports (sdram_addr_bits): the accumulators' and the gather slots'
        mem = {f"{name}_mem": Out(native_port(p.sdram_addr_bits)) for name in SDRAM_PORTS
               if p.sdram_addr_bits}  # fmt: skip
        if mem:  # sticky, in sdram_domain: a read word the gather buffer had no room for
            mem["sdram_fault"] = Out(1)
        super().__init__(
            {
                "tick": In(1),
                "now": Out(p.tick_bits),
                "idle": Out(1),
                "events_idle": Out(1),  # idle but for the host's encode and the outputs
                "net_rx": In(frame_stream(8)),
                "net_tx": Out(frame_stream(8)),
                "host_cmd": In(stream.Signature(host_cmd_layout())),
                "host_i": In(float_stream(1)),
                "host_o": Out(stream.Signature(host_word_layout())),
                "csr_addr": In(self.csr.addr_bits),
                "csr_w_en": In(1),
                "csr_w_data": In(32),
                "csr_r_en": In(1),
                "csr_r_data": Out(32),
                "csr_r_valid": Out(1),
                # a board's host adapter's events, a strobe per ADAPTER_COUNTERS name
                # (its shell brings them into this domain), counted in the host block
                "adapter_counts": In(len(host_port.ADAPTER_COUNTERS)),
                **mem,
            }
        )

    def elaborate(self, platform):
        m = Module()
        s = self._blocks(m)
        self._contexts(m, s)
        self._aggregator_events(m, s)
        self._host_side(m, s)
        self._exponent(m, s)
        self._host_fsm(m, s)
        self._aggregator_input(m, s)
        self._network_side(m, s)
        self._tracker_events(m, s)
        self._phase2_ends(m, s)
        self._means(m, s)
        self._net_tx(m, s)
        self._drain(m, s)
        self._counters(m, s)
        self._idle(m, s)
        return m

    def _blocks(self, m: Module) -> SimpleNamespace:
        """The blocks and their configuration from the register bank."""
        p = self.p
        n_ctx, cb, K = self.n_ctx, _bits(self.n_ctx), p.ops_in_flight
        npk_max = p.c // p.p
        log2_ppb = p.packets_per_block.bit_length() - 1

        def slot_of(op_id):
            return op_id[:cb]

        def n_packets(n):
            """packets_for(n) for 1 <= n <= c."""
            return ((n + p.b - 1) >> p.log2_b) << log2_ppb

        # ---- blocks ------------------------------------------------------------------------
        m.submodules.csr = csr = self.csr
        m.submodules.parser = parser = Parser(p)
        if p.sdram_addr_bits:
            agg = SdramAggregator(p, p.sdram_addr_bits, 0, self.tick0, tc_external=True,
                                  mem_domain=self.sdram_domain)  # fmt: skip
            wiring.connect(m, agg.mem, wiring.flipped(self.acc_mem))
        else:
            agg = Aggregator(p, self.tick0, tc_external=True)
        m.submodules.aggregator = agg
        m.submodules.tracker = trk = GatherTracker(p, self.tick0, tc_external=True)
        # one t_C estimator: bank 0 is phase 1's (the aggregator's), bank 1 phase 2's
        m.submodules.tc = tce = TcEstimator(p, banks=2)
        wiring.connect(m, tce.b0, agg.tc)
        wiring.connect(m, tce.b1, trk.tc)
        m.submodules.encoder = enc = Encoder(p)
        # one packetizer, two sources: the scatter packets first, then the means' (gather)
        m.submodules.packetizer = pk = Packetizer(p, self.addressing, sources=2)
        pks, pkg = pk.sources
        gather = None
        if p.sdram_addr_bits:
            # the accumulators from word 0, the gather slots right after them (each
            # raises if it does not fit the address bits)
            base = 1 << SdramAggregator.index_width(p)[1]
            gather = SdramGatherBuffer(p, p.sdram_addr_bits, n_ctx, base,
                                       mem_domain=self.sdram_domain)  # fmt: skip
        m.submodules.decoder = dec = Decoder(p, slots=n_ctx, gather=gather)
        if gather is not None:
            wiring.connect(m, dec.gather_mem, wiring.flipped(self.gather_mem))
            m.d.comb += self.sdram_fault.eq(dec.gather_fault)
        if enc.external:  # one FWHT for both (NicParams.fwht_shared): encode a, decode b
            m.submodules.fwht = fw = SharedFwht(p, p.w_in, p.w_wire)
            wiring.connect(m, enc.to_fwht, fw.a_i)
            wiring.connect(m, fw.a_o, enc.from_fwht)
            wiring.connect(m, dec.to_fwht, fw.b_i)
            wiring.connect(m, fw.b_o, dec.from_fwht)
        tbl = None
        if p.exp_inband:
            m.submodules.proposals = tbl = ProposalTable(p)

        # ---- configuration: the register bank -----------------------------------------------
        m.d.comb += [
            csr.addr.eq(self.csr_addr),
            csr.w_en.eq(self.csr_w_en),
            csr.w_data.eq(self.csr_w_data),
            csr.r_en.eq(self.csr_r_en),
            self.csr_r_data.eq(csr.r_data),
            self.csr_r_valid.eq(csr.r_valid),
            *(getattr(csr, f"inc_{name}").eq(self.adapter_counts[j])
              for j, name in enumerate(HOST_COUNTERS)),
        ]  # fmt: skip
        rank, world = csr.rank, csr.world
        for blk in (agg, trk, tce):
            m.d.comb += [
                blk.rank.eq(rank),
                blk.world.eq(world),
                blk.t_b.eq(csr.t_b_us),
                blk.t_c_min.eq(csr.t_c_min_us),
                blk.t_c_init.eq(csr.t_c_init_us),
            ]
        m.d.comb += [agg.alpha_q8.eq(csr.alpha_q8), trk.alpha_q8.eq(csr.alpha_q8)]
        for src in (pks, pkg):
            m.d.comb += [src.rank.eq(rank), src.world.eq(world), src.job_id.eq(p.job_id)]
        m.d.comb += [
            parser.rank.eq(rank),
            parser.world.eq(world),
            parser.mac.eq(plus_base(self.addressing.mac_base, rank, 48)),
            parser.ip.eq(plus_base(self.addressing.ip_base + 1, rank, 32)),
            parser.admit.eq(csr.admit),
            parser.peer_ip.eq(csr.peer_ip),
            parser.peer_port.eq(csr.peer_port),
            agg.tick.eq(self.tick),
            self.now.eq(agg.now),
        ]
        s = SimpleNamespace(
            p=p,
            n_ctx=n_ctx,
            cb=cb,
            K=K,
            npk_max=npk_max,
            slot_of=slot_of,
            n_packets=n_packets,
            csr=csr,
            parser=parser,
            agg=agg,
            trk=trk,
            enc=enc,
            tce=tce,
            pk=pk,
            pks=pks,
            pkg=pkg,
            dec=dec,
            tbl=tbl,
            rank=rank,
            world=world,
        )
        return s

    def _contexts(self, m: Module, s: SimpleNamespace) -> None:
        """Op contexts (registers, op j in context j mod n_ctx), their STATS words, the
        receive window and the one maker of contexts."""
        p, n_ctx, cb, slot_of, parser, agg = self.p, self.n_ctx, s.cb, s.slot_of, s.parser, s.agg
        trk, enc = s.trk, s.enc

        # ---- op contexts (registers, op j in context j mod n_ctx) ---------------------------
        def regs(name, shape, init=0):
            return Array(Signal(shape, name=f"{name}{k}", init=init) for k in range(n_ctx))

        c_valid, s.c_op = regs("ctx_valid", 1), regs("ctx_op", 32)

        def holds(op_id):
            """Op `op_id`'s context slot holds it (by the op's low bits: hw/deadline.py,
            op_same; a maker never goes back, as an owner's claim does not)."""
            k = slot_of(op_id)
            return c_valid[k] & op_same(s.c_op[k], op_id, n_ctx)

        s.holds = holds
        s.c_n, s.c_exp = regs("ctx_n", range(p.c + 1)), regs("ctx_exp", signed(8))
        s.c_done, s.c_draining = regs("ctx_done", 1), regs("ctx_draining", 1)
        s.c_start = regs("ctx_start", p.tick_bits)
        s.c_gtc, s.c_gtc_ok = regs("ctx_gtc", tc_bits(p)), regs("ctx_gtc_ok", 1)
        s.c_means = regs("ctx_means", 1)  # the op's own means are in the gather buffer
        s.c_encoded = regs("ctx_encoded", 1)  # its encode's counts are recorded (STATS)
        s.c_word = regs("ctx_word", 16)  # the proposal word its frames carry (exp_inband)

        # STATS words kept per op until its record is out, by the moment they are written
        def ended(blk, n: int, tick_name: str) -> dict:
            return {tick_name: blk.end_tick[:32], f"phase{n}_reason": blk.end_reason,
                    f"phase{n}_timeout_us": blk.end_timeout, f"p{n}_expected": blk.end_expected,
                    f"p{n}_received": blk.end_received}  # fmt: skip

        s.rec_words = {
            "phase1": ended(agg, 1, "phase1_end_us"),
            "phase2": ended(trk, 2, "end_us"),
            "encode": {"sat_quantize": enc.sat_quantize, "sat_transform": enc.sat_transform,
                       "nonfinite": enc.nonfinite},
        }  # fmt: skip
        bits = {g: {name: len(v) for name, v in ws.items()} for g, ws in s.rec_words.items()}
        # the writer's order: an owner's end first (it may end again once it has settled)
        s.rec = OpRecords(m, n_ctx, {
            "phase1": bits["phase1"], "phase2": bits["phase2"],
            "tc": {"t_c_phase1_us": tc_bits(p), "t_c_phase2_us": tc_bits(p)},
            "encode": bits["encode"],
        })  # fmt: skip

        s.base = Signal(32)  # oldest op not complete: the window is [base, base + 2K)
        s.next_op = Signal(32)  # the op the host starts next
        m.d.comb += parser.base.eq(s.base)
        bs = slot_of(s.base)
        with m.If(s.holds(s.base) & s.c_done[bs]):
            m.d.sync += s.base.eq(s.base + 1)

        # a context is made by its op's first accepted frame or START (one maker at a time)
        s.mk_go, s.mk_slot = Signal(), Signal(cb)
        s.mk_op, s.mk_n, s.mk_exp = Signal(32), Signal(range(p.c + 1)), Signal(signed(8))
        s.clr_req, s.clr_slot = Signal(), Signal(cb)  # the gather-buffer slot to clear first
        with m.If(s.mk_go):
            m.d.sync += [
                c_valid[s.mk_slot].eq(1),
                s.c_op[s.mk_slot].eq(s.mk_op),
                s.c_n[s.mk_slot].eq(s.mk_n),
                s.c_exp[s.mk_slot].eq(s.mk_exp),
                s.c_done[s.mk_slot].eq(0),
                s.c_gtc_ok[s.mk_slot].eq(0),
                s.c_means[s.mk_slot].eq(0),
                s.c_encoded[s.mk_slot].eq(0),
                s.c_start[s.mk_slot].eq(0),
                s.clr_req.eq(1),
                s.clr_slot.eq(s.mk_slot),
            ]
            s.rec.clear(m, s.mk_slot)

        # ---- counters: strobes merged per counter into the CSR bank ----------------------
        s.incs = {name: [] for name in ALL_COUNTERS}

    def _aggregator_events(self, m: Module, s: SimpleNamespace) -> None:
        """The aggregator's event port: host side (OWN, START) or network side."""
        p, n_ctx, agg = self.p, self.n_ctx, s.agg
        s.ev_h, s.ev_r = Signal(agg.ev.payload.shape()), Signal(agg.ev.payload.shape())
        s.ev_h_valid, s.ev_r_valid = Signal(), Signal()
        # the aggregator's end, held until own_tc holds this end's sample (its bank idle)
        s.end_d, s.end_busy = end_strobe(m, "end", agg.end_valid, s.tce.b0.busy)
        s.fifo = SyncFIFO(
            width=len(Cat(Const(0, gt.event_layout(p).size), Const(0, tc_bits(p)))),
            depth=TRACKER_FIFO_DEPTH,
        )
        m.submodules.tracker_fifo = s.fifo
        room = s.fifo.level <= TRACKER_FIFO_DEPTH - n_ctx - 2  # ends an event may cause
        s.ev_sel_host = Signal()
        m.d.comb += [
            agg.ev.payload.eq(Mux(s.ev_sel_host, s.ev_h, s.ev_r)),
            agg.ev.valid.eq(
                Mux(s.ev_sel_host, s.ev_h_valid, s.ev_r_valid) & ~agg.end_valid & ~s.end_busy & room
            ),
        ]
        s.ev_taken = agg.ev.valid & agg.ev.ready

    def _host_side(self, m: Module, s: SimpleNamespace) -> None:
        """Host side: a START's checks, then encoder -> scatter packetizer."""
        p, K, npk_max, slot_of, n_packets = self.p, s.K, s.npk_max, s.slot_of, s.n_packets
        csr, enc, pks, world = s.csr, s.enc, s.pks, s.world
        s.rx_idle = Signal()
        s.h_op, s.h_n, s.h_exp = Signal(32), Signal(range(p.c + 1)), Signal(signed(8))
        s.h_tc = Signal(tc_bits(p))
        s.hs = slot_of(s.h_op)
        s.cmd = self.host_cmd.payload
        c_slot = slot_of(s.cmd.op_id)
        # the model starts an op after the input before it has had all its effects: the
        # START waits until no event is in flight anywhere (and so its t_C is settled)
        s.quiet = Signal()
        # the command's own checks are registered (125 MHz): they hold for a payload offered
        # in the cycle before too (a stream's payload stays until taken); base only grows,
        # so a one-cycle-old window check errs late, never early
        s.cmd_seen, cmd_ok = Signal(), Signal()
        m.d.sync += [
            s.cmd_seen.eq(self.host_cmd.valid & ~self.host_cmd.ready),
            cmd_ok.eq(
                (s.cmd.op_id == s.next_op)
                & (s.cmd.op_id < s.base + K)
                & (s.cmd.n >= 1)
                & (s.cmd.n <= p.c)
            ),
        ]
        s.exp_ready = Signal(init=1)  # exp_inband: the agreed value is the table's as it is
        can_start = s.quiet & s.cmd_seen & cmd_ok & ~s.c_draining[c_slot] & s.exp_ready
        s.host_busy = Signal()
        # a START the window takes that waits for the last op's encode, its context's
        # drain or the proposal table: work (events_idle), where one the window holds
        # back is not
        s.cmd_waits = s.cmd_seen & cmd_ok & (s.host_busy | s.c_draining[c_slot] | ~s.exp_ready)
        m.d.comb += self.host_cmd.ready.eq(~s.host_busy & can_start)
        s.h_accept = self.host_cmd.valid & self.host_cmd.ready
        s.incs["ops_started"].append(s.h_accept)

        # encoder -> scatter packetizer, counting the op's padded elements into it
        m.d.comb += [
            enc.exponent.eq(s.h_exp),
            enc.seed.eq(csr.seed),
            enc.clear.eq(s.h_accept),
            pks.msg_type.eq(ubt.MSG_SCATTER),
            pks.op_id.eq(s.h_op),
            pks.exponent.eq(s.h_exp),
            pks.op_len.eq(s.h_n),
            pks.t_c_us.eq(s.h_tc),
            pks.contributors.eq(0),
        ]
        # the op's sign key, from its START on: its first sign words are made before
        # its words come (a START waits for the last op's encode, whose key was taken
        # before its last word)
        key_valid = Signal()
        words = sign_words(m, p, s.cmd.n)
        with m.If(s.h_accept):
            m.d.sync += [
                key_valid.eq(1),
                enc.key.payload.op_id.eq(s.cmd.op_id),
                enc.key.payload.words.eq(words),
            ]
        with m.Elif(enc.key.ready):
            m.d.sync += key_valid.eq(0)
        m.d.comb += enc.key.valid.eq(key_valid)
        s.h_word = Signal(16)  # the proposal word of the op's frames (exp_inband)
        m.d.comb += pks.reserved.eq(s.h_word)
        wiring.connect(m, enc.o, pks.i)
        s.enc_in_en = Signal()
        m.d.comb += [
            enc.i.payload.eq(self.host_i.payload),
            enc.i.valid.eq(self.host_i.valid & s.enc_in_en),
            self.host_i.ready.eq(enc.i.ready & s.enc_in_en),
        ]
        s.pk_beats = Signal(range(p.c + 1))  # elements into the scatter packetizer
        s.pk_beat = Signal(range(p.p))
        s.pk_dst = Signal(range(p.n_max))
        s.tx_add = Signal(range(p.n_max + 1))  # frames the packetizers will send, added now
        s.tx_pending = Signal(range(npk_max * p.n_max + 1))
        s.pks_take = pks.i.valid & pks.i.ready
        with m.If(s.pks_take):
            m.d.sync += [s.pk_beats.eq(s.pk_beats + 1), s.pk_beat.eq(s.pk_beat + 1)]
            with m.If(s.pk_beat == p.p - 1):
                m.d.sync += [
                    s.pk_beat.eq(0),
                    s.pk_dst.eq(Mux(s.pk_dst + 1 == world, 0, s.pk_dst + 1)),
                ]
        s.enc_done = Signal()
        m.d.sync += s.enc_done.eq(s.pk_beats == n_packets(s.h_n) * p.p)

    def _exponent(self, m: Module, s: SimpleNamespace) -> None:
        """The op's exponent: the host's, or with exp_inband and `inband` the agreed one
        (the proposal table's max, then the context's if peers ahead made it with another:
        NicModel.start_op); the exponent counters."""
        p, tbl, cmd, parser = self.p, s.tbl, s.cmd, s.parser
        s.h_inb = Signal()  # the op runs at an in-band exponent
        s.h_missing = Signal(range(p.n_max))  # live peers' proposals missing at its start
        s.sel_exp, s.sel_inb = Signal(signed(8)), Signal()  # a START taken now
        s.sel_missing = Signal(range(p.n_max))
        s.ctx_step = Signal()  # the cycle the host FSM leaves CTX
        s.enc_step = Signal()  # the cycle the op's encoding is recorded
        m.d.comb += s.sel_exp.eq(cmd.exponent)
        if tbl is not None:
            m.d.comb += [
                tbl.rank.eq(s.rank),
                tbl.world.eq(s.world),
                tbl.next_op.eq(s.next_op),
                tbl.note.eq(parser.note),
                tbl.note_op.eq(parser.note_op),
                tbl.note_sender.eq(parser.note_sender),
                tbl.note_word.eq(parser.note_word),
                tbl.start.eq(s.h_accept),
                tbl.start_op.eq(cmd.op_id),
                tbl.start_word.eq(cmd.proposal),
                tbl.q_op.eq(cmd.op_id),
                s.exp_ready.eq(tbl.fresh),
                # no in-band value (a rank gave no proposal): the host's exponent is used
                s.sel_inb.eq(cmd.inband & ~tbl.q_unknown),
                s.sel_missing.eq(tbl.q_missing),
            ]
            with m.If(s.sel_inb):
                m.d.comb += s.sel_exp.eq(tbl.q_exp)
        held = s.c_exp[s.hs]
        follow = s.h_inb & s.holds(s.h_op) & (held != s.h_exp)
        with m.If(s.ctx_step):
            m.d.sync += s.c_word[s.hs].eq(s.h_word)
            with m.If(follow):  # the first rank to start an op fixes its exponent
                m.d.sync += s.h_exp.eq(held)
        agreed = s.ctx_step & s.h_inb & ~follow
        s.incs["exp_given"].append(s.ctx_step & ~s.h_inb)
        s.incs["exp_followed"].append(s.ctx_step & follow)
        s.incs["exp_inband"].append(agreed & (s.h_missing == 0))
        s.incs["exp_incomplete"].append(agreed & (s.h_missing != 0))
        s.incs["exp_missing"].append(Mux(s.ctx_step & s.h_inb, s.h_missing, 0))
        s.incs["exp_saturated"].append(s.enc_step & s.h_inb & (s.enc.sat_quantize != 0))

    def _host_fsm(self, m: Module, s: SimpleNamespace) -> None:
        """The host command's steps: its context, the START (stamped before the
        encode, as the model's), then the encoding, its own packets among the network's
        events."""
        agg, pks = s.agg, s.pks
        # own packets -> aggregator OWN events (+ payload)
        s.own_lock = Signal()
        s.h_start_ev = Signal()
        s.h_setup = Signal()  # the command's context and START: the network side waits

        with m.FSM(name="host"):
            with m.State("IDLE"), m.If(s.h_accept):
                m.d.sync += [
                    s.h_op.eq(s.cmd.op_id),
                    s.h_n.eq(s.cmd.n),
                    s.h_exp.eq(s.sel_exp),
                    s.h_inb.eq(s.sel_inb),
                    s.h_missing.eq(s.sel_missing),
                    s.h_word.eq(s.cmd.proposal if self.p.exp_inband else 0),
                    s.h_tc.eq(agg.own_tc),
                    s.next_op.eq(s.next_op + 1),
                    s.pk_beats.eq(0),
                    s.pk_beat.eq(0),
                    s.pk_dst.eq(0),
                ]
                m.next = "CTX"
            with m.State("CTX"):
                m.d.comb += [s.host_busy.eq(1), s.h_setup.eq(1)]
                with m.If(~s.clr_req):
                    m.d.comb += s.ctx_step.eq(1)
                    with m.If(~s.holds(s.h_op)):
                        m.d.comb += [
                            s.mk_go.eq(1), s.mk_slot.eq(s.hs), s.mk_op.eq(s.h_op), s.mk_n.eq(s.h_n),
                            s.mk_exp.eq(s.h_exp),
                        ]  # fmt: skip
                    m.next = "CLEAR"
            with m.State("CLEAR"):
                m.d.comb += [s.host_busy.eq(1), s.h_setup.eq(1)]
                with m.If(~s.clr_req):
                    m.next = "START"
            with m.State("START"):
                m.d.comb += [
                    s.host_busy.eq(1), s.h_setup.eq(1), s.ev_sel_host.eq(1), s.h_start_ev.eq(1),
                ]  # fmt: skip
                with m.If(s.ev_taken):
                    m.d.sync += s.c_start[s.hs].eq(agg.now)
                    m.next = "ENCODE"
            with m.State("ENCODE"):
                # the own packets go to the aggregator among the network's events, first
                # while a readout waits for them (`own_only`)
                m.d.comb += [
                    s.host_busy.eq(1),
                    s.enc_in_en.eq(1),
                    s.ev_sel_host.eq(s.ev_h_valid | agg.own_only),
                ]
                with m.If(s.enc_done & ~pks.own.valid & ~s.own_lock):
                    s.rec.write(m, "encode", s.hs, s.rec_words["encode"])
                    m.d.sync += s.c_encoded[s.hs].eq(1)
                    m.d.comb += s.enc_step.eq(1)
                    m.next = "IDLE"

    def _aggregator_input(self, m: Module, s: SimpleNamespace) -> None:
        """The aggregator's payload: own packets (host side) or the parser's (network
        side)."""
        parser, agg, pks = s.parser, s.agg, s.pks
        # aggregator input payload: own packets (host side) or the parser's (network side)
        s.rx_to_agg = Signal()
        own = pks.own
        m.d.comb += [
            s.ev_h.kind.eq(Mux(s.h_start_ev, AggKind.START, AggKind.OWN)),
            s.ev_h.op_id.eq(s.h_op),
            s.ev_h.op_len.eq(s.h_n),
            s.ev_h.pkt_index.eq(pks.own_index),
            s.ev_h_valid.eq(s.h_start_ev | (own.valid & own.payload.first & ~s.own_lock)),
        ]
        with m.If(s.ev_sel_host & s.ev_taken & ~s.h_start_ev):
            m.d.sync += s.own_lock.eq(1)
        with m.If(s.own_lock):
            m.d.comb += [
                agg.i.payload.data[0].eq(own.payload.data[0]),
                agg.i.payload.first.eq(own.payload.first),
                agg.i.payload.last.eq(own.payload.last),
                agg.i.valid.eq(own.valid),
                own.ready.eq(agg.i.ready),
            ]
            with m.If(own.valid & agg.i.ready & own.payload.last):
                m.d.sync += s.own_lock.eq(0)
        with m.Elif(s.rx_to_agg):
            wiring.connect(m, parser.o, agg.i)

    def _network_side(self, m: Module, s: SimpleNamespace) -> None:
        """Network side: net_rx -> parser -> checks 27/28 -> aggregator / tracker."""
        slot_of, parser, trk = s.slot_of, s.parser, s.trk
        wiring.connect(m, wiring.flipped(self.net_rx), parser.i)
        s.frames_in = Signal(16)  # frames into the parser not yet judged
        rx_last = self.net_rx.valid & self.net_rx.ready & self.net_rx.payload.last
        judged = parser.accept | parser.drop
        m.d.sync += s.frames_in.eq(s.frames_in + rx_last - judged)
        for name in PARSER_REASONS:
            s.incs[name].append(parser.drop & (parser.reason == PARSER_CODES[name]))

        s.hd = Signal(parser.header.shape())  # the header of the frame being handled
        s.rs = slot_of(s.hd.op_id)
        is_gather = s.hd.msg_type == ubt.MSG_GATHER
        m.d.comb += [
            s.ev_r.kind.eq(Mux(is_gather, AggKind.GATHER, AggKind.SCATTER)),
            s.ev_r.op_id.eq(s.hd.op_id),
            s.ev_r.op_len.eq(s.hd.op_len),
            s.ev_r.sender.eq(s.hd.sender),
            s.ev_r.pkt_index.eq(s.hd.pkt_index),
            s.ev_r.last.eq((s.hd.flags & ubt.FLAG_LAST) != 0),
            s.ev_r.t_c.eq(saturated_tc(self.p, s.hd.t_c_us)),
        ]
        inc_exp_mismatch, inc_bad_length = Signal(), Signal()
        s.incs["exponent_mismatch"].append(inc_exp_mismatch)
        s.incs["bad_length"].append(inc_bad_length)
        s.gb_rx_req, s.gb_rx_grant = Signal(), Signal()
        rx_discard = Signal()
        ctx_hit, exp_bad, len_bad = Signal(), Signal(), Signal()
        with m.FSM(name="rx"):
            with m.State("IDLE"):
                m.d.comb += s.rx_idle.eq(1)
                with m.If(parser.o.valid & ~s.h_setup & ~s.h_accept):
                    # the op's context against the header, registered with it (125 MHz;
                    # no maker writes now or before CHECK: the host makes none, rx is busy)
                    ph = parser.header
                    ps = slot_of(ph.op_id)
                    m.d.sync += [
                        s.hd.eq(ph),
                        ctx_hit.eq(s.holds(ph.op_id)),
                        exp_bad.eq(s.c_exp[ps] != ph.exponent.as_signed()),
                        len_bad.eq(s.c_n[ps] != ph.op_len),
                    ]
                    m.next = "CHECK"
            with m.State("CHECK"):  # checks 27 and 28 against the op's context
                with m.If(ctx_hit):
                    with m.If(exp_bad):
                        m.d.comb += inc_exp_mismatch.eq(1)
                        m.next = "DISCARD"
                    with m.Elif(len_bad):
                        m.d.comb += inc_bad_length.eq(1)
                        m.next = "DISCARD"
                    with m.Else():
                        m.next = "EVENT"
                with m.Elif(
                    ~s.c_draining[s.rs] & ~s.clr_req
                ):  # a peer is ahead: keep what it sends
                    m.d.comb += [
                        s.mk_go.eq(1), s.mk_slot.eq(s.rs), s.mk_op.eq(s.hd.op_id),
                        s.mk_n.eq(s.hd.op_len), s.mk_exp.eq(s.hd.exponent.as_signed()),
                    ]  # fmt: skip
                    m.next = "CLEAR"
            with m.State("CLEAR"), m.If(~s.clr_req):
                m.next = "EVENT"
            with m.State("EVENT"):
                m.d.comb += s.ev_r_valid.eq(1)
                with m.If(s.ev_taken & ~s.ev_sel_host):
                    with m.If(is_gather):
                        m.next = "VERDICT"
                    with m.Else():
                        m.next = "SCATTER"
            with m.State("SCATTER"):
                m.d.comb += s.rx_to_agg.eq(1)
                with m.If(parser.o.valid & parser.o.ready & parser.o.payload.last):
                    m.next = "IDLE"
            with m.State("VERDICT"), m.If(trk.verdict_valid):
                with m.If(trk.verdict == Verdict.ACCEPT):
                    m.next = "GATHER"
                with m.Else():
                    m.next = "DISCARD"
            with m.State("GATHER"):
                m.d.comb += s.gb_rx_req.eq(1)
                with m.If(parser.o.valid & parser.o.ready & parser.o.payload.last):
                    m.next = "IDLE"
            with m.State("DISCARD"):
                m.d.comb += [rx_discard.eq(1), parser.o.ready.eq(1)]
                with m.If(parser.o.valid & parser.o.payload.last):
                    m.next = "IDLE"

    def _tracker_events(self, m: Module, s: SimpleNamespace) -> None:
        """The tracker's event FIFO: events the aggregator takes, then its phase-1 ends."""
        p, slot_of, n_packets, agg, trk = self.p, s.slot_of, s.n_packets, s.agg, s.trk
        rank = s.rank
        fw = Signal(gt.event_layout(p))
        fw_tc1 = Signal(tc_bits(p))
        fw_en = Signal()
        m.d.comb += [s.fifo.w_data.eq(Cat(fw.as_value(), fw_tc1)), s.fifo.w_en.eq(fw_en)]
        e_op, e_tick = Signal(32), Signal(p.tick_bits)
        e_timeout = Signal(p.t_b_bits)  # T <= t_B
        with m.If(agg.end_valid):
            es = slot_of(agg.end_op)
            m.d.sync += [
                e_op.eq(agg.end_op),
                e_tick.eq(agg.end_tick),
                e_timeout.eq(agg.end_timeout),
                # an op with no slot of ours has no means to place
                s.c_means[es].eq(n_packets(s.c_n[es]) <= rank),
            ]
            s.rec.write(m, "phase1", es, s.rec_words["phase1"])
        with m.If(s.end_d):
            m.d.comb += [
                fw_en.eq(1),
                fw.kind.eq(gt.Kind.PHASE1_END),
                fw.op_id.eq(e_op),
                fw.op_len.eq(s.c_n[slot_of(e_op)]),
                fw.at.eq(e_tick),
                fw.p1_start.eq(s.c_start[slot_of(e_op)]),
                fw.t1.eq(e_timeout),
                fw_tc1.eq(agg.own_tc),  # the phase-1 t_C after this end's sample
            ]
        with m.Elif(s.ev_taken & (agg.ev.payload.kind != AggKind.OWN)):
            ap = agg.ev.payload
            m.d.comb += [
                fw_en.eq(1),
                fw.kind.eq(
                    Mux(
                        ap.kind == AggKind.START,
                        gt.Kind.START,
                        Mux(ap.kind == AggKind.GATHER, gt.Kind.GATHER, gt.Kind.SCATTER),
                    )
                ),
                fw.op_id.eq(ap.op_id),
                fw.op_len.eq(ap.op_len),
                fw.sender.eq(ap.sender),
                fw.pkt_index.eq(ap.pkt_index),
                fw.last.eq(ap.last),
                fw.t_c.eq(ap.t_c),
                fw.at.eq(agg.now),
            ]

        fr = data.View(gt.event_layout(p), s.fifo.r_data[: gt.event_layout(p).size])
        fr_tc1 = s.fifo.r_data[gt.event_layout(p).size :]
        m.d.comb += [
            trk.ev.payload.eq(Mux(s.fifo.r_rdy, fr.as_value(), 0)),
            trk.ev.valid.eq(s.fifo.r_rdy),
            s.fifo.r_en.eq(trk.ev.ready),
        ]
        # time: the aggregator's now when it last could take an event, a few cycles late
        t_ready = Signal(TIME_DELAY)
        t_now = [Signal(p.tick_bits, name=f"t_now{k}", init=self.tick0) for k in range(TIME_DELAY)]
        m.d.sync += [t_ready.eq(Cat(agg.ev.ready, t_ready[:-1])), t_now[0].eq(agg.now)]
        m.d.sync += [t_now[k].eq(t_now[k - 1]) for k in range(1, TIME_DELAY)]
        s.time = Signal(p.tick_bits, init=self.tick0)
        with m.If(t_ready[-1]):
            m.d.sync += s.time.eq(t_now[-1])
        m.d.comb += trk.time.eq(s.time)

        s.tc1_seen = Signal(tc_bits(p), init=p.t_c_init)  # phase-1 t_C as of the tracker's events
        with m.If(trk.ev.valid & trk.ev.ready & (fr.kind == gt.Kind.PHASE1_END)):
            fs = slot_of(fr.op_id)
            m.d.sync += [
                s.tc1_seen.eq(fr_tc1),
                s.c_gtc[fs].eq(trk.own_tc),  # what this op's gather frames carry
                s.c_gtc_ok[fs].eq(1),
            ]
        restart = changed(m, s.csr.t_c_init_us, p.t_c_init)  # as the estimators restart
        m.d.comb += restart.take.eq(restart.pending)
        with m.If(restart.pending):  # after the event's writes: tc1_seen alone restarts
            m.d.sync += s.tc1_seen.eq(s.csr.t_c_init_us)

    def _phase2_ends(self, m: Module, s: SimpleNamespace) -> None:
        """Phase-2 ends: record, free the window, queue the drain."""
        n_ctx, cb, slot_of, trk = self.n_ctx, s.cb, s.slot_of, s.trk
        s.drain_q = SyncFIFO(width=cb, depth=n_ctx)
        m.submodules.drain_queue = s.drain_q
        t_end_slot = Signal(cb)
        t_end_d, s.t_end_busy = end_strobe(m, "t_end", trk.end_valid, s.tce.b1.busy)
        s.incs["ops_completed"].append(trk.end_valid)
        with m.If(trk.end_valid):
            ts = slot_of(trk.end_op)
            m.d.sync += [
                t_end_slot.eq(ts),
                s.c_done[ts].eq(1),
                s.c_draining[ts].eq(1),
            ]
            s.rec.write(m, "phase2", ts, s.rec_words["phase2"])
            m.d.comb += [s.drain_q.w_en.eq(1), s.drain_q.w_data.eq(ts)]
        with m.If(t_end_d):  # t_C of both phases as the model records them at the end
            s.rec.write(m, "tc", t_end_slot,
                      {"t_c_phase1_us": s.tc1_seen, "t_c_phase2_us": trk.own_tc})  # fmt: skip

    def _means(self, m: Module, s: SimpleNamespace) -> None:
        """Means: aggregator -> gather packetizer and the local gather buffer."""
        p, slot_of, n_packets, parser, agg = self.p, s.slot_of, s.n_packets, s.parser, s.agg
        pkg, dec, rank, world = s.pkg, s.dec, s.rank, s.world
        s.ao = agg.o
        a_slot = slot_of(agg.o_op)
        m.d.comb += [
            pkg.msg_type.eq(ubt.MSG_GATHER),
            pkg.op_id.eq(agg.o_op),
            pkg.exponent.eq(s.c_exp[a_slot]),
            pkg.op_len.eq(s.c_n[a_slot]),
            pkg.t_c_us.eq(s.c_gtc[a_slot]),
            pkg.contributors.eq(agg.o_count),
            pkg.reserved.eq(s.c_word[a_slot]),
            pkg.i.payload.data[0].eq(s.ao.payload.data[0]),
            pkg.i.payload.first.eq(s.ao.payload.first),
            pkg.i.payload.last.eq(s.ao.payload.last),
        ]
        s.gb_state = Signal(range(3))  # 0 free, 1 network packet, 2 an own mean
        s.GB_FREE, GB_RX, GB_OWN = 0, 1, 2
        with m.Switch(s.gb_state):
            with m.Case(s.GB_FREE):
                with m.If(s.gb_rx_req):
                    m.d.sync += s.gb_state.eq(GB_RX)
                with m.Elif(s.ao.valid & s.c_gtc_ok[a_slot]):
                    m.d.sync += s.gb_state.eq(GB_OWN)
            with m.Case(GB_RX):
                m.d.comb += [
                    s.gb_rx_grant.eq(1),
                    dec.i.payload.data[0].eq(parser.o.payload.data[0]),
                    dec.i.payload.first.eq(parser.o.payload.first),
                    dec.i.payload.last.eq(parser.o.payload.last),
                    dec.i.valid.eq(parser.o.valid),
                    parser.o.ready.eq(dec.i.ready),
                    dec.slot.eq(s.rs),
                    dec.pkt_index.eq(s.hd.pkt_index),
                    dec.contributors.eq(s.hd.contributors),
                ]
                with m.If(parser.o.valid & dec.i.ready & parser.o.payload.last):
                    m.d.sync += s.gb_state.eq(s.GB_FREE)
            with m.Case(GB_OWN):
                # both take the beat together; neither valid waits on its own ready
                m.d.comb += [
                    dec.i.payload.data[0].eq(s.ao.payload.data[0]),
                    dec.i.payload.first.eq(s.ao.payload.first),
                    dec.i.payload.last.eq(s.ao.payload.last),
                    dec.i.valid.eq(s.ao.valid & pkg.i.ready),
                    pkg.i.valid.eq(s.ao.valid & dec.i.ready),
                    s.ao.ready.eq(pkg.i.ready & dec.i.ready),
                    dec.slot.eq(a_slot),
                    dec.pkt_index.eq(agg.o_index),
                    dec.contributors.eq(agg.o_count),
                ]
                with m.If(s.ao.valid & s.ao.ready & s.ao.payload.last):
                    m.d.sync += s.gb_state.eq(s.GB_FREE)
                    # the last slot of the op: the model places them all before phase 2
                    with m.If(agg.o_index + world >= n_packets(s.c_n[a_slot])):
                        m.d.sync += s.c_means[a_slot].eq(1)
        pkg_slot_end = pkg.i.valid & pkg.i.ready & pkg.i.payload.last
        pks_frame = s.pks_take & (s.pk_beat == p.p - 1) & (s.pk_dst != rank)
        m.d.comb += s.tx_add.eq(Mux(pks_frame, 1, 0) + Mux(pkg_slot_end, world - 1, 0))

    def _net_tx(self, m: Module, s: SimpleNamespace) -> None:
        """net_tx: the packetizer's frames, scatter (source 0) and gather (source 1)."""
        wiring.connect(m, s.pk.o, wiring.flipped(self.net_tx))
        tx_end = self.net_tx.valid & self.net_tx.ready & self.net_tx.payload.last
        s.incs["tx_scatter"].append(tx_end & (s.pk.src == 0))
        s.incs["tx_gather"].append(tx_end & (s.pk.src == 1))
        m.d.sync += s.tx_pending.eq(s.tx_pending + s.tx_add - tx_end)

    def _drain(self, m: Module, s: SimpleNamespace) -> None:
        """Drain: host_o the op's head (its record's first words), the decoder's results,
        then the STATS record."""
        p, cb, npk_max, n_packets, csr, dec = self.p, s.cb, s.npk_max, s.n_packets, s.csr, s.dec
        world = s.world
        d_slot = Signal(cb)
        hist = Array(Signal(range(npk_max + 1), name=f"hist{k}") for k in range(p.n_max + 1))
        h_addr = Signal(range(p.n_max + 2))
        h_addr_d = Signal(range(p.n_max + 2))
        h_valid_d = Signal()
        h_sum = Signal(range(npk_max + 1))
        word = Signal(range(stats_len(p.n_max) + 1))
        n_words = stats_len(0) + world
        drain_cmd = Signal()
        m.d.comb += [dec.hist_slot.eq(d_slot), dec.hist_addr.eq(h_addr)]
        m.d.sync += [h_valid_d.eq(0), h_addr_d.eq(h_addr)]
        with m.If(h_valid_d):
            m.d.sync += [hist[h_addr_d].eq(dec.hist_data), h_sum.eq(h_sum + dec.hist_data)]

        # the record's words in host_port.STATS_FIELDS order (the one definition); the
        # op records' row of the word shown
        rows = [s.rec.place.get(name, (0,))[0] for name in host_port.STATS_FIELDS]
        row = Signal(range(max(2, s.rec.rows)))
        m.d.comb += row.eq(Array(Const(r, len(row)) for r in rows)[word])
        fields, written = s.rec.read(m, d_slot, row)
        fields.update(
            op_id=s.c_op[d_slot],
            n=s.c_n[d_slot],
            exponent=s.c_exp[d_slot],  # signed: sign-extended to 32 bits
            start_us=s.c_start[d_slot][:32],
            sat_output=dec.sat_output,
            world=world,
        )
        fixed = [fields[name] for name in host_port.STATS_FIELDS]
        words = Array(Signal(32, name=f"stats_w{k}") for k in range(STATS_FIXED))
        meant = Array(written.get(name, Const(1)) for name in host_port.STATS_FIELDS)
        for k, v in enumerate(fixed):
            m.d.comb += words[k].eq(v)
        stats_word = Signal(32)
        missing = n_packets(s.c_n[d_slot]) - h_sum
        with m.If(word < STATS_FIXED):  # a record group not written yet reads 0
            m.d.comb += stats_word.eq(Mux(meant[word], words[word], 0))
        with m.Elif(word == STATS_FIXED):
            m.d.comb += stats_word.eq(missing)
        with m.Else():
            m.d.comb += stats_word.eq(hist[(word - STATS_FIXED)[: _bits(p.n_max + 1)]])

        gcmd = dec.cmd.payload
        m.d.comb += [
            gcmd.gather.op.eq(Mux(s.clr_req, GatherOp.CLEAR, GatherOp.DRAIN)),
            gcmd.gather.slot.eq(Mux(s.clr_req, s.clr_slot, d_slot)),
            gcmd.gather.n.eq(s.c_n[d_slot]),
            gcmd.op_id.eq(s.c_op[d_slot]),
            gcmd.exponent.eq(s.c_exp[d_slot]),
            dec.seed.eq(csr.seed),
            dec.cmd.valid.eq(s.clr_req | drain_cmd),
        ]
        cmd_taken = dec.cmd.valid & dec.cmd.ready
        with m.If(cmd_taken & s.clr_req):
            m.d.sync += s.clr_req.eq(0)
        with m.FSM(name="drain") as s.drain_fsm:
            # an op's t_C words are written once its end's bank is idle (end_strobe): its
            # record is read after that, once the op records' writer has put it in memory
            with m.State("IDLE"), m.If(s.drain_q.r_rdy & ~s.t_end_busy & ~s.rec.busy):
                m.d.comb += s.drain_q.r_en.eq(1)
                m.d.sync += [d_slot.eq(s.drain_q.r_data), h_addr.eq(1), h_sum.eq(0)]
                m.next = "MEANS"
            # phase 2 may end before the own means are placed, or before the op's own
            # packets are all encoded (the START comes first): its STATS needs the counts
            with m.State("MEANS"), m.If(s.c_means[d_slot] & s.c_encoded[d_slot] & ~s.rec.busy):
                m.next = "HIST"
            with m.State("HIST"):  # contributor histogram [1..world] of the slot
                m.d.sync += [h_valid_d.eq(1), h_addr.eq(h_addr + 1)]
                with m.If(h_addr == world):
                    m.next = "HIST_LAST"
            with m.State("HIST_LAST"):
                m.d.sync += word.eq(0)
                m.next = "HEAD"
            with m.State("HEAD"):  # the record's first words, ahead of the results
                m.d.comb += [
                    self.host_o.valid.eq(1),
                    self.host_o.payload.data.eq(stats_word),
                    self.host_o.payload.head.eq(1),
                ]
                with m.If(self.host_o.ready):
                    m.d.sync += word.eq(word + 1)
                    with m.If(word == HEAD_WORDS - 1):
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += drain_cmd.eq(~s.clr_req)
                with m.If(cmd_taken & ~s.clr_req):
                    m.d.comb += dec.clear.eq(1)
                    m.next = "RESULTS"
            with m.State("RESULTS"):
                m.d.comb += [
                    self.host_o.valid.eq(dec.o.valid),
                    self.host_o.payload.data.eq(dec.o.payload.data[0]),
                    dec.o.ready.eq(self.host_o.ready),
                ]
                with m.If(dec.o.valid & self.host_o.ready & dec.o.payload.last):
                    m.d.sync += word.eq(0)
                    m.next = "STATS"
            with m.State("STATS"):
                m.d.comb += [
                    self.host_o.valid.eq(1),
                    self.host_o.payload.data.eq(stats_word),
                    self.host_o.payload.last.eq(word == n_words - 1),
                ]
                with m.If(self.host_o.ready):
                    m.d.sync += word.eq(word + 1)
                    with m.If(word == n_words - 1):
                        m.d.sync += s.c_draining[d_slot].eq(0)
                        m.next = "IDLE"

    def _counters(self, m: Module, s: SimpleNamespace) -> None:
        """Counters into the CSR bank: several strobes in one cycle are all kept."""
        csr, agg, trk = s.csr, s.agg, s.trk
        s.incs["rx_scatter"].append(agg.inc_rx)
        s.incs["rx_gather"].append(trk.inc_rx)
        s.incs["late"] += [agg.inc_late, trk.inc_late]
        s.incs["duplicate"] += [agg.inc_duplicate, trk.inc_duplicate]
        # every strobe is registered first: the events come from deep in the blocks, the
        # counters sit in one bank (125 MHz); a count lands one cycle later
        for name in ALL_COUNTERS:
            src = []
            for k, strobe in enumerate(s.incs[name]):
                r = Signal(len(Value.cast(strobe)), name=f"ev_{name}{k}")
                m.d.sync += r.eq(strobe)
                src.append(r)
            inc = getattr(csr, f"inc_{name}")
            if not src:
                continue
            if len(src) == 1:
                m.d.comb += inc.eq(src[0])
                continue
            owed = Signal(4, name=f"owed_{name}")  # strobes not yet counted
            total = Signal(5, name=f"total_{name}")
            m.d.comb += [total.eq(owed + sum(src)), inc.eq(total != 0)]
            m.d.sync += owed.eq(total - (total != 0))

    def _idle(self, m: Module, s: SimpleNamespace) -> None:
        """Idle: no work anywhere, held for IDLE_HOLD cycles. Events idle: every event
        taken has had its effects (a readout included, but one waiting for own packets)
        and no START the window takes waits or is in the making, while the encode, the
        drain and the frames still to leave may go on."""
        parser, agg, trk = s.parser, s.agg, s.trk
        no_work, no_events = Signal(), Signal()
        fault = Signal()  # `sdram_fault`, seen here (it is in the memory's clock)
        if self.p.sdram_addr_bits and self.sdram_domain == "sync":
            m.d.comb += fault.eq(self.sdram_fault)
        elif self.p.sdram_addr_bits:
            m.submodules.fault_sync = FFSynchronizer(self.sdram_fault, fault, o_domain="sync")
        m.d.comb += s.quiet.eq(
            s.rx_idle
            & ~parser.o.valid
            & (s.frames_in == 0)
            & agg.ev.ready
            & ~agg.end_valid
            & ~s.end_busy
            & ~s.fifo.r_rdy
            & trk.ev.ready
            & (trk.now == agg.now)
            & (s.time == agg.now)
            & ~trk.end_valid
            & ~s.t_end_busy
        )
        m.d.comb += no_work.eq(
            ~self.tick
            & ~s.host_busy
            & ~s.h_accept
            & ~(self.host_cmd.valid & ~s.cmd_seen)  # a START offered now is taken next cycle
            & s.quiet
            & ~s.ao.valid
            & (s.gb_state == s.GB_FREE)
            & ~fault
            & (s.tx_pending == 0)
            & ~self.net_tx.valid
            & s.drain_fsm.ongoing("IDLE")
            & ~s.drain_q.r_rdy
            & ~s.clr_req
        )
        m.d.comb += no_events.eq(
            ~self.tick
            & ~s.h_setup
            & ~s.h_accept
            & ~(self.host_cmd.valid & ~s.cmd_seen)
            & ~s.cmd_waits
            & s.quiet
            & ~s.clr_req
        )
        for out, work in ((self.idle, no_work), (self.events_idle, no_events)):
            hold = Signal(range(IDLE_HOLD + 1))
            with m.If(~work):
                m.d.sync += hold.eq(0)
            with m.Elif(hold != IDLE_HOLD):
                m.d.sync += hold.eq(hold + 1)
            m.d.comb += out.eq(work & (hold == IDLE_HOLD))
