"""Streaming Walsh–Hadamard transform: a radix-2 single-delay-feedback (SDF) pipeline.

Model: `optireduce.host.model.fwht.fwht_blocks(x, p.b)` (exact integers, natural/Sylvester order).

Each block of B = p.b elements arrives as B/lanes beats of `lanes` consecutive elements.
Every radix-2 stage of stride h maps the pair (x[j], x[j+h]) to (x[j]+x[j+h], x[j]-x[j+h]) in
place. The WHT is a tensor product of one 2-point butterfly per index bit, so the stages commute
and the in-place result is already in natural order: no bit reversal and all twiddles are 1.

* Strides >= lanes are SDF stages on beats, largest first (so the biggest delay line holds the
  narrowest data). A stage of delay D beats keeps a D-entry delay line: the first D beats of each
  group of 2D go in; each of the next D beats reads its partner a, emits a + x and stores a - x;
  those D differences go out after the group. Delay lines of >= `mem_min_delay` beats are
  lib.memory.Memory, which yosys maps to BRAM when deep and to LUTRAM when shallow; shorter ones
  are registers (default: delays 1 and 2; a memory needs >= 4, see `_sdf_stage`). At B = 4096
  register files for the delays up to 16 would cost about 800 LUTs and 800 FFs more than LUTRAM.
  A memory's read side is a prefetch pipeline (the memory's own register, then READ_REGS
  more), so that on ECP5 the DP16KD's slow clock-to-out (5.6 ns at speed 6) drives one
  flip-flop and nothing else (with READ_REGS = 2 the block met 125 MHz out of context;
  the core runs at 52.08 MHz, and 1 saves a register a stage; docs/gateware.md,
  "Timing"). The prefetch changes no slot of the schedule, so LATENCY is unchanged.
* Strides < lanes are plain butterflies across the lanes of one beat, before the output register.

Flow control: the whole pipeline moves on one enable, `en = ready | ~valid` of its output
register, which feeds a skid buffer (hw/skid.py: `ready` from a flip-flop, no latency), and a
beat that is not valid is a bubble that moves through it like data. A stage that still owes the
differences of its last group emits one of them in every slot, bubble or not, so when the input
stops the tail of the last block drains by itself: a block never waits for the next op's data.
Position counters count valid beats only, so bubbles never break the block alignment, and with
a continuous input no stage ever emits a bubble (one beat per cycle, no gaps).

`side` (only with `side_bits`): a block's tag, taken from its last beat in and put on every
beat of it out (SharedFwht tells its two streams apart so).

`first`/`last`: an op is a whole number of blocks, so `first` is on the first beat of a block and
`last` on the last beat of one. Block positions are counted from reset (they are not realigned on
`first`: a stream that breaks this rule is garbage in, garbage out). Each block's (first, last)
pair waits in a small FIFO and is put back on the block's first and last output beats.

Widths: a stage adds one bit, so the output is width_in + log2(B) bits, exact for inputs in the
symmetric range |x| <= 2^(width_in-1) - 1 (docs/numerics.md). The same block serves the forward
transform (width_in = p.w_in) and the inverse one (width_in = p.w_wire).

LATENCY = B/lanes + log2(B/lanes) + 1 cycles: B/lanes - 1 of delay lines, the input register,
one register per SDF stage and the output register (B = lanes: 1, the output register only).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from optireduce.host.model.fwht import fwht_blocks
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.carry_select import masked_add
from optireduce.hw.skid import Skid
from optireduce.hw.streams import element_layout, element_stream
from optireduce.params import NicParams


def fwht_latency(p: NicParams) -> int:
    """Fwht's LATENCY for p (module docstring): B/lanes - 1 beats of delay lines, the input
    register, one register per SDF stage and the output register."""
    beats = p.b // p.lanes
    stages = exact_log2(beats)
    return beats + stages + (1 if stages else 0)


def external_fwht_ports(p: NicParams, width_in: int) -> dict:
    """The ports of a block whose FWHT is outside it (NicParams.fwht_shared: SharedFwht):
    its elements leave on `to_fwht`, the transform comes back on `from_fwht`."""
    return {"to_fwht": Out(element_stream(width_in, p.lanes)),
            "from_fwht": In(element_stream(width_in + p.log2_b, p.lanes))}  # fmt: skip


def through_external_fwht(m: Module, block: wiring.Component, src, dst) -> None:
    """src -> `block`'s to_fwht; its from_fwht -> dst (external_fwht_ports)."""
    wiring.connect(m, src, wiring.flipped(block.to_fwht))
    wiring.connect(m, wiring.flipped(block.from_fwht), dst)


