"""Gather buffer: reduced packets placed by index, drained in index order for the decode.

Model: `host/model/gather_buffer.py: GatherBuffer` (place, have, histogram) and the way
`host/model/codec.py: decode` reads it (missing packets are zeros; k = received packets
per block of b).

Slots: the buffer holds `slots` ops (default K = p.ops_in_flight; the NIC core uses
2K, its whole receive window; slots of c elements each, one BRAM array of
slots * c elements), chosen by the `slot` port. The driver maps op ids to
slots (op_id mod K): a slot is cleared before its op starts receiving and drained
when its phase 2 ends, so the next op's packets land in another slot while one is
drained.

Input `i` (element_stream(32, lanes)): one reduced packet of p elements (p/lanes
beats), `first` on its first beat. `slot`, `pkt_index` and `contributors` are
sampled with the first beat. A packet is dropped whole, with a one-cycle strobe,
when it is a duplicate (`have` bit already set: `duplicate`) or its index is outside
the slot (`pkt_index >= c/p`, or `slot >= K`: `out_of_range`); the parser has
checked lengths, so beats after the p/lanes-th are ignored and never write outside
the packet. `contributors` in 1..n_max is counted in the histogram (the parser
rejects other values; they are not counted).

Command `cmd` (one at a time; `cmd.ready` is low while one runs):
- CLEAR slot: `have` bits, histogram and missing count of the slot to zero
  (max(n_max + 1, c / b) cycles, one more behind a histogram increment; the input
  stalls meanwhile). After reset every slot is
  cleared the same way before `i` and `cmd` become ready.
- DRAIN slot, n: streams the op's padded length (ceil(n / b) blocks of b, at least
  one, at most c/b) on `o` in index order, missing packets as zeros, `first`/`last`
  on each block's first and last beat. With each block's first beat it emits, on
  the side stream `k`, the number of packets of that block received (0..b/p): the
  BlockDivider's k. Draining does not change the slot (a drain can be repeated).
  A DRAIN taken while a placed packet's beats still arrive (its have bit is set at its
  first beat) reads them right only if they keep coming at one per cycle, ahead of the
  drain's reads. The core relies on its parser releasing an accepted packet's payload
  from its bank back to back (not proven), and this buffer never stalls its input
  during a drain. With gaps the drain overtakes them (measured on a 128-word drain: an
  idle cycle after each beat of the last packet gave 2 wrong words, three gave 5).
  SdramGatherBuffer fences this case.

Histogram (`hist_slot`, `hist_addr` -> `hist_data` one cycle later): entry c >= 1 is
the number of packets placed with c contributors; entry 0 is the number of missing
packets of the slot's last drain (`GatherBuffer.histogram(n_max)`).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Array, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.host.model.gather_buffer import GatherBuffer
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.sections import elaborate_sections
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams


class GatherOp(enum.Enum, shape=1):
    DRAIN = 0
    CLEAR = 1


def command_layout(p: NicParams, slots: int | None = None) -> data.StructLayout:
    return data.StructLayout(
        {"op": GatherOp, "slot": range(slots or p.ops_in_flight), "n": range(p.c + 1)}
    )


def placement_ports(p: NicParams, n_slots: int) -> dict:
    """Where the packet on `i` goes (slot, index, contributor count) and the verdicts on it."""
    return {
        "slot": In(range(n_slots)),
        "pkt_index": In(32),
        "contributors": In(p.n_max.bit_length()),
        "duplicate": Out(1),
        "out_of_range": Out(1),
    }


def histogram_ports(p: NicParams, n_slots: int) -> dict:
    """The contributor histogram's read port: packets of `hist_slot` with `hist_addr`
    contributors."""
    return {
        "hist_slot": In(range(n_slots)),
        "hist_addr": In(range(p.n_max + 1)),
        "hist_data": Out(range(p.c // p.p + 1)),
    }


class GatherBuffer(wiring.Component):
    """K slots of c elements with have bits and a contributor histogram (module docstring)."""

    MODEL = GatherBuffer  # with codec.decode's z, have and k per block
    K_STEPS = 2  # registered steps of a block's k: the have window, then its count (fixed)
    # DRAIN command accepted -> first beat on o: the first block's k (K_STEPS), the
    # address, the BRAM read
    LATENCY = 2 + K_STEPS

    def __init__(self, p: NicParams, slots: int | None = None, **more_ports: wiring.Member) -> None:
        """`more_ports`: members a variant adds (its element store's port)."""
        self.p = p
        self.n_slots = slots or p.ops_in_flight
        if self.n_slots < 1:
            raise ValueError(f"GatherBuffer: slots={slots} must be at least 1")
        self.n_pkts = p.c // p.p  # packets per slot
        ppb = p.packets_per_block
        super().__init__(
            {
                "i": In(element_stream(p.w_wire, p.lanes)),
                **placement_ports(p, self.n_slots),
                "cmd": In(stream.Signature(command_layout(p, self.n_slots))),
                "o": Out(element_stream(p.w_wire, p.lanes)),
                "k": Out(stream.Signature(range(ppb + 1))),
                **histogram_ports(p, self.n_slots),
                **more_ports,
            }
        )

    def elaborate(self, platform):
        return elaborate_sections(
            self._element_memory,
            self._bookkeeping,
            self._control,
            self._input,
            self._drain,
            platform=platform,
        )

    def _element_memory(self, m: Module, s: SimpleNamespace) -> None:
        """The slots' elements: one BRAM array."""
        p = self.p
        # a drain that overlaps a placed packet's arrival reads each word after its write
        # (docstring: the writes stay ahead); a read in its word's write cycle had the old
        # word before, wrong either way: no result needs a colliding read
        m.submodules.mem = mem = block_ram(
            shape=data.ArrayLayout(signed(p.w_wire), p.lanes), depth=self.n_slots * p.c // p.lanes
        )
        s.wr = mem.write_port()
        s.rd = read_port(m, mem, (s.wr,), platform=s.platform)

    def _bookkeeping(self, m: Module, s: SimpleNamespace) -> None:
        """The contributor histograms, the have bits and the missing counts."""
        p, n_slots, n_pkts, hw = self.p, self.n_slots, self.n_pkts, self.n_pkts.bit_length()
        hn = p.n_max + 1
        m.submodules.hist = hist = Memory(shape=hw, depth=n_slots * hn, init=[])
        s.h_wr = hist.write_port()
        s.h_rmw = hist.read_port(
            transparent_for=(s.h_wr,)
        )  # back-to-back increments see each other
        s.h_host = hist.read_port()

        # The have bits: a word per block of a slot (ppb bits, a bit per packet) in LUT
        # RAM, read by the placement, a drained beat and a block's k (each a read port),
        # set by a placement (the placement's read, or-ed: a write port). As a register,
        # each random access was a 2K * C/P-to-1 mux (770 LUTs of the 25F at C = 16K).
        ppb = p.packets_per_block
        s.n_words = n_pkts // ppb  # words per slot
        s.lp = ppb.bit_length() - 1  # a packet's bit in its block's word: its index's low bits
        m.submodules.have = have = Memory(shape=ppb, depth=n_slots * s.n_words, init=[])
        s.hv_wr = have.write_port()
        s.hv_place, s.hv_beat, s.hv_win = (have.read_port(domain="comb") for _ in range(3))
        s.missing = Array(Signal(hw, name=f"missing_{k}") for k in range(n_slots))

    def _control(self, m: Module, s: SimpleNamespace) -> None:
        """Control: reset-time clear of every slot, CLEAR, DRAIN."""
        p, n_slots, n_pkts = self.p, self.n_slots, self.n_pkts
        ppb, n_blocks, hn = p.packets_per_block, p.c // p.b, p.n_max + 1
        s.clr_addr = Signal(range(n_slots * hn + 1))
        clr_end = Signal(range(n_slots * hn + 1), init=n_slots * hn)
        nw = n_slots * s.n_words
        hv_addr = Signal(range(nw + 1))  # the have word cleared next
        hv_end = Signal(range(nw + 1), init=nw)  # ... and the one after the last
        hv_done = Signal()  # the last have word is cleared by this cycle's end
        m.d.comb += hv_done.eq((hv_addr == hv_end) | (hv_addr == hv_end - 1))
        s.inc_pending = Signal()
        s.d_slot = Signal(range(n_slots))
        s.d_last_pkt = Signal(range(n_pkts))
        s.clearing = Signal()
        s.draining = Signal()
        s.d_done = Signal()  # the drain's last beat is issued
        with m.FSM(init="INIT"):
            with m.State("INIT"):
                m.d.comb += s.clearing.eq(1)
                m.d.sync += clr_end.eq(n_slots * hn)
                with m.If((s.clr_addr >= n_slots * hn - 1) & hv_done):
                    m.next = "IDLE"
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                cmd = self.cmd.payload
                with m.If(self.cmd.valid):
                    with m.If(cmd.op == GatherOp.CLEAR):
                        m.d.sync += [s.clr_addr.eq(cmd.slot * hn), clr_end.eq(cmd.slot * hn + hn)]
                        m.d.sync += [hv_addr.eq(cmd.slot * s.n_words),
                                     hv_end.eq(cmd.slot * s.n_words + s.n_words)]  # fmt: skip
                        m.d.sync += s.missing[cmd.slot].eq(0)
                        m.next = "CLEAR"
                    with m.Else():
                        blocks = Signal(33)
                        m.d.comb += blocks.eq((cmd.n + p.b - 1) >> p.log2_b)
                        nb = Mux(blocks == 0, 1, Mux(blocks > n_blocks, n_blocks, blocks))
                        m.d.sync += [s.d_slot.eq(cmd.slot), s.d_last_pkt.eq(nb * ppb - 1)]
                        m.d.sync += s.missing[cmd.slot].eq(0)  # counted afresh by each drain
                        m.next = "DRAIN"
            with m.State("CLEAR"):
                m.d.comb += s.clearing.eq(1)
                with m.If(~s.inc_pending & (s.clr_addr >= clr_end - 1) & hv_done):
                    m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += s.draining.eq(1)
                with m.If(s.d_done):
                    m.next = "IDLE"

        # Histogram clear: one entry per cycle, yielding to an increment in flight; the
        # have words alongside, one per cycle (the input stalls meanwhile).
        with m.If(s.clearing & ~s.inc_pending & (s.clr_addr < clr_end - 1)):
            m.d.sync += s.clr_addr.eq(s.clr_addr + 1)
        s.hv_clear, s.hv_addr = Signal(), hv_addr
        m.d.comb += s.hv_clear.eq(s.clearing & (hv_addr != hv_end))
        with m.If(s.hv_clear):
            m.d.sync += hv_addr.eq(hv_addr + 1)

    def _input(self, m: Module, s: SimpleNamespace) -> None:
        """Input: place packets by index."""
        p, n_slots, n_pkts, hw = self.p, self.n_slots, self.n_pkts, self.n_pkts.bit_length()
        lanes, bpp, beats_per_slot, hn = p.lanes, p.p // p.lanes, p.c // p.lanes, p.n_max + 1
        room = self._store_room(m, s)
        m.d.comb += self.i.ready.eq(~s.clearing if room is None else ~s.clearing & room)
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)
        first = self.i.payload.first
        pkt = self.pkt_index[: max(1, (n_pkts - 1).bit_length())]
        in_range = Signal()
        m.d.comb += in_range.eq((self.pkt_index < n_pkts) & (self.slot < n_slots))
        lp = s.lp
        bit = pkt[:lp] if lp else 0
        m.d.comb += s.hv_place.addr.eq(self.slot * s.n_words + (pkt >> lp))
        is_dup = Signal()
        m.d.comb += is_dup.eq(in_range & s.hv_place.data.bit_select(bit, 1))
        place = Signal()
        m.d.comb += place.eq(take & first & in_range & ~is_dup)

        drop = Signal(init=1)  # until the first packet, stray beats are ignored
        beat = Signal(range(bpp + 1))
        s.placing = ~drop & (beat < bpp)  # a placed packet's beats are still coming
        base = Signal(range(n_slots * beats_per_slot))
        first_addr = Signal(range(n_slots * beats_per_slot))
        m.d.comb += first_addr.eq(self.slot * beats_per_slot + pkt * bpp)
        wr_en, wr_addr = Signal(), Signal(range(n_slots * beats_per_slot))
        wr_data = Signal(data.ArrayLayout(signed(p.w_wire), lanes))
        m.d.sync += [
            wr_en.eq(0),
            self.duplicate.eq(take & first & is_dup),
            self.out_of_range.eq(take & first & ~in_range),
        ]
        with m.If(take):
            m.d.sync += wr_data.eq(self.i.payload.data)
            with m.If(first):
                m.d.sync += [drop.eq(~place), beat.eq(1), base.eq(first_addr)]
                m.d.sync += [wr_en.eq(place), wr_addr.eq(first_addr)]
                with m.If(place):
                    m.d.comb += [
                        s.hv_wr.en.eq(1),
                        s.hv_wr.addr.eq(s.hv_place.addr),
                        s.hv_wr.data.eq(s.hv_place.data | (1 << bit)),
                    ]
            with m.Elif(~drop & (beat < bpp)):
                m.d.sync += [wr_en.eq(1), wr_addr.eq(base + beat), beat.eq(beat + 1)]
        with m.If(s.hv_clear):  # the input stalls while clearing: no placement now
            m.d.comb += [s.hv_wr.en.eq(1), s.hv_wr.addr.eq(s.hv_addr), s.hv_wr.data.eq(0)]
        self._store(m, s, wr_en, wr_addr, wr_data)

        # Histogram increment: read at the first beat, write back +1 the next cycle.
        counted = Signal()
        m.d.comb += counted.eq(place & (self.contributors >= 1) & (self.contributors <= p.n_max))
        inc_addr = Signal.like(s.h_wr.addr)
        m.d.comb += s.h_rmw.addr.eq(self.slot * hn + self.contributors)
        m.d.sync += [s.inc_pending.eq(counted), inc_addr.eq(s.h_rmw.addr)]
        with m.If(s.inc_pending):
            m.d.comb += [
                s.h_wr.en.eq(1),
                s.h_wr.addr.eq(inc_addr),
                s.h_wr.data.eq(s.h_rmw.data + 1),
            ]
        with m.Elif(s.clearing):
            m.d.comb += [s.h_wr.en.eq(1), s.h_wr.addr.eq(s.clr_addr), s.h_wr.data.eq(0)]

        # Host read of the histogram (entry 0: missing packets of the last drain).
        m.d.comb += s.h_host.addr.eq(self.hist_slot * hn + self.hist_addr)
        zero_r, miss_r = Signal(), Signal(hw)
        m.d.sync += [zero_r.eq(self.hist_addr == 0), miss_r.eq(s.missing[self.hist_slot])]
        m.d.comb += self.hist_data.eq(Mux(zero_r, miss_r, s.h_host.data))

    def _store_room(self, m: Module, s: SimpleNamespace) -> Value | None:
        """Whether the element store takes a beat now; None: always (a BRAM)."""
        return None

    def _store(self, m: Module, s: SimpleNamespace, en, addr, value) -> None:
        """Write one beat of a placed packet (registered: the cycle after it was taken)."""
        m.d.comb += [s.wr.en.eq(en), s.wr.addr.eq(addr), s.wr.data.eq(value)]

    def _drain(self, m: Module, s: SimpleNamespace) -> None:
        """Drain: issue addresses (stage A), the memory output is stage B = o."""
        adv = Signal()
        m.d.comb += adv.eq(self.o.ready | ~self.o.valid)
        beat = self._drain_walk(m, s, adv)
        m.d.comb += [s.rd.addr.eq(beat.addr), s.rd.en.eq(adv)]
        b_have = Signal()
        with m.If(adv):
            m.d.sync += [
                self.o.valid.eq(beat.go),
                b_have.eq(beat.have),
                self.o.payload.first.eq(beat.first),
                self.o.payload.last.eq(beat.last),
            ]
        for j in range(self.p.lanes):
            m.d.comb += self.o.payload.data[j].eq(Mux(b_have, s.rd.data[j], 0))

    def _drain_walk(self, m: Module, s: SimpleNamespace, adv) -> SimpleNamespace:
        """Stage A of a drain: the slot's beats in index order, one per cycle `adv` allows,
        with the k of each block on `k`. Returns the beat offered now: `go` (taken now),
        its address, have bit and first/last."""
        p, n_slots, n_pkts = self.p, self.n_slots, self.n_pkts
        ppb, bpp = p.packets_per_block, p.p // p.lanes
        beats_per_slot = p.c // p.lanes
        d_pkt = Signal(range(n_pkts))
        d_bip = Signal(range(bpp))  # beat in packet
        d_addr = Signal(range(n_slots * beats_per_slot))
        k_pkt = Signal(range(n_pkts + ppb + 1))  # first packet of the next block to start
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [
                d_pkt.eq(0),
                k_pkt.eq(0),
                d_bip.eq(0),
                d_addr.eq(self.cmd.payload.slot * beats_per_slot),
            ]
        blk_start = Signal()
        m.d.comb += blk_start.eq((d_bip == 0) & (d_pkt % ppb == 0))
        blk_end = Signal()
        m.d.comb += blk_end.eq((d_bip == bpp - 1) & (d_pkt % ppb == ppb - 1))
        # the next block's k (its packets present) in K_STEPS = 2 registered steps, from
        # the have bits under (d_slot, k_pkt): the window, then its count. A block start
        # waits until both steps have seen the current k_pkt (K_STEPS cycles after it last
        # moved; the slot's have bits do not change while it drains). With blocks of at
        # least K_STEPS + 1 beats (b / lanes >= 3: every real build) only the first block
        # waits; shorter blocks (tiny test params) drain at one block per 3 cycles.
        win = Signal(ppb)
        kcount = Signal(range(ppb + 1))
        moved = Signal(self.K_STEPS, init=(1 << self.K_STEPS) - 1)  # position moved, per step
        lp = s.lp
        m.d.comb += [
            s.hv_win.addr.eq(s.d_slot * s.n_words + (k_pkt >> lp)),
            s.hv_beat.addr.eq(s.d_slot * s.n_words + (d_pkt >> lp)),
        ]
        m.d.sync += [win.eq(s.hv_win.data), kcount.eq(sum(win[j] for j in range(ppb)))]
        go = Signal()
        m.d.comb += go.eq(
            s.draining & adv & (~blk_start | (~moved.any() & (~self.k.valid | self.k.ready)))
        )
        moves = (self.cmd.valid & self.cmd.ready) | (go & blk_start)
        m.d.sync += moved.eq(Cat(moves, moved[:-1]))

        with m.If(self.k.ready):
            m.d.sync += self.k.valid.eq(0)
        with m.If(go):
            m.d.sync += [d_addr.eq(d_addr + 1), d_bip.eq(d_bip + 1)]
            with m.If(d_bip == bpp - 1):
                m.d.sync += [d_bip.eq(0), d_pkt.eq(d_pkt + 1)]
                m.d.comb += s.d_done.eq(d_pkt == s.d_last_pkt)
            with m.If(blk_start):
                m.d.sync += [
                    k_pkt.eq(k_pkt + ppb),
                    self.k.valid.eq(1),
                    self.k.payload.eq(kcount),
                    s.missing[s.d_slot].eq(s.missing[s.d_slot] + ppb - kcount),
                ]
        return SimpleNamespace(
            go=go,
            addr=d_addr,
            have=s.hv_beat.data.bit_select(d_pkt[:lp] if lp else 0, 1),
            first=blk_start,
            last=blk_end,
        )
