"""Packetizer: an op's element stream in, UBT frames (Ethernet/IPv4/UDP/UBT) out.

Model: host/model/packetizer.py (`scatter_frames` in scatter mode, `gather_frames` in gather
mode; `scatter_order` / `gather_order` give the destinations and LAST flags), frames as
optireduce/ubt.py `build_frame`.

Scatter (msg_type 1): `i` carries the whole encoded op, packet after packet (P/lanes beats
each). Packet i goes to rank i mod N; this rank's own packets leave on `own` (first/last per
packet, `own_index`) for the aggregator, the others as frames on `o`.
Gather (msg_type 2): `i` carries the owner's reduced slots in index order (rank, rank + N,
...), one packet each; every slot goes out N-1 times, to every other rank in rank order,
with the `contributors` value sampled with the slot's first beat.

Packets are stored whole before their frame starts (store and forward), in a two-packet
ping-pong buffer: a frame never has a bubble (a MAC must not underrun), and gather can
replay a slot per destination. The buffer is 2*lanes elements wide, so a frame (74 header
bytes + 4P) leaves at 8*lanes bytes per cycle, twice the input rate: with P = 256 the
frame of one packet takes about 140 cycles while the next packet takes 256 to arrive.

Sources (`sources` > 1): several input sides (op context, set-up, ping-pong buffer, own
packets each) share one output side, which takes at each frame's start the first source,
in index order, with a packet waiting. A gather slot's N - 1 frames keep their place
(the next destination) while another source's frames go between them. The NIC core has
two: the scatter packets (0) and the means (1), one frame builder for both.

Op context (msg_type, rank, world, job_id, op_id, exponent, op_len, t_c_us, reserved) is latched
when the op's first beat is offered, once the op before has sent its last packet (its
frames read these fields from the context); the op takes one idle cycle there, then runs
at one beat per cycle. An op has packets_for(op_len) packets (scatter) or the slots of this rank
(gather); `first`/`last` of `i` are not needed. Preconditions: 2 <= world <= n_max,
rank < world, 1 <= op_len <= C.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from optireduce import ubt
from optireduce.hw.addresses import plus_base
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.streams import element_stream, frame_stream
from optireduce.params import NicParams

FRAME_HEADER_BYTES = ubt.L2_L4_LEN + ubt.HEADER_LEN  # 74: bytes before the payload


def _bits(x: int) -> int:
    return max(1, int(x).bit_length())


def _ip_checksum_const(p: NicParams, addressing: ubt.Addressing) -> int:
    """Sum of the IPv4 header words that do not depend on the ranks, plus ip_base twice.

    The one's-complement sum is a sum mod 0xFFFF, so ip(r) = ip_base + r + 1 contributes
    (ip_base words) + r + 1 whatever the carries between its two words.
    """
    ip_len = ubt.IP_LEN + ubt.UDP_LEN + ubt.HEADER_LEN + 4 * p.p
    base = addressing.ip_base
    return (
        0x4500 + ip_len + 0x4000 + ((64 << 8) | ubt.IPPROTO_UDP)
        + 2 * ((base >> 16) + (base & 0xFFFF)) + 2
    )  # fmt: skip


class Packetizer(wiring.Component):
    """UBT frame builder for both phases of an op (see the module docstring).

    Ports: `i` element_stream(32, lanes) in; `o` frame_stream(8 * lanes) out, with `dst`
    (destination rank of the frame on `o`, valid with o.valid, stable through the frame)
    and `src` (its source, likewise); `own` element_stream(32, lanes) out with `own_index`
    (scatter: this rank's own packets). With `sources` > 1 the input ports (i, own,
    own_index and the op context's) are per source, `sources[j]`.
    """

    def __init__(self, p: NicParams, addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
                 sources: int = 1) -> None:  # fmt: skip
        self.p, self.addressing, self.n_sources = p, addressing, sources
        self.lanes = p.lanes
        self.beats = p.p // p.lanes  # input beats per packet
        self.nbytes = 8 * p.lanes  # output bytes per beat
        self.frame_len = FRAME_HEADER_BYTES + 4 * p.p
        self.frame_beats = -(-self.frame_len // self.nbytes)
        self.max_packets = p.c // p.p
        if addressing.ip_base + p.n_max >= 1 << 32:
            raise ValueError("Packetizer: ip_base + n_max overflows 32 bits")
        if sources < 1:
            raise ValueError(f"Packetizer: sources = {sources}, needs at least one")
        self.w_rank = _bits(p.n_max - 1)
        self.w_world = _bits(p.n_max)
        self.w_idx = _bits(self.max_packets)
        # first input beat of a frame's packet -> first beat of the frame on `o`: beats of
        # the packet, then buffer hand-over, checksum, header set-up and the output register.
        self.LATENCY = self.beats + 4
        self.OWN_LATENCY = 1  # first beat of an own packet -> first beat on `own`
        source = {
            "i": In(element_stream(p.w_wire, p.lanes)),
            "own": Out(element_stream(p.w_wire, p.lanes)),
            "own_index": Out(self.w_idx),
            "msg_type": In(2),  # ubt.MSG_SCATTER or ubt.MSG_GATHER
            "rank": In(self.w_rank),
            "world": In(self.w_world),
            "job_id": In(16),
            "op_id": In(32),
            "exponent": In(signed(8)),
            "op_len": In(32),
            "t_c_us": In(32),
            "contributors": In(16),  # gather: sampled with each slot's first beat
            "reserved": In(16),  # the op's proposal word (NicParams.exp_inband), else 0
        }
        out = {
            "o": Out(frame_stream(self.nbytes)),
            "dst": Out(self.w_rank),
            "src": Out(range(max(2, sources))),
        }
        if sources == 1:  # the source's ports are the packetizer's own
            super().__init__({**source, **out})
        else:
            super().__init__({"sources": Out(wiring.Signature(source)).array(sources), **out})

    def _sources(self) -> list:
        """The interfaces of the sources, in priority order."""
        return [self] if self.n_sources == 1 else list(self.sources)

    def _packet_layout(self) -> data.StructLayout:
        """A buffered packet's own header fields (its descriptor)."""
        return data.StructLayout(
            {
                "index": self.w_idx,
                "dst": self.w_rank,  # scatter: the owner; gather: the first destination
                "last": 1,
                "contrib": 16,
            }
        )

    def _desc_layout(self) -> data.StructLayout:
        """What a frame needs: its packet's header fields and the op's context."""
        return data.StructLayout(
            {
                **self._packet_layout().members,
                "gather": 1,
                "rank": self.w_rank,
                "world": self.w_world,
                "job_id": 16,
                "op_id": 32,
                "exponent": signed(8),
                "op_len": 32,
                "t_c_us": 32,
                "reserved": 16,
            }
        )

    def _ip_checksum(self, rank, dst):
        """The IPv4 header checksum of a frame from rank to dst: the rank-independent
        constant plus both, one's-complement folded twice (RFC 1071), inverted."""
        s = Const(_ip_checksum_const(self.p, self.addressing), 20) + rank + dst
        s1 = s[:16] + s[16:]
        return ~(s1[:16] + s1[16:])[:16]

    def _header_bytes(self, d, dst, ck) -> list:
        """The 74 bytes before the payload, as 8-bit values (build_frame's layout); `ck`
        is `_ip_checksum(d.rank, dst)`, registered a cycle ahead (125 MHz)."""
        p, ad = self.p, self.addressing

        def be(value, nbytes: int) -> list:
            v = Cat(value, Const(0, 8 * nbytes))[: 8 * nbytes]  # zero-extend (or truncate)
            return [v[8 * (nbytes - 1 - k) : 8 * (nbytes - k)] for k in range(nbytes)]

        def const(value: int, nbytes: int) -> list:
            return be(Const(value, 8 * nbytes), nbytes)

        udp_len = ubt.UDP_LEN + ubt.HEADER_LEN + 4 * p.p
        ubt_fields = {
            "version": Const(ubt.VERSION, 8),
            "msg_type": Mux(d.gather, ubt.MSG_GATHER, ubt.MSG_SCATTER),
            "flags": Mux(d.last, ubt.FLAG_LAST, 0),
            "exponent": d.exponent.as_unsigned(),
            "job_id": d.job_id,
            "sender": d.rank,
            "op_id": d.op_id,
            "pkt_index": d.index,
            "count": Const(p.p, 16),
            "contributors": Mux(d.gather, d.contrib, 0),
            "t_c_us": d.t_c_us,
            "op_len": d.op_len,
            "world": d.world,
            "reserved": d.reserved,
        }
        out = [
            *be(plus_base(ad.mac_base, dst, 48), 6),
            *be(plus_base(ad.mac_base, d.rank, 48), 6),
            *const(ubt.ETHERTYPE_IPV4, 2),
            *const(0x4500, 2),
            *const(ubt.IP_LEN + udp_len, 2),
            *const(0, 2),  # id
            *const(0x4000, 2),  # DF
            *const((64 << 8) | ubt.IPPROTO_UDP, 2),  # TTL, protocol
            *be(ck, 2),
            *be(plus_base(ad.ip_base + 1, d.rank, 32), 4),
            *be(plus_base(ad.ip_base + 1, dst, 32), 4),
            *const(p.udp_port, 2),
            *const(p.udp_port, 2),
            *const(udp_len, 2),
            *const(0, 2),  # UDP checksum: not computed
        ]
        for f in ubt.FIELDS:
            out += be(ubt_fields[f.name], ubt.field_bits(f) // 8)
        assert len(out) == FRAME_HEADER_BYTES
        return out

    def elaborate(self, platform):
        m = Module()
        sides = []
        for j, src in enumerate(self._sources()):
            s = SimpleNamespace(
                src=src, tag="" if self.n_sources == 1 else str(j), platform=platform
            )
            self._op_context(m, s)
            self._setup(m, s)
            self._input_side(m, s)
            sides.append(s)
        self._output_side(m, sides)
        return m

    def _op_context(self, m: Module, s: SimpleNamespace) -> None:
        """Op context, latched when an op's first beat is offered."""
        p, w_idx, desc_layout, src = self.p, self.w_idx, self._desc_layout(), s.src
        s.active = Signal()  # inside an op
        s.ctx = Signal(desc_layout)  # op fields of the current op (index/dst/last unused)
        s.gather = s.ctx.gather
        # the frames read the op's fields here: a new op waits for the last one's packets
        s.full = Signal(2)  # buffer halves holding a packet not yet sent
        s.start = ~s.active & ~s.full.any() & src.i.valid
        with m.If(s.start):
            m.d.sync += [
                s.active.eq(1),
                s.ctx.gather.eq(src.msg_type == ubt.MSG_GATHER),
                s.ctx.rank.eq(src.rank),
                s.ctx.world.eq(src.world),
                s.ctx.job_id.eq(src.job_id),
                s.ctx.op_id.eq(src.op_id),
                s.ctx.exponent.eq(src.exponent),
                s.ctx.op_len.eq(src.op_len),
                s.ctx.t_c_us.eq(src.t_c_us),
                s.ctx.reserved.eq(src.reserved),
            ]

        # packets of the op: packets_for(op_len) = max(1, ceil(op_len / B)) * B / P
        blocks = Mux(s.ctx.op_len == 0, 1, (s.ctx.op_len + p.b - 1) >> p.log2_b)
        s.n_pk = Signal(w_idx + 1)
        m.d.comb += s.n_pk.eq(blocks << (p.log2_b - (p.p.bit_length() - 1)))

    def _setup(self, m: Module, s: SimpleNamespace) -> None:
        """Per-op set-up: q, r = divmod(n, N) and the LAST counts."""
        p, w_idx = self.p, self.w_idx
        # flagged_count(x) = max(1, ceil(x * last_percent / 100)) for the two per-owner
        # packet counts q and q + 1; a restoring divider (one bit per cycle) does all three
        # divisions, once per op, while the first packet fills the buffer.
        lp = p.last_percent
        w_num = max(w_idx + 1, _bits((self.max_packets + 1) * lp + 99))
        w_den = max(self.w_world, _bits(100))
        dv_num = Signal(w_num)  # dividend, shifted out; quotient shifted in
        dv_rem = Signal(w_den + 1)
        dv_den = Signal(w_den)
        dv_cnt = Signal(range(w_num + 1))
        dv_t = Signal(w_den + 2)
        m.d.comb += dv_t.eq(Cat(dv_num[-1], dv_rem))
        with m.If(dv_cnt != 0):
            m.d.sync += dv_cnt.eq(dv_cnt - 1)
            with m.If(dv_t >= dv_den):
                m.d.sync += [dv_rem.eq(dv_t - dv_den), dv_num.eq(Cat(1, dv_num[:-1]))]
            with m.Else():
                m.d.sync += [dv_rem.eq(dv_t), dv_num.eq(Cat(0, dv_num[:-1]))]

        def divide(num, den) -> list:
            return [dv_num.eq(num), dv_den.eq(den), dv_rem.eq(0), dv_cnt.eq(w_num)]

        s.q = Signal(w_idx + 1)
        s.r = Signal(self.w_world)
        s.nf_lo = Signal(w_num)  # flagged_count(q)
        s.nf_hi = Signal(w_num)  # flagged_count(q + 1)
        s.n_slots = Signal(w_idx + 1)  # gather: packets this rank owns
        s.nf_g = Signal(w_num)  # gather: LAST iff row + this >= n_slots
        s.setup_done = Signal()
        with m.FSM(name=f"setup{s.tag}"):
            with m.State("IDLE"), m.If(s.start):
                m.d.sync += s.setup_done.eq(0)
                m.next = "START"
            with m.State("START"):
                m.d.sync += divide(s.n_pk, s.ctx.world)
                m.next = "DIV_N"
            with m.State("DIV_N"), m.If(dv_cnt == 0):
                m.d.sync += [s.q.eq(dv_num), s.r.eq(dv_rem)]
                m.d.sync += divide(dv_num * lp + 99, 100)
                m.next = "DIV_LO"
            with m.State("DIV_LO"), m.If(dv_cnt == 0):
                m.d.sync += s.nf_lo.eq(Mux(dv_num == 0, 1, dv_num))
                m.d.sync += divide((s.q + 1) * lp + 99, 100)
                m.next = "DIV_HI"
            with m.State("DIV_HI"), m.If(dv_cnt == 0):
                m.d.sync += s.nf_hi.eq(Mux(dv_num == 0, 1, dv_num))
                m.next = "FINISH"
            with m.State("FINISH"):
                below = s.ctx.rank < s.r  # this rank owns q + 1 packets
                m.d.sync += [
                    s.n_slots.eq(s.q + below),
                    s.nf_g.eq(Mux(below, s.nf_hi, s.nf_lo)),
                    s.setup_done.eq(1),
                ]
                m.next = "IDLE"

    def _input_side(self, m: Module, s: SimpleNamespace) -> None:
        """Input side: own packets pass, the others fill the ping-pong buffer."""
        p, L, beats, w_idx, w_rank = self.p, self.lanes, self.beats, self.w_idx, self.w_rank
        packet_layout, src = self._packet_layout(), s.src
        words = max(1, beats // 2)  # buffer words (2 * lanes elements) per packet
        s.w_word = (words - 1).bit_length()
        # the output side reads a full half, the input side writes the other: a read that
        # collides with a write is an idle read, not used
        mem = block_ram(shape=unsigned(2 * L * p.w_wire), depth=2 * words)
        m.submodules[f"mem{s.tag}"] = mem
        wp = mem.write_port(granularity=L * p.w_wire)
        s.rp = read_port(m, mem, (wp,), platform=s.platform)

        set_full = Signal(2)
        s.clr_full = Signal(2)
        m.d.sync += s.full.eq((s.full | set_full) & ~s.clr_full)
        s.desc = [Signal(packet_layout, name=f"desc{h}") for h in range(2)]

        beat = Signal(range(beats))  # beat inside the packet
        pk = Signal(w_idx + 1)  # scatter: packet index; gather: slot row
        row = Signal(w_idx + 1)  # scatter: pk // N, the packet's rank among those to dst
        dst = Signal(w_rank)  # scatter: pk mod N
        gidx = Signal(w_idx + 1)  # gather: packet index of the row, rank + row * N
        contrib = Signal(16)
        wr_half = Signal()
        pk_last_beat = beat == beats - 1
        is_own = ~s.gather & (dst == s.ctx.rank)
        own_free = ~src.own.valid | src.own.ready
        buf_free = ~Mux(wr_half, s.full[1], s.full[0])
        # a packet's last beat commits its descriptor, which needs the set-up
        m.d.comb += src.i.ready.eq(
            s.active & (~pk_last_beat | s.setup_done) & Mux(is_own, own_free, buf_free)
        )
        take = src.i.valid & src.i.ready
        take_own = take & is_own
        take_buf = take & ~is_own

        with m.If(src.own.ready):
            m.d.sync += src.own.valid.eq(0)
        with m.If(take_own):
            m.d.sync += [
                src.own.valid.eq(1),
                src.own.payload.data.eq(src.i.payload.data),
                src.own.payload.first.eq(beat == 0),
                src.own.payload.last.eq(pk_last_beat),
            ]
            with m.If(beat == 0):
                m.d.sync += src.own_index.eq(pk)

        data_in = src.i.payload.data.as_value()
        m.d.comb += [
            wp.addr.eq(Cat((beat >> 1)[: s.w_word], wr_half)),
            wp.data.eq(Cat(data_in, data_in)),
            wp.en.eq(Mux(take_buf, Mux(beat[0] if beats > 1 else 0, 0b10, 0b01), 0)),
        ]
        with m.If(take & (beat == 0)):
            m.d.sync += contrib.eq(src.contributors)

        new = Signal(packet_layout)
        # scatter: dst gets q + (dst < r) packets, the last flagged_count of them flagged
        more = dst < s.r
        last_sc = row + Mux(more, s.nf_hi, s.nf_lo) >= s.q + more
        first_dst = Mux(s.ctx.rank == 0, 1, 0)
        m.d.comb += [
            new.index.eq(Mux(s.gather, gidx, pk)),
            new.dst.eq(Mux(s.gather, first_dst, dst)),
            new.last.eq(Mux(s.gather, pk + s.nf_g >= s.n_slots, last_sc)),
            new.contrib.eq(Mux(beat == 0, src.contributors, contrib)),
        ]
        op_end = Mux(s.gather, pk + 1 == s.n_slots, pk + 1 == s.n_pk)
        with m.If(take):
            m.d.sync += beat.eq(Mux(pk_last_beat, 0, beat + 1))
        with m.If(take & pk_last_beat):
            m.d.sync += [
                pk.eq(pk + 1),
                dst.eq(Mux(dst + 1 == s.ctx.world, 0, dst + 1)),
                row.eq(row + (dst + 1 == s.ctx.world)),
                gidx.eq(gidx + s.ctx.world),
            ]
            with m.If(~is_own):
                m.d.sync += wr_half.eq(~wr_half)
                m.d.comb += set_full.eq(Mux(wr_half, 0b10, 0b01))
                for h in range(2):
                    with m.If(wr_half == h):
                        m.d.sync += s.desc[h].eq(new)
            with m.If(op_end):
                m.d.sync += [s.active.eq(0), pk.eq(0), dst.eq(0), row.eq(0)]
        with m.If(s.start):
            m.d.sync += gidx.eq(src.rank)

    def _output_side(self, m: Module, sides: list) -> None:
        """Output side: the buffered packets of every source, a frame at a time (the first
        source in priority order with a packet, at each frame's start): header beats, then
        the payload realigned to the beat."""
        p, L, nbytes, w_rank = self.p, self.lanes, self.nbytes, self.w_rank
        desc_layout, packet_layout, n = self._desc_layout(), self._packet_layout(), len(sides)
        # Beat k0 holds the last `a` header bytes, then payload; each later beat holds the
        # last `a` bytes of buffer word m - 1 and the first nbytes - a of word m.
        k0, a = divmod(FRAME_HEADER_BYTES, nbytes)
        assert a > 0
        nb = self.frame_beats
        last_keep = (1 << (self.frame_len - (nb - 1) * nbytes)) - 1

        cur = Signal(range(max(2, n)))  # the source of the frame being sent
        rd_half = [Signal(name=f"rd_half{j}") for j in range(n)]
        # a gather slot goes to N - 1 ranks, with other sources' frames between: the next
        # destination of each source's packet, once it has begun (`going`)
        going = [Signal(name=f"going{j}") for j in range(n)]
        next_dst = [Signal(w_rank, name=f"next_dst{j}") for j in range(n)]
        rdst = Signal(w_rank)

        def by_source(values):
            v = values[0]
            for j in range(1, n):
                v = Mux(cur == j, values[j], v)
            return v

        def desc_of(j: int):  # the descriptor of source j's packet
            return Mux(rd_half[j], sides[j].desc[1].as_value(), sides[j].desc[0].as_value())

        # the header from the frame's fields as they stand (both hold for the frame): no
        # register of its 74 bytes
        hdr = Signal(8 * FRAME_HEADER_BYTES)
        k = Signal(range(nb))
        prev = Signal(2 * L * p.w_wire)
        sel = Signal(desc_layout)
        packet = data.View(packet_layout, by_source([desc_of(j) for j in range(n)]))
        m.d.comb += sel.eq(by_source([sd.ctx.as_value() for sd in sides]))
        m.d.comb += [getattr(sel, f).eq(getattr(packet, f)) for f in packet_layout.members]

        def word_byte(word, x: int):
            """Byte x of a buffer word in frame order: elements big-endian."""
            e, b = divmod(x, 4)
            return word[32 * e + 8 * (3 - b) : 32 * e + 8 * (4 - b)]

        def hdr_byte(x: int):
            return hdr[8 * x : 8 * x + 8]

        adv = ~self.o.valid | self.o.ready
        # The buffer word of beat k is read two beats ahead and registered (`word`), so
        # the BRAM's clock-to-out only drives a flip-flop (125 MHz); the k0 header beats
        # cover the first two reads. With a single header beat (16 lanes) it is read one
        # beat ahead and used as the BRAM gives it.
        ahead = 2 if k0 >= 2 else 1
        w_word = sides[0].w_word
        rd_data = by_source([sd.rp.data for sd in sides])
        word = Signal(len(rd_data))
        m_next = Signal(signed(_bits(nb) + 3))
        m.d.comb += m_next.eq(k + (ahead - k0))
        rd_addr, rd_en = Signal(w_word), Signal()
        for j, sd in enumerate(sides):
            m.d.comb += [sd.rp.addr.eq(Cat(rd_addr, rd_half[j])), sd.rp.en.eq(rd_en)]
        m.d.comb += rd_addr.eq(Mux(m_next < 0, 0, m_next)[:w_word])
        emit_adv = Signal()  # an EMIT beat goes out: the read pipeline moves
        if ahead == 2:
            with m.If(emit_adv):
                m.d.sync += word.eq(rd_data)
        else:
            m.d.comb += word.eq(rd_data)

        # registered a cycle ahead of their use (125 MHz): the IP checksum of the frame to
        # rdst (PREP0 waits for it), and the next gather destination (rdst holds for the
        # frame's nb >= 2 beats)
        assert nb >= 2
        ck = Signal(16)
        m.d.sync += ck.eq(self._ip_checksum(sel.rank, rdst))
        m.d.comb += hdr.eq(Cat(*self._header_bytes(sel, rdst, ck)))
        nd_r = Signal(w_rank)
        nd_ok = Signal()
        nd1 = rdst + 1
        nd = Mux(nd1 == sel.rank, rdst + 2, nd1)
        m.d.sync += [nd_r.eq(nd), nd_ok.eq(sel.gather & (nd < sel.world))]

        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.FSM(name="tx"):
            with m.State("IDLE"):
                for j, sd in enumerate(sides):
                    with (m.Elif if j else m.If)(Mux(rd_half[j], sd.full[1], sd.full[0])):
                        first = data.View(packet_layout, desc_of(j)).dst
                        m.d.sync += [cur.eq(j), rdst.eq(Mux(going[j], next_dst[j], first))]
                        m.next = "PREP0"
            with m.State("PREP0"):
                m.next = "PREP"
            with m.State("PREP"):
                # the first buffer word read ahead
                m.d.comb += [rd_addr.eq(0), rd_en.eq(1)]
                m.next = "EMIT"
            with m.State("EMIT"):
                m.d.comb += [rd_en.eq(adv), emit_adv.eq(adv)]
                with m.If(adv):
                    lanes_out = []
                    for j in range(nbytes):
                        if j < a:
                            src_hdr = hdr_byte(k0 * nbytes + j)
                            lanes_out.append((src_hdr, word_byte(prev, nbytes - a + j)))
                        else:
                            lanes_out.append((None, word_byte(word, j - a)))
                    with m.Switch(k):
                        for kk in range(k0):
                            with m.Case(kk):
                                m.d.sync += self.o.payload.data.as_value().eq(
                                    Cat(*(hdr_byte(kk * nbytes + j) for j in range(nbytes)))
                                )
                        with m.Case(k0):
                            m.d.sync += self.o.payload.data.as_value().eq(
                                Cat(*(h if h is not None else w for h, w in lanes_out))
                            )
                        with m.Default():
                            m.d.sync += self.o.payload.data.as_value().eq(
                                Cat(*(w for _, w in lanes_out))
                            )
                    m.d.sync += [
                        prev.eq(word),
                        self.o.valid.eq(1),
                        self.o.payload.last.eq(k == nb - 1),
                        self.o.payload.keep.eq(Mux(k == nb - 1, last_keep, (1 << nbytes) - 1)),
                        k.eq(k + 1),
                    ]
                    with m.If(k == 0):  # dst and src change with the frame's first beat
                        m.d.sync += [self.dst.eq(rdst), self.src.eq(cur)]
                    with m.If(k == nb - 1):
                        m.d.sync += k.eq(0)
                        # gather: the same slot to the next rank, skipping our own
                        for j, sd in enumerate(sides):
                            with m.If(cur == j):
                                with m.If(nd_ok):
                                    m.d.sync += [going[j].eq(1), next_dst[j].eq(nd_r)]
                                with m.Else():
                                    m.d.comb += sd.clr_full.eq(Mux(rd_half[j], 0b10, 0b01))
                                    m.d.sync += [going[j].eq(0), rd_half[j].eq(~rd_half[j])]
                        m.next = "IDLE"