def fwht_layout(width: int, lanes: int, side_bits: int = 0) -> data.StructLayout:
    """element_layout, with a `side` field of side_bits when there are any."""
    fields = dict(element_layout(width, lanes).members)
    return data.StructLayout({**fields, "side": side_bits} if side_bits else fields)


class Fwht(wiring.Component):
    """Unnormalized blockwise WHT of p.b elements, p.lanes elements per beat.

    Ports: `i` element_stream(width_in, lanes), `o` element_stream(width_out, lanes) with
    width_out = width_in + log2(p.b). LATENCY (an instance attribute) is in cycles.
    """

    MODEL = fwht_blocks
    # registers on a delay memory's read, the memory's own excluded (rdata is the last):
    # the BRAM's clock-to-out drives the head alone, which is enough at the core's
    # 52.08 MHz (2, a register that only the BRAM drives before the head, gave 125 MHz
    # out of context; docs/gateware.md, "Timing")
    READ_REGS = 1

    def __init__(
        self, p: NicParams, width_in: int, *, mem_min_delay: int = 4, side_bits: int = 0
    ) -> None:
        if p.lanes > p.b:
            raise ValueError(f"lanes={p.lanes} exceeds the block b={p.b}")
        self.p, self.width_in, self.lanes = p, width_in, p.lanes
        self.width_out = width_in + p.log2_b
        self.beats = p.b // p.lanes  # beats per block
        # SDF delays in beats, largest stride first: B/2L, B/4L, ..., 1
        self.delays = [self.beats >> (k + 1) for k in range(exact_log2(self.beats))]
        # the read pipeline of a memory needs d >= READ_REGS + 2 (see _sdf_stage)
        self.mem_min_delay = max(self.READ_REGS + 2, mem_min_delay)
        self.LATENCY = fwht_latency(p)
        self.side_bits = side_bits
        super().__init__(
            {
                "i": In(stream.Signature(fwht_layout(width_in, p.lanes, side_bits))),
                "o": Out(stream.Signature(fwht_layout(self.width_out, p.lanes, side_bits))),
            }
        )

    def _sdf_stage(self, m: Module, k: int, d: int, en, v_in, x_in, wi: int, platform):
        """One SDF stage of delay d beats on wi-bit lanes; returns its output register
        (valid, data)."""
        lanes, wo = self.lanes, wi + 1
        lay = data.ArrayLayout(signed(wo), lanes)
        abits = exact_log2(d)

        # The delay line is a FIFO: x_j goes in at j, comes out at D + j where a - x goes in at
        # j, and that comes out (pending) after the group. So one read pointer walks 0..d-1.
        wcnt = Signal(abits + 1, name=f"s{k}_wcnt")  # valid beats taken in this group of 2d
        pend = Signal(name=f"s{k}_pend")  # differences of the last group still to emit
        rptr = Signal(range(d), name=f"s{k}_rptr")  # the entry in rdata
        second = wcnt[abits]
        j = wcnt[:abits]
        pend_n = Signal(name=f"s{k}_pend_n")
        second_n = Signal(name=f"s{k}_second_n")
        m.d.comb += [
            pend_n.eq(Mux(pend, rptr != d - 1, v_in & (wcnt == 2 * d - 1))),
            second_n.eq(second ^ (v_in & (j == d - 1))),
        ]
        with m.If(en):
            m.d.sync += [wcnt.eq(wcnt + v_in), pend.eq(pend_n)]
        pop = Signal(name=f"s{k}_pop")  # this slot uses rdata: the line's oldest entry goes
        m.d.comb += pop.eq(en & (pend | (v_in & second)))
        with m.If(pop):
            m.d.sync += rptr.eq(Mux(rptr == d - 1, 0, rptr + 1))

        # data registers are reset-less: no reset-over-enable logic in front of their flip-flops
        rdata = Signal(lay, name=f"s{k}_rdata", reset_less=True)  # entry at rptr
        wdata = Signal(lay, name=f"s{k}_wdata")
        we = Signal(name=f"s{k}_we")
        v_c = Signal(name=f"s{k}_v_c")
        x_c = Signal(lay, name=f"s{k}_x_c")
        with m.If(pend):  # first half (always, see the docs): emit a difference, store x
            m.d.comb += [v_c.eq(1), we.eq(v_in)]
            m.d.comb += [wdata[lane].eq(x_in[lane]) for lane in range(lanes)]
        with m.Elif(v_in & ~second):
            m.d.comb += we.eq(1)
            m.d.comb += [wdata[lane].eq(x_in[lane]) for lane in range(lanes)]
        with m.Elif(v_in):
            m.d.comb += [v_c.eq(1), we.eq(1)]
            m.d.comb += [wdata[lane].eq(rdata[lane] - x_in[lane]) for lane in range(lanes)]
        # out: the difference (pend) or the sum; a bubble's data is whatever. The select
        # rides in the adder's carry chain on the ECP5 (hw/carry_select.py)
        for lane in range(lanes):
            x_sum = masked_add(m, rdata[lane], x_in[lane], ~pend, platform=platform,
                               name=f"s{k}_sum{lane}")  # fmt: skip
            m.d.comb += x_c[lane].eq(x_sum)

        if d >= self.mem_min_delay:
            # The delay line is a FIFO: pushes and pops both walk 0..d-1. Its read side
            # prefetches through a chain of registers, each with a valid bit and moving when
            # the next one can take it: the memory's own output register, READ_REGS - 1
            # registers driven by nothing but the memory (so the slow BRAM clock-to-out
            # drives one flip-flop and nothing else), and rdata (the head, which feeds the
            # adders). An entry is popped >= d slots after it was pushed, and reaches the
            # head READ_REGS + 2 cycles after its push at the latest when the entries before
            # it have gone; d >= mem_min_delay >= READ_REGS + 2, so the head is always there
            # when a slot pops it: the stage's schedule (and LATENCY) is that of an ideal
            # delay line. The read never races a write: it only fetches entries pushed in an
            # earlier cycle and not yet overwritten (at most d are in the line).
            # block_ram: so yosys does not emulate a read-write collision (there is none)
            # with a mux between the BRAM and the first register.
            m.submodules[f"s{k}_mem"] = mem = block_ram(shape=lay, depth=d)
            wp = mem.write_port()
            rp = read_port(m, mem, (wp,), platform=platform)
            fptr = Signal(range(d), name=f"s{k}_fptr")  # the next entry to fetch
            avail = Signal(range(d + 1), name=f"s{k}_avail")  # pushed, not yet fetched
            n = self.READ_REGS
            vs = [Signal(name=f"s{k}_v{a}") for a in range(n + 1)]  # [0]: the memory's own
            regs = [Signal(lay, name=f"s{k}_r{a}", reset_less=True) for a in range(1, n)]
            vals = [rp.data, *regs, rdata]
            takes = [Signal(name=f"s{k}_take{a}") for a in range(n + 1)]
            issue, push = Signal(name=f"s{k}_issue"), Signal(name=f"s{k}_push")
            m.d.comb += [
                # register a moves unless it and every one after it is full and the head
                # stays: each take straight from the valid bits (no chain through the
                # others: the pop arrives late, from the stage's enable)
                *(takes[a].eq(~Cat(*vs[a:]).all() | pop) for a in range(n + 1)),
                issue.eq(takes[0] & (avail != 0)),
                push.eq(en & we),
                wp.addr.eq(j),
                wp.data.eq(wdata),
                wp.en.eq(push),
                rp.addr.eq(fptr),
                rp.en.eq(issue),
            ]
            m.d.sync += avail.eq(avail + push - issue)
            with m.If(issue):
                m.d.sync += fptr.eq(Mux(fptr == d - 1, 0, fptr + 1))
            with m.If(takes[0]):
                m.d.sync += vs[0].eq(issue)
            for a in range(1, n + 1):
                with m.If(takes[a]):
                    m.d.sync += [vs[a].eq(vs[a - 1]), vals[a].eq(vals[a - 1])]
        else:
            regs = [Signal(lay, name=f"s{k}_r{a}", reset_less=True) for a in range(d)]
            if d == 1:
                m.d.comb += rdata.eq(regs[0])
                with m.If(en & we):
                    m.d.sync += regs[0].eq(wdata)
            else:
                with m.Switch(rptr):
                    for a in range(d):
                        with m.Case(a):
                            m.d.comb += rdata.eq(regs[a])
                with m.If(en & we), m.Switch(j):
                    for a in range(d):
                        with m.Case(a):
                            m.d.sync += regs[a].eq(wdata)

        v_out = Signal(name=f"s{k}_valid")
        x_out = Signal(lay, name=f"s{k}_data", reset_less=True)
        with m.If(en):
            m.d.sync += [v_out.eq(v_c), x_out.eq(x_c)]
        return v_out, x_out

    def elaborate(self, platform):
        m = Module()
        lanes, beats = self.lanes, self.beats
        # the output register feeds a skid buffer, so the enable of every register here
        # comes from two flip-flops, not from the consumer's logic
        m.submodules.out = out = Skid(self.o.payload.shape())
        wiring.connect(m, out.o, wiring.flipped(self.o))
        en = Signal()
        m.d.comb += [en.eq(out.i.ready | ~out.i.valid), self.i.ready.eq(en)]

        valid, x, w = self.i.valid, self.i.payload.data, self.width_in
        if self.delays:  # input register: the first stage starts from flip-flops
            valid, x = Signal(), Signal.like(self.i.payload.data, reset_less=True)
            with m.If(en):
                m.d.sync += [valid.eq(self.i.valid), x.eq(self.i.payload.data)]
        for k, d in enumerate(self.delays):
            valid, x = self._sdf_stage(m, k, d, en, valid, x, w, platform)
            w += 1

        # strides below `lanes`: butterflies inside the beat
        vals = [x[lane] for lane in range(lanes)]
        h = 1
        while h < lanes:
            nxt = list(vals)
            for a in range(lanes):
                if not a & h:
                    nxt[a], nxt[a + h] = vals[a] + vals[a + h], vals[a] - vals[a + h]
            vals, h = nxt, 2 * h

        # block tags: (first of its first beat, last of its last beat, side of its last)
        take = self.i.valid & en
        sb = self.side_bits
        side_in = self.i.payload.side if sb else Const(0, 0)
        if self.delays:
            ipos = Signal(range(beats))
            blk_first = Signal()
            # holds <= 2: B-1+S beats inside
            m.submodules.tags = tags = SyncFIFO(width=2 + sb, depth=4)
            with m.If(take):
                m.d.sync += ipos.eq(Mux(ipos == beats - 1, 0, ipos + 1))
                with m.If(ipos == 0):
                    m.d.sync += blk_first.eq(self.i.payload.first)
            m.d.comb += [
                tags.w_data.eq(Cat(blk_first, self.i.payload.last, side_in)),
                tags.w_en.eq(take & (ipos == beats - 1)),
            ]
            opos = Signal(range(beats))
            tag_first, tag_last, out_side = tags.r_data[0], tags.r_data[1], tags.r_data[2:]
            out_first, out_last = (opos == 0) & tag_first, (opos == beats - 1) & tag_last
            with m.If(en & valid):
                m.d.sync += opos.eq(Mux(opos == beats - 1, 0, opos + 1))
            m.d.comb += tags.r_en.eq(en & valid & (opos == beats - 1))
        else:  # one beat per block: the flags go straight through
            out_first, out_last = self.i.payload.first, self.i.payload.last
            out_side = side_in

        with m.If(en):
            m.d.sync += [
                out.i.valid.eq(valid),
                out.i.payload.first.eq(out_first),
                out.i.payload.last.eq(out_last),
            ]
            if sb:
                m.d.sync += out.i.payload.side.eq(out_side)
            m.d.sync += [out.i.payload.data[a].eq(vals[a]) for a in range(lanes)]
        return m
