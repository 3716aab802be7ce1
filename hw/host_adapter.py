"""The host port on Ethernet: host-port frames (optireduce/host_port.py) <-> the core's host port.

  i (bytes of frames from the host) -> 34-byte header + payload words into a frame buffer
     -> checks at the end of the frame -> START: host_cmd {op_id, n, exponent, inband,
        proposal}, then words
     on host_i; DATA: more words of the open op; REG: register accesses on the CSR bus
  host_o (an op's head, its n result words, then its STATS record) -> a ring of two
     fragments -> RESULT fragments of `tx_fragment` words as they fill, then one STATS
     frame -> o (bytes to the host)

Frames are EtherType 0x88B5 with the 20-byte header of host_port.HEADER; every frame is
checked whole before anything of it reaches the core, so a bad frame is a counted drop
and never changes an op (the counters: COUNTERS). A frame of Ethernet's least length
(60 bytes) whose header counts fewer words is one a wire padded: its words are read by
the count and the padding ignored (host_port.unpad is the model). An op's words must
arrive in order: START (offset 0) then DATA fragments whose offset is the number of words
already taken. A START that arrives while the previous op still owes words first pads
that op with zeros (counted in `truncated_ops`): the core then finishes it and never
waits for words that will not come.

Results: the header of a RESULT frame needs the op id, n and exponent, which the
core's STATS record holds after the results; so the core gives the record's first words
(host_port.HEAD_FIELDS, flagged `head`) ahead of the results. The results go through a
ring of 2 x tx_fragment words (a power of two; one block RAM at 256): a RESULT frame
leaves once its words are in, while the next fills, so block RAM does not grow with C
(a whole message was C + 22 + n_max words: 33 DP16KD at C = 16K). The record follows the
results into the ring, and goes out as the STATS frame after the last RESULT frame if
it is 22 + world words long (`world` shadowed from the register writes that pass
through here; reset: the CSR's reset value) and says the head's op id, n and exponent. A
message that is not so (no head, n > C, fewer results than n, a record of another
length or with other fields) is read to its end and counted in `bad_records`: every
RESULT frame its words filled goes out, and no STATS frame follows.

REG (host_port.REG, kind 5): `count` words of (address | 1 << 31 for a
write, data) pairs; each is applied to the register bank in order and the frame comes
back to the host with reads' data filled in (`host_port.reg_request`, `host_port.reg_reply`
are its model). The host block's counters are the bank's too: this adapter gives a
strobe per event on `counts` (a bit per COUNTERS name) and the bank counts them (its
32-bit counters here were a thousand LUTs of the 25F).

Both kinds of frame to the host leave through one frame sender, a whole frame at a time
(`_share`): a REG reply waits for a RESULT or STATS frame that is going out, and the
other way round; a reply goes first when both ask in one cycle.

Model: host_port.build / parse / ChunkAssembler / stats_frame (tests/hw/test_host_adapter.py).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce import host_port
from optireduce.hw.banked_memory import BankedMemory
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.csr import addr_bits as csr_addr_bits
from optireduce.hw.csr import register
from optireduce.hw.nic_core import host_cmd_layout, host_word_layout
from optireduce.hw.skid import Skid
from optireduce.hw.streams import float_stream, frame_layout, frame_stream
from optireduce.params import NicParams

REG = host_port.REG  # register access on the board (CONFIG is the replay's JSON)
WRITE, HEAD = host_port.WRITE, host_port.HEAD
RECORD_FIXED = len(host_port.STATS_FIELDS)  # STATS words before the histogram

CMD_LAYOUT = host_cmd_layout()  # the core's host port, defined once in hw/nic_core.py
OUT_LAYOUT = host_word_layout()

COUNTERS = host_port.ADAPTER_COUNTERS  # a strobe each on `counts`, counted in the bank
TX_FRAGMENT = host_port.TX_FRAGMENT


def _be(value, nbytes: int) -> list:
    """Big-endian bytes of a value (first byte on the wire first)."""
    return [value[8 * (nbytes - 1 - k) : 8 * (nbytes - k)] for k in range(nbytes)]


class _FrameSender(wiring.Component):
    """Sends one host-port frame: the 34-byte header from its fields, then `count` words
    read from a memory (rd_addr/rd_data, read latency 1 to 3: the address is out for the
    whole header or word before) starting at `base`."""

    # a word's 4 bytes take >= 4 cycles, and the next word's address is out from the
    # cycle after the load: 3 cycles of read latency fit
    MAX_READ_LATENCY = 3

    def __init__(self, addr_bits: int) -> None:
        super().__init__(
            {
                "start": In(1),
                "busy": Out(1),
                "kind": In(8),
                "count": In(16),
                "op_id": In(32),
                "offset": In(32),
                "n": In(32),
                "exponent": In(8),
                "base": In(addr_bits),
                "rd_addr": Out(addr_bits),
                "rd_data": In(32),
                "o": Out(frame_stream(1)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        # the bytes leave through a registered skid: nothing of the header mux or the
        # word select is in front of the next block's registers (125 MHz)
        m.submodules.out = out = Skid(frame_layout(1), registered=True)
        wiring.connect(m, out.o, wiring.flipped(self.o))
        f_count = Signal.like(self.count)

        def consts(data: bytes) -> list:
            return [Const(b, 8) for b in data]

        eth = host_port.HOST_MAC + host_port.NIC_MAC + host_port.ETHERTYPE.to_bytes(2, "big")
        head = [
            *consts(eth), Const(host_port.VERSION, 8), self.kind, *_be(self.count, 2),
            *_be(self.op_id, 4), *_be(self.offset, 4), *_be(self.n, 4), self.exponent,
            *consts(bytes(3)),
        ]  # fmt: skip
        # The header's fields are the bytes lo..hi-1, the rest are constants. The fields
        # are loaded whole at the start and shifted out a byte at a time, the constants
        # come from a table by position: no 34-way byte mux in front of the output, and
        # only the fields' 128 flip-flops take a load or a shift (125 MHz)
        const = [isinstance(b, Const) for b in head]
        lo = const.index(False)
        hi = len(head) - const[::-1].index(False)
        assert not any(const[lo:hi]) and len(head) == HEAD, "the fields are one run of bytes"
        table = Array(Const(b.value if c else 0, 8) for b, c in zip(head, const, strict=True))
        head_sr = Signal(8 * (hi - lo))
        # the byte out is header byte pos; these are registers, loaded with pos + 1's
        pos1 = Signal(range(HEAD + 1))  # pos + 1
        in_fields = Signal()  # pos is in lo..hi-1
        const_byte = Signal(8)  # table[pos]
        head_end = Signal()  # pos == HEAD - 1
        words_left = Signal(16)  # words after the one being sent
        byte = Signal(2)
        word = Signal(32)  # the word being sent, loaded from rd_data (BRAM -> FF, no logic)
        hs = Signal()
        m.d.comb += hs.eq(out.i.valid & out.i.ready)
        # registered in the header and per word (125 MHz): "no words", "this is the last
        # word", and the read address (base in HEAD, then the next word's: it is out for
        # the whole of this word, >= 4 cycles, so rd_data holds it when the last byte goes)
        empty, last_word = Signal(), Signal()
        rd_addr = Signal.like(self.rd_addr)
        m.d.comb += [out.i.payload.keep.eq(1), self.rd_addr.eq(rd_addr)]
        with m.FSM() as fsm:
            with m.State("IDLE"):
                # loaded every idle cycle, so `start` only moves the FSM: it is not the
                # enable of the 128 field registers (125 MHz)
                m.d.sync += [head_sr.eq(Cat(*head[lo:hi])), f_count.eq(self.count)]
                m.d.sync += [pos1.eq(1), in_fields.eq(lo == 0)]
                m.d.sync += const_byte.eq(table[0])
                m.d.sync += [head_end.eq(0), byte.eq(0)]
                m.d.sync += rd_addr.eq(self.base)
                with m.If(self.start):
                    m.next = "HEAD"
            with m.State("HEAD"):
                # from the loaded count, not the clients' field mux: the first is used 34
                # header bytes later
                m.d.sync += [
                    empty.eq(f_count == 0),
                    last_word.eq(f_count == 1),
                    words_left.eq(f_count - 1),
                ]
                m.d.comb += [
                    self.busy.eq(1),
                    out.i.valid.eq(1),
                    out.i.payload.data[0].eq(Mux(in_fields, head_sr[:8], const_byte)),
                    out.i.payload.last.eq(head_end & empty),
                ]
                with m.If(hs):
                    m.d.sync += [
                        pos1.eq(pos1 + 1),
                        in_fields.eq((pos1 >= lo) & (pos1 < hi)),
                        const_byte.eq(table[pos1]),
                        head_end.eq(pos1 == HEAD - 1),
                    ]
                    with m.If(in_fields):
                        m.d.sync += head_sr.eq(head_sr >> 8)
                    with m.If(head_end):
                        m.d.sync += [word.eq(self.rd_data), rd_addr.eq(rd_addr + 1)]
                        m.next = "WORDS"
                        with m.If(empty):
                            m.next = "IDLE"
            with m.State("WORDS"):
                m.d.comb += [
                    self.busy.eq(1),
                    out.i.valid.eq(1),
                    out.i.payload.data[0].eq(word.word_select(~byte, 8)),
                    out.i.payload.last.eq(last_word & (byte == 3)),
                ]
                with m.If(hs):
                    m.d.sync += byte.eq(byte + 1)
                    with m.If(byte == 3):
                        m.d.sync += [
                            words_left.eq(words_left - 1),
                            word.eq(self.rd_data),
                            rd_addr.eq(rd_addr + 1),
                            last_word.eq(words_left == 1),
                        ]
                        with m.If(last_word):
                            m.next = "IDLE"
        _one_hot(fsm)
        return m


def _one_hot(fsm) -> None:
    """yosys recodes this FSM's state one-hot: a transition is then a few state bits, not a
    decode of the whole register (125 MHz on the 25F-6). It leaves Amaranth's FSMs alone
    by itself (their state register has an init value, which it then ignores: the sync
    domain is held in reset from power-up until the PLL locks)."""
    fsm.state.attrs["fsm_encoding"] = "one-hot"  # the state exists once the FSM is closed


def _header_fields(hdr: Signal) -> tuple:
    """The host-port header's fields from the shifted-in bytes (byte k at bits 8k..8k+7):
    ethertype, version, kind, count, op_id, offset, n, exponent, and START's in-band flag
    (host_port.FLAG_INBAND) and proposal word."""

    def byte(k):
        return hdr[8 * k : 8 * k + 8]

    def be(k, nb):
        return Cat(*(byte(k + nb - 1 - j) for j in range(nb)))

    return (be(12, 2), byte(14), byte(15), be(16, 2), be(18, 4), be(22, 4), be(26, 4),
            byte(30), byte(31)[0], be(32, 2))  # fmt: skip


SENDER_FIELDS = ("kind", "count", "op_id", "offset", "n", "exponent", "base")


def _share(m: Module, sender: _FrameSender, names: tuple[str, ...]) -> list[SimpleNamespace]:
    """Clients of one sender, in priority order. Each has the sender's fields, `start`,
    `rd_data` (its memory's word at `rd_addr`), `free` (it may start now: the sender is
    idle and no client before it starts) and `busy` (the sender is sending its frame)."""
    clients = [
        SimpleNamespace(
            start=Signal(name=f"{k}_start"), free=Signal(name=f"{k}_free"),
            busy=Signal(name=f"{k}_busy"), rd_data=Signal(32, name=f"{k}_rd_data"),
            rd_addr=sender.rd_addr,
            **{f: Signal.like(getattr(sender, f), name=f"{k}_{f}") for f in SENDER_FIELDS},
        )
        for k in names
    ]  # fmt: skip
    cur = Signal(range(len(names)))  # the client whose frame is out
    for k, c in enumerate(clients):
        before = Cat(*(b.start for b in clients[:k])).any()
        m.d.comb += [c.free.eq(~sender.busy & ~before), c.busy.eq(sender.busy & (cur == k))]
    # the fields of the client that starts (the sender loads them in every idle cycle)
    with m.If(clients[0].start):
        m.d.comb += [getattr(sender, f).eq(getattr(clients[0], f)) for f in SENDER_FIELDS]
    for k, c in enumerate(clients[1:], 1):
        with m.Elif(c.start | (k == len(clients) - 1)):
            m.d.comb += [getattr(sender, f).eq(getattr(c, f)) for f in SENDER_FIELDS]
    starts = Cat(*(c.start for c in clients))
    m.d.comb += [
        sender.start.eq(starts.any()),
        sender.rd_data.eq(Array(c.rd_data for c in clients)[cur]),
    ]
    for k in reversed(range(len(clients))):  # the first one starting wins
        with m.If(clients[k].start & ~sender.busy):
            m.d.sync += cur.eq(k)
    return clients


class HostAdapter(wiring.Component):
    """Host-port frames <-> the NIC core's host port and register bus (module docstring).

    Ports: `i`/`o` byte frames (toward the host MAC), `host_cmd`, `host_i`, `host_o`
    (to be connected to the core's ports of the same names), the CSR bus master
    (`csr_addr`, `csr_w_en`, `csr_w_data`, `csr_r_en`; `csr_done` strobes when the access
    has been applied, with a read's `csr_r_data`: hw/clock_crossing.py CsrCrossing) and
    `counts`, a strobe per COUNTERS name when its event happens.

    `rx_words`: frame buffer (words of one START/DATA/REG frame; 512 words = one DP16KD
    and covers the 2048-byte MAC FIFO); `tx_fragment`: words per RESULT frame (256:
    1058-byte frames, inside a standard 1500-byte MTU).
    """

    def __init__(
        self, p: NicParams, *, rx_words: int = 512, tx_fragment: int = TX_FRAGMENT
    ) -> None:
        if not 1 <= tx_fragment <= 0xFFFF or not 2 <= rx_words <= 0xFFFF:
            raise ValueError("HostAdapter: tx_fragment and rx_words must be in 1..65535")
        self.p, self.rx_words, self.tx_fragment = p, rx_words, tx_fragment
        self.csr_addr_bits = csr_addr_bits(p)
        world = register(p, "world")
        self.world_addr, self.world_reset = world.offset, world.reset
        self.rec_max = RECORD_FIXED + 1 + p.n_max  # the largest record
        self.ring = host_port.result_ring_words(p.n_max, tx_fragment)
        super().__init__(
            {
                "i": In(frame_stream(1)),
                "o": Out(frame_stream(1)),
                "host_cmd": Out(stream.Signature(CMD_LAYOUT)),
                "host_i": Out(float_stream(1)),
                "host_o": In(stream.Signature(OUT_LAYOUT)),
                "csr_addr": Out(self.csr_addr_bits),
                "csr_w_en": Out(1),
                "csr_w_data": Out(32),
                "csr_r_en": Out(1),
                "csr_r_data": In(32),
                "csr_done": In(1),
                "world": Out(range(p.n_max + 1), init=self.world_reset),
                "counts": Out(len(COUNTERS)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        inc = {name: Signal(name=f"inc_{name}") for name in COUNTERS}
        m.d.comb += [self.counts[j].eq(inc[name]) for j, name in enumerate(COUNTERS)]

        # one sender for the register replies and the results (a second was 340 LUTs)
        addr_bits = max(self.rx_words - 1, self.ring - 1).bit_length()
        m.submodules.tx = sender = _FrameSender(addr_bits)
        wiring.connect(m, sender.o, wiring.flipped(self.o))
        with m.If(sender.o.valid & sender.o.ready & sender.o.payload.last):
            m.d.comb += inc["tx_frames"].eq(1)
        replies, results = _share(m, sender, ("replies", "results"))

        self._rx(m, inc, replies, platform)
        self._results(m, inc, results)
        return m

    # ---- host -> core ----------------------------------------------------------------
    def _rx(self, m: Module, inc: dict, sender: SimpleNamespace, platform) -> None:
        # a read that collides with a write is not used: in RECV and PRE_JUDGE (the last
        # word lands a cycle late) the read address is idle, and a REG write-back lands
        # in the next pair's phase 0, which reads the other word of that pair
        m.submodules.rx_buf = buf = block_ram(shape=32, depth=self.rx_words)
        ram_wr = buf.write_port()
        rd = read_port(m, buf, (ram_wr,), platform=platform)
        # writes reach the RAM a cycle late, from registers (the FSM's select of the
        # word and address is not in front of the block RAM's pins: 125 MHz on the
        # 25F-6); nothing reads a word within a cycle of its write
        wr = SimpleNamespace(
            addr=Signal.like(ram_wr.addr, name="rx_w_addr"),
            data=Signal(32, name="rx_w_data"),
            en=Signal(name="rx_w_en"),
        )
        m.d.sync += [ram_wr.addr.eq(wr.addr), ram_wr.data.eq(wr.data), ram_wr.en.eq(wr.en)]
        # the block RAM's data lands in one register, the only load on its pins (its
        # clock-to-out is 5.8 ns of the 8 on the 25F-6); the emit FIFO, the sender (read
        # latency 2) and the REG pairs take the word from it
        rdq = Signal(32, name="rx_rdq", reset_less=True)
        m.d.sync += rdq.eq(rd.data)
        m.d.comb += [sender.rd_data.eq(rdq)]

        hdr = Signal(8 * HEAD)  # byte k at bits 8k..8k+7 once HEAD bytes are in
        nbytes = Signal(16)  # bytes of the frame so far (saturating)
        word = Signal(24)  # the payload word being assembled (big-endian)

        ethertype, version, kind, count, op_id, offset, n, exponent, inband, proposal = (
            _header_fields(hdr)
        )

        # the open op (its START was taken and it still owes words)
        open_ = Signal()
        # an op's counts are < 2^32 on the wire, but a START with n > C is dropped
        words = range(self.p.c + 1)
        cur_op, cur_n, got = Signal(32), Signal(words), Signal(words)
        cur_last = Signal(words)  # cur_n - 1, registered with it
        next_op = Signal(32)  # the core takes ops in order from 0 (NicModel.last_started)
        idx = Signal(range(self.rx_words + 1))  # word of the frame being emitted
        idx_last = Signal()  # idx == count_m1, a register (the FSM's exit from EMIT)
        pad_left = Signal(words)
        pad_last = Signal()  # pad_left == 1, a register (the FSM's exit from PAD)

        ef, ridx, inflight, landed, emit_valid, emit_data = self._rx_emit_fifo(m, rdq)
        m.d.comb += [
            self.host_i.payload.first.eq(got == 0),
            self.host_i.payload.last.eq(got == cur_last),
        ]
        took = Signal()
        m.d.comb += took.eq(self.host_i.valid & self.host_i.ready)
        with m.If(took):
            m.d.sync += got.eq(got + 1)
            with m.If(got == cur_last):
                m.d.sync += open_.eq(0)

        # the payload's bytes so far and "still in the header", registers: no subtract or
        # compare of nbytes in front of the buffer's address or the length check (125 MHz)
        payload_bytes = Signal(16)
        in_header = Signal(init=1)
        fields = (ethertype, version, kind, count, op_id, offset, n, nbytes, payload_bytes)
        seq = (open_, cur_op, cur_n, got, next_op)
        pre_judge, verdicts, chk = self._rx_checks(fields, seq)
        count_m1, count_m2, pairs_m1, count_zero, is_reg, is_start = chk
        reg_i = Signal(range(self.rx_words + 1))  # REG: index of the pair
        reg_phase = Signal(3)

        with m.FSM() as fsm:
            with m.State("RECV"):
                self._rx_receive(m, wr, hdr, (nbytes, payload_bytes, in_header), word)
            with m.State("PRE_JUDGE"):
                m.d.sync += pre_judge
                m.next = "JUDGE"
            bits = [Signal(name=f"v_{k}") for k in verdicts]
            with m.State("JUDGE"):
                # every check registered on its own (125 MHz), the first that holds is
                # picked in CHECK; nbytes counts every byte but the last one's increment is
                # in: all in. Nothing the checks read moves in these three states.
                m.d.sync += [b.eq(v) for b, v in zip(bits, verdicts.values(), strict=True)]
                m.next = "CHECK"
            with m.State("CHECK"):
                first_bad = Signal(len(bits))
                for k in reversed(range(len(bits))):
                    with m.If(bits[k]):
                        m.d.comb += first_bad.eq(1 << k)
                m.d.sync += [idx.eq(0), nbytes.eq(0), reg_i.eq(0), reg_phase.eq(0)]
                m.d.sync += idx_last.eq(count_m1 == 0)  # EMIT's first word is its last
                m.d.sync += [payload_bytes.eq(0), in_header.eq(1)]
                with m.If(first_bad != 0):
                    for k, name in enumerate(verdicts):
                        m.d.comb += inc[name].eq(first_bad[k])
                    m.next = "RECV"
                with m.Else():
                    m.d.comb += inc["rx_frames"].eq(1)
                    with m.If(is_reg):
                        m.next = "REG"
                    with m.Elif(is_start & open_):
                        m.d.sync += [pad_left.eq(cur_n - got), pad_last.eq(cur_n - got == 1)]
                        m.d.comb += inc["truncated_ops"].eq(1)
                        m.next = "PAD"
                    with m.Elif(is_start):
                        m.next = "CMD"
                    with m.Else():
                        m.next = "LOAD"
            with m.State("PAD"):
                m.d.comb += [emit_valid.eq(1), emit_data.eq(0)]
                with m.If(took):
                    m.d.sync += [pad_left.eq(pad_left - 1), pad_last.eq(pad_left == 2)]
                    with m.If(pad_last):
                        m.next = "CMD"
            # the command's fields are driven in every state (only `valid` waits for CMD):
            # no FSM decode in front of the crossing's registers (125 MHz)
            m.d.comb += [
                self.host_cmd.payload.op_id.eq(op_id),
                self.host_cmd.payload.n.eq(n),
                self.host_cmd.payload.exponent.eq(exponent),
                self.host_cmd.payload.inband.eq(inband),
                self.host_cmd.payload.proposal.eq(proposal),
            ]
            with m.State("CMD"):
                m.d.comb += self.host_cmd.valid.eq(1)
                # the new op's registers load in every CMD cycle (no word moves here and
                # the old op is closed), so their ~130 enables are the state alone, not
                # also the crossing's ready (125 MHz); only `open_` waits for the take
                m.d.sync += [
                    cur_op.eq(op_id),
                    cur_n.eq(n),
                    cur_last.eq(n - 1),
                    got.eq(0),
                    next_op.eq(op_id + 1),
                ]
                with m.If(self.host_cmd.ready):
                    m.d.sync += open_.eq(1)
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += [ridx.eq(0), inflight.eq(0)]
                with m.If(count_zero):
                    m.next = "RECV"
                with m.Else():
                    m.next = "EMIT"
            with m.State("EMIT"):
                issue = (ridx < count) & (ef.level + inflight + landed < ef.depth - 1)
                m.d.comb += [
                    rd.addr.eq(ridx),
                    emit_valid.eq(ef.r_rdy),
                    emit_data.eq(ef.r_data),
                    ef.r_en.eq(self.host_i.ready),
                ]
                m.d.sync += inflight.eq(issue)
                with m.If(issue):  # issue as the enable: no carry chain after the compare
                    m.d.sync += ridx.eq(ridx + 1)
                with m.If(took):
                    m.d.sync += [idx.eq(idx + 1), idx_last.eq(idx == count_m2)]
                    with m.If(idx_last):
                        m.next = "RECV"
            with m.State("REG"):
                self._rx_register_pair(m, (rd, rdq), wr, (reg_i, reg_phase, pairs_m1))
                with m.If(count_zero):
                    m.next = "REPLY"
            with m.State("REPLY"):
                m.d.comb += [
                    sender.kind.eq(REG),
                    sender.count.eq(count),
                    sender.op_id.eq(op_id),
                    sender.offset.eq(offset),
                    sender.n.eq(n),
                    sender.exponent.eq(exponent),
                    sender.base.eq(0),
                ]
                with m.If(sender.free):
                    m.d.comb += sender.start.eq(1)
                    m.next = "SENDING"
            with m.State("SENDING"):
                m.d.comb += rd.addr.eq(sender.rd_addr)
                with m.If(~sender.busy):
                    m.next = "RECV"
        _one_hot(fsm)
        # the sender reads the buffer while it sends (the FSM waits in SENDING)
        with m.If(sender.busy):
            m.d.comb += rd.addr.eq(sender.rd_addr)

    def _rx_receive(self, m: Module, wr, hdr, counts: tuple, word) -> None:
        """RECV: the header's bytes shift into `hdr`, the payload's into buffer words;
        the frame's last byte goes to PRE_JUDGE. `counts`: the frame's bytes, the
        payload's, and "in the header" (nbytes < HEAD)."""
        nbytes, payload_bytes, in_header = counts
        m.d.comb += self.i.ready.eq(1)
        with m.If(self.i.valid):
            b = self.i.payload.data[0]
            m.d.sync += nbytes.eq(nbytes + (nbytes != 0xFFFF))
            with m.If(in_header):
                m.d.sync += hdr.eq(Cat(hdr[8:], b))
                with m.If(nbytes == HEAD - 1):
                    m.d.sync += in_header.eq(0)
            with m.Else():
                k = payload_bytes  # byte index in the payload
                m.d.sync += payload_bytes.eq(payload_bytes + (payload_bytes != 0xFFFF))
                m.d.sync += word.eq(Cat(b, word[:16]))
                m.d.comb += [
                    wr.addr.eq(k[2:]),
                    wr.data.eq(Cat(b, word)),
                    wr.en.eq((k[:2] == 3) & (k[2:] < self.rx_words)),
                ]
            with m.If(self.i.payload.last):
                m.next = "PRE_JUDGE"

    def _rx_emit_fifo(self, m: Module, rdq) -> tuple:
        """The EMIT state's read-ahead onto host_i."""
        # EMIT reads the buffer ahead into a small FIFO: the BRAM output lands in a
        # register, then in the FIFO (a block RAM's clock-to-out and a LUT RAM's write
        # setup do not fit one 125 MHz cycle on the 25F-6), and host_i comes from the
        # FIFO's output register
        m.submodules.emit_fifo = ef = SyncFIFOBuffered(width=32, depth=8)
        ridx = Signal(range(self.rx_words + 1))  # next word to read
        inflight = Signal()  # a read issued last cycle: its word is on the RAM's pins now
        landed = Signal()  # ... and in `rdq` a cycle later
        m.d.sync += landed.eq(inflight)
        m.d.comb += [ef.w_en.eq(landed), ef.w_data.eq(rdq)]
        emit_valid = Signal()
        emit_data = Signal(32)
        m.d.comb += [
            self.host_i.valid.eq(emit_valid),
            self.host_i.payload.data[0].eq(emit_data),
        ]
        return ef, ridx, inflight, landed, emit_valid, emit_data

    def _rx_checks(self, fields: tuple, seq: tuple) -> tuple:
        """A finished frame's checks: the registered operands (PRE_JUDGE) and the
        verdicts in drop order; the operands the FSM reuses."""
        p = self.p
        ethertype, version, kind, count, op_id, offset, n, nbytes, payload_bytes = fields
        open_, cur_op, cur_n, got, next_op = seq
        word_kind = (kind == host_port.START) | (kind == host_port.DATA) | (kind == REG)
        # the sequence checks' wide compares and sums, registered in PRE_JUDGE (125 MHz)
        end = Signal(33)
        # the payload is the header's words, or an Ethernet least-length frame whose words
        # end early (the rest is a wire's padding)
        len_ok = Signal()
        new_op, other_op, gap = Signal(), Signal(), Signal()
        n_bad, count_gt_n = Signal(), Signal()
        is_reg, is_start = Signal(), Signal()
        count_m1, pairs_m1, count_zero = Signal(16), Signal(16), Signal()  # for the FSM
        count_m2 = Signal(16)  # EMIT's idx_last without an adder in front of its compare
        pre_judge = [
            count_m1.eq(count - 1),
            count_m2.eq(count - 2),
            pairs_m1.eq((count >> 1) - 1),
            count_zero.eq(count == 0),
            is_reg.eq(kind == REG),
            is_start.eq(kind == host_port.START),
            len_ok.eq(
                (payload_bytes == count * 4)
                | ((nbytes == host_port.ETH_MIN) & (count < host_port.MIN_WORDS))
            ),
            end.eq(offset + count),
            new_op.eq(op_id != next_op),
            other_op.eq(op_id != cur_op),
            gap.eq(offset != got),
            n_bad.eq((n == 0) | (n > p.c)),
            count_gt_n.eq(count > n),
        ]
        verdicts = {
            "drop_not_host": (nbytes < HEAD) | (ethertype != host_port.ETHERTYPE),
            "drop_bad_header": (version != host_port.VERSION) | (kind > REG),
            "drop_unsupported": ~word_kind,
            "drop_bad_length": ~len_ok | (is_reg & count[0]),
            "drop_too_long": count > self.rx_words,
            "drop_bad_op": is_start & (n_bad | (offset != 0) | count_gt_n),
            "drop_sequence": Mux(
                is_start,
                new_op,
                (kind == host_port.DATA) & (~open_ | other_op | gap | (cur_n < end)),
            ),
        }  # first that holds names the drop, in this order
        return pre_judge, verdicts, (count_m1, count_m2, pairs_m1, count_zero, is_reg, is_start)

    def _rx_register_pair(self, m: Module, read: tuple, wr, pair: tuple) -> None:
        """REG, one pair at a time: read the address word, then the data word (both land
        in registers, two cycles after their reads: `read` is the RAM's port and its data
        register), access the bank, write a read's data back for the reply. `pair`: its
        index, phase, and the last index."""
        rd, rdq = read
        reg_i, reg_phase, pairs_m1 = pair
        addr_w, data_w = Signal(32), Signal(32)
        # the register word as the bank decodes it (bits 1:0 and those above it ignored);
        # bit 31: a write
        word, write = addr_w[2 : self.csr_addr_bits], addr_w[31]
        m.d.comb += rd.addr.eq(Cat(reg_phase == 1, reg_i))
        m.d.sync += reg_phase.eq(reg_phase + 1)
        # the words land in their registers by enables registered a cycle ahead, not by a
        # decode of the FSM and the phase (64 clock enables: 125 MHz on the 25F-6)
        take_addr, take_data = Signal(), Signal()
        m.d.sync += [take_addr.eq(reg_phase == 1), take_data.eq(take_addr)]
        with m.If(take_addr):  # phase 2: the address word (read in phase 0) is in rdq
            m.d.sync += addr_w.eq(rdq)
        with m.If(take_data):  # phase 3: the data word (read in phase 1)
            m.d.sync += data_w.eq(rdq)
        with m.Switch(reg_phase):
            with m.Case(4):  # access
                m.d.comb += [
                    self.csr_addr.eq(addr_w),
                    self.csr_w_data.eq(data_w),
                    self.csr_w_en.eq(write),
                    self.csr_r_en.eq(~write),
                ]
                with m.If(write & (word == self.world_addr >> 2)):
                    m.d.sync += self.world.eq(data_w)
            with m.Case(5):  # wait for the access to come back (the core's clock)
                m.d.sync += reg_phase.eq(5)
                with m.If(self.csr_done):
                    m.d.comb += [
                        wr.addr.eq(Cat(1, reg_i)),
                        wr.data.eq(Mux(write, data_w, self.csr_r_data)),
                        wr.en.eq(1),
                    ]
                    m.d.sync += [reg_i.eq(reg_i + 1), reg_phase.eq(0)]
                    with m.If(reg_i == pairs_m1):
                        m.next = "REPLY"

    # ---- core -> host ----------------------------------------------------------------
    def _results(self, m: Module, inc: dict, sender: SimpleNamespace) -> None:
        """An op's message as it comes: its head, then its results into the ring, each
        RESULT frame sent once its words are in, then its record into the ring, checked
        and sent as the STATS frame (`_message` takes the words, `_send` the frames)."""
        ring = self.ring
        rb = ring.bit_length() - 1
        # banks with registered outputs (BankedMemory.LATENCY): no logic after a block RAM.
        # The sender reads words written at least a header (34 cycles) before.
        m.submodules.res_buf = buf = BankedMemory(32, ring)
        m.d.comb += [sender.rd_data.eq(buf.r_data), buf.r_addr.eq(sender.rd_addr[:rb])]
        lat = BankedMemory.LATENCY
        assert lat <= _FrameSender.MAX_READ_LATENCY, "the sender would send stale words"

        # Counters modulo 2 x ring: words written and freed, results written and put in a
        # frame. Each takes one adder; their differences are compared into registers
        # (`room`, `can`) a cycle late, which only makes them careful (a sum and a
        # difference in one cycle missed 125 MHz on the 25F: 8.3 ns).
        def count(name: str) -> Signal:
            return Signal(rb + 1, name=f"res_{name}")

        r = SimpleNamespace(
            op_id=Signal(32), n=Signal(32), exponent=Signal(8),  # the head's
            filled=count("filled"), drained=count("drained"),  # the ring's words
            res_in=count("in"), framed=count("framed"),  # its results
            room=Signal(name="res_room"),  # two words free a cycle ago: one now
            to_send=Signal(range(self.p.c + 1)),  # results not yet in a frame
            sptr=Signal(rb),  # the next frame's first word (its offset: n - to_send)
            rleft=Signal(range(self.p.c + 1)),  # results still to come (n <= C)
            rcount=Signal(range(self.rec_max + 1)),  # record words in
            write=Signal(), result_in=Signal(),  # a word into the ring; it is a result
            frame_n=Signal(16),  # the words of the frame that starts or ends (a register)
            sent=Signal(), freed=Signal(),  # a RESULT frame starts; a frame ends
            stats_go=Signal(), stats_done=Signal(), send_idle=Signal(),
            clear=Signal(),  # a bad message's end: the ring emptied
        )  # fmt: skip
        m.d.comb += [buf.w_addr.eq(r.filled[:rb]), buf.w_data.eq(self.host_o.payload.data),
                     buf.w_en.eq(r.write)]  # fmt: skip
        used = (r.filled - r.drained)[: rb + 1]
        m.d.sync += [
            r.room.eq(used < ring - 1),
            r.filled.eq(r.filled + r.write),
            r.res_in.eq(r.res_in + r.result_in),
        ]
        # a frame's start and end only enable these adders: the sender's `free` and
        # `busy` (its FSM, the clients' priority) are not in front of their inputs
        with m.If(r.freed):
            m.d.sync += r.drained.eq(r.drained + r.frame_n)
        with m.If(r.sent):
            m.d.sync += r.framed.eq(r.framed + r.frame_n)
        self._message(m, inc, r)
        self._send(m, sender, r)
        with m.If(r.clear):  # nothing of ours is being sent (BAD waits for that)
            m.d.sync += [r.drained.eq(r.filled), r.framed.eq(r.res_in), r.to_send.eq(0),
                         r.sptr.eq(r.filled[:rb])]  # fmt: skip

    def _message(self, m: Module, inc: dict, r: SimpleNamespace) -> None:
        """The message's words from host_o: the head's fields, results and record into
        the ring while it has room; a bad message is read to its end and counted."""
        o, c = self.host_o, self.p.c
        take = Signal()
        m.d.comb += take.eq(o.valid & o.ready)
        room = r.room
        hidx = Signal(range(len(host_port.HEAD_FIELDS)))
        rec = {k: Signal(32, name=f"rec_{k}") for k in ("op_id", "n", "exponent", "world")}
        want = {"op_id": 0, "n": 1, "exponent": 2, "world": RECORD_FIXED - 1}
        rlen = Signal(range(self.rec_max + 1))  # the record's length: world's
        m.d.sync += rlen.eq(RECORD_FIXED + 1 + self.world)
        good, over = Signal(), Signal()
        with m.FSM() as fsm:
            with m.State("HEAD"):
                m.d.comb += o.ready.eq(1)
                with m.If(o.valid & (~o.payload.head | o.payload.last)):  # no head
                    m.d.sync += hidx.eq(0)
                    m.next = "SKIP"
                    with m.If(o.payload.last):
                        m.next = "BAD"
                with m.Elif(o.valid):
                    for k, name in enumerate(host_port.HEAD_FIELDS):
                        with m.If(hidx == k):
                            m.d.sync += getattr(r, name).eq(o.payload.data)
                    m.d.sync += hidx.eq(hidx + 1)
                    with m.If(hidx == len(host_port.HEAD_FIELDS) - 1):
                        m.d.sync += [hidx.eq(0), over.eq(0)]
                        m.next = "SIZE"
            with m.State("SIZE"):  # n from the head, registered before it is used
                m.d.sync += over.eq(r.n > c)
                m.next = "OPEN"
            with m.State("OPEN"):
                with m.If(over):
                    m.next = "SKIP"
                with m.Else():
                    m.d.sync += [r.to_send.eq(r.n), r.rleft.eq(r.n), r.rcount.eq(0)]
                    m.next = "RESULTS"
                    with m.If(r.n == 0):
                        m.next = "RECORD"
            with m.State("RESULTS"):
                m.d.comb += [o.ready.eq(room), r.write.eq(take), r.result_in.eq(take)]
                with m.If(take):
                    m.d.sync += r.rleft.eq(r.rleft - 1)
                    with m.If(o.payload.last):
                        m.next = "BAD"  # fewer words than its head said
                    with m.Elif(r.rleft == 1):
                        m.next = "RECORD"
            with m.State("RECORD"):
                m.d.comb += [o.ready.eq(room), r.write.eq(take)]
                with m.If(take):
                    for name, k in want.items():
                        with m.If(r.rcount == k):
                            m.d.sync += rec[name].eq(o.payload.data)
                    m.d.sync += r.rcount.eq(r.rcount + 1)
                    with m.If(o.payload.last):
                        m.next = "VERIFY"
                    with m.Elif(r.rcount == rlen - 1):
                        m.next = "SKIP"  # longer than world says
            with m.State("VERIFY"):  # the record's compares, registered
                m.d.sync += good.eq(
                    (r.rcount == rlen)
                    & (rec["n"] == r.n)
                    & (rec["op_id"] == r.op_id)
                    & (rec["exponent"][:8] == r.exponent)
                    & (rec["world"] == self.world)
                )
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.next = "BAD"
                with m.If(good):
                    m.next = "STATS"
            with m.State("STATS"):  # once every RESULT frame is out: the record's
                m.d.comb += r.stats_go.eq(r.to_send == 0)
                with m.If(r.stats_done):
                    m.next = "HEAD"
            with m.State("SKIP"):  # a bad message, read to its end
                m.d.comb += o.ready.eq(1)
                with m.If(take & o.payload.last):
                    m.next = "BAD"
            with m.State("BAD"):  # a cycle for the sender's `can` to see the last word
                m.next = "BAD_END"
            with m.State("BAD_END"), m.If(r.send_idle):  # once its filled frames are out
                m.d.comb += [inc["bad_records"].eq(1), r.clear.eq(1)]
                m.next = "HEAD"
        _one_hot(fsm)

    def _send(self, m: Module, sender: SimpleNamespace, r: SimpleNamespace) -> None:
        """RESULT frames of up to tx_fragment words once their words are in the ring, in
        order; then, when the message's record is good, the STATS frame. A frame's words
        leave the ring when it has been sent."""
        frag = self.tx_fragment
        want = Signal(range(frag + 1))  # the next RESULT frame's words, registered
        m.d.sync += want.eq(Mux(r.to_send > frag, frag, r.to_send))
        kind, count = Signal(8), r.frame_n
        base, off = Signal.like(r.sptr), Signal(range(self.p.c + 1))
        is_result = Signal()
        # the sender's fields come from registers set the state before its start
        m.d.comb += [
            sender.op_id.eq(r.op_id), sender.n.eq(r.n), sender.exponent.eq(r.exponent),
            sender.kind.eq(kind), sender.offset.eq(off), sender.base.eq(base),
            sender.count.eq(count),
        ]  # fmt: skip
        can = Signal()  # a RESULT frame's words were all in a cycle ago
        ready = (r.res_in - r.framed)[: len(r.res_in)]
        m.d.sync += can.eq((want != 0) & (ready >= want))
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += r.send_idle.eq(~can)
                with m.If(can):
                    m.d.sync += [kind.eq(host_port.RESULT), count.eq(want), base.eq(r.sptr),
                                 off.eq(r.n - r.to_send), is_result.eq(1)]  # fmt: skip
                    m.next = "GO"
                with m.Elif(r.stats_go):  # the record follows the last result: at sptr
                    m.d.sync += [kind.eq(host_port.STATS), count.eq(r.rcount), base.eq(r.sptr),
                                 off.eq(0), is_result.eq(0)]  # fmt: skip
                    m.next = "GO"
            with m.State("GO"), m.If(sender.free):
                m.d.comb += sender.start.eq(1)
                m.d.sync += r.sptr.eq(r.sptr + count)
                with m.If(is_result):
                    m.d.comb += r.sent.eq(1)
                    m.d.sync += r.to_send.eq(r.to_send - count)
                m.next = "WAIT"
            with m.State("WAIT"), m.If(~sender.busy & ~sender.start):
                m.d.comb += [r.freed.eq(1), r.stats_done.eq(~is_result)]
                m.next = "IDLE"
        _one_hot(fsm)
