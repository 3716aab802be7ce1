"""The aggregator's accumulators in SDRAM: each payload beat read-modify-written over
litedram's native port, and an ended op's rows fetched for the readout.

An accumulator is w_acc bits (35 at n_max = 8) and an SDRAM word 32: the low 32 bits
live in the word at `base + index`, the top w_acc - 32 in a block RAM beside it (3 bits
per accumulator), so the sums are the on-chip aggregator's to the bit.

- Beats (`i`: index, value, fresh, first) queue in `beats`. A fresh beat (the slot's
  first contribution) is written without a read. Any other beat's read is a command;
  the beat waits in `inflight` until its word comes back (read words cannot be held
  off: `words` is as deep as `inflight`, so it always has room), then the sum is formed
  with the top bits (`combine`: one register, the top RAM read beside it) and queued
  in `writes`. A write word goes to litedram's queue (`wdata`) as its command is taken,
  so it is there when litedram asks.
- The fence: a packet's first read waits until every earlier beat is a write command
  (`drained`). A packet's beats are distinct accumulators, and litedram keeps a read
  behind an earlier write to the same word, so a slot's next contribution reads the
  sum the previous one wrote, however close they come. A fresh packet needs no fence
  (nothing earlier in the op wrote its slot; the context's previous op was read out).
- Commands: reads first, writes once their queue is half full.
- The readout (`fetch` with a row: context and slot bits) waits until `drained` and no
  beat is queued, then reads the row's words into `row` (a block RAM of one slot);
  `fetched` rises when the last is in. `rd_beat`/`rd_en` read it as the on-chip
  accumulator memory is read: the word (and its top bits) a cycle later, held while
  `rd_en` is low.
Nothing else reaches the memory while a row is fetched or read out: the aggregator
takes no event while its readout is busy.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.sdram_controller import native_port
from optireduce.params import NicParams

WORD = 32  # bits of an SDRAM word (the 5A-75B's bus)
INFLIGHT_DEPTH = 32  # reads issued and not yet combined (and so read words)
WRITE_DEPTH = 512  # sums waiting for a write command
WDATA_DEPTH = 64  # write words whose command litedram took, waiting to be asked for


def beat_layout(p: NicParams, index_bits: int) -> data.StructLayout:
    """One payload beat for an accumulator: its index, the value, and whether it is its
    slot's first contribution (`fresh`) and its packet's first beat (`first`)."""
    return data.StructLayout(
        {"index": index_bits, "value": signed(p.w_wire), "fresh": 1, "first": 1}
    )


class SdramAccumulators(wiring.Component):
    """Accumulators at `base` in SDRAM (see the module docstring). `index_bits` address
    one accumulator, the low `beat_bits` of them a beat within its slot's row."""

    def __init__(
        self, p: NicParams, index_bits: int, beat_bits: int, addr_width: int, base: int = 0
    ) -> None:
        if p.lanes != 1 or p.w_wire != WORD:
            raise ValueError("SdramAccumulators keeps one 32-bit element per SDRAM word: lanes=1")
        if p.w_acc <= WORD:
            raise ValueError(f"w_acc = {p.w_acc}: the top bits' RAM needs w_acc > {WORD}")
        if base < 0 or base + (1 << index_bits) > 1 << addr_width:
            raise ValueError(f"{1 << index_bits} words at {base:#x} exceed {addr_width} bits")
        self.p, self.index_bits, self.beat_bits, self.base = p, index_bits, beat_bits, base
        self.beats = p.p // p.lanes
        self.layout = beat_layout(p, index_bits)
        super().__init__({
            "i": In(stream.Signature(self.layout)),
            "fetch": In(1), "fetch_row": In(index_bits - beat_bits), "fetched": Out(1),
            "rd_en": In(1, init=1), "rd_beat": In(beat_bits), "rd_data": Out(p.w_acc),
            "drained": Out(1),
            "mem": Out(native_port(addr_width, WORD)),
        })  # fmt: skip

    def elaborate(self, platform) -> Module:
        m = Module()
        q = self._queues(m)
        self._combine(m, q, platform)
        self._commands(m, q)
        self._row(m, q, platform)
        return m

    def _queues(self, m: Module) -> SimpleNamespace:
        ib = self.index_bits
        q = SimpleNamespace()
        q.beats = SyncFIFOBuffered(width=self.layout.size, depth=2 * self.beats)
        q.inflight = SyncFIFOBuffered(width=self.layout.size, depth=INFLIGHT_DEPTH)
        q.words = SyncFIFOBuffered(width=WORD, depth=INFLIGHT_DEPTH)
        q.writes = SyncFIFOBuffered(width=ib + WORD, depth=WRITE_DEPTH)
        q.wdata = SyncFIFOBuffered(width=WORD, depth=WDATA_DEPTH)
        for name in ("beats", "inflight", "words", "writes", "wdata"):
            m.submodules[name] = getattr(q, name)
        m.d.comb += [
            q.beats.w_en.eq(self.i.valid & self.mem.ready),
            q.beats.w_data.eq(self.i.payload),
            self.i.ready.eq(q.beats.w_rdy & self.mem.ready),
            q.words.w_en.eq(self.mem.rdata_valid),
            q.words.w_data.eq(self.mem.rdata_data),
        ]
        q.head = data.View(self.layout, q.beats.r_data)
        q.fetching = Signal()  # from `fetch` until the row is in
        q.row_at = Signal(self.index_bits - self.beat_bits)  # the row fetched
        return q

    def _combine(self, m: Module, q: SimpleNamespace, platform) -> None:
        """A read word with its beat, or a fresh beat, into one register; the next cycle
        its sum goes to `writes` and its top bits to their RAM."""
        p, hi = self.p, self.p.w_acc - WORD
        m.submodules.top = top = block_ram(shape=unsigned(hi), depth=1 << self.index_bits)
        q.top_wr = top.write_port()
        q.top_rd = read_port(m, top, (q.top_wr,), platform=platform)
        r = Signal(data.StructLayout({"v": 1, "index": self.index_bits, "value": signed(p.w_wire),
                                      "fresh": 1, "word": WORD}))  # fmt: skip
        back = data.View(self.layout, q.inflight.r_data)
        room = q.writes.level < WRITE_DEPTH - 1  # `r` may hold one more
        q.paired = q.inflight.r_rdy & q.words.r_rdy & room
        # a fresh beat needs no fence: nothing earlier in the op wrote its slot
        q.fresh_go = q.beats.r_rdy & q.head.fresh & ~q.paired & room
        q.take = q.paired | q.fresh_go
        src = Mux(q.paired, back.as_value(), q.head.as_value())
        srcv = data.View(self.layout, src)
        m.d.sync += [
            r.v.eq(q.take),
            r.index.eq(srcv.index),
            r.value.eq(srcv.value),
            r.fresh.eq(~q.paired),
            r.word.eq(q.words.r_data),
        ]
        m.d.comb += q.inflight.r_en.eq(q.paired)
        q.combine_v = r.v
        q.top_addr_rmw = srcv.index
        old = Mux(r.fresh, 0, Cat(r.word, q.top_rd.data).as_signed())
        total = Signal(signed(p.w_acc))
        m.d.comb += total.eq(old + r.value)
        m.d.comb += [
            q.writes.w_en.eq(r.v),
            q.writes.w_data.eq(Cat(r.index, total[:WORD])),
            q.top_wr.en.eq(r.v),
            q.top_wr.addr.eq(r.index),
            q.top_wr.data.eq(total[WORD:]),
        ]
        # every earlier beat is a write command: the fence of a packet and of a fetch
        # (levels, not r_rdy: an entry shows on r_rdy a cycle or two after its write)
        m.d.comb += self.drained.eq((q.inflight.level == 0) & ~r.v & (q.writes.level == 0))

    def _commands(self, m: Module, q: SimpleNamespace) -> None:
        """One command stream: the fetch's reads, the beats' reads, the sums' writes."""
        mem, ib, bb = self.mem, self.index_bits, self.beat_bits
        head = q.head
        fence_ok = ~head.first | self.drained
        rmw_read = q.beats.r_rdy & ~head.fresh & fence_ok & q.inflight.w_rdy
        issued = Signal(bb + 1)  # the fetch's reads issued
        out = Signal(range(INFLIGHT_DEPTH + 1))  # ... and not yet in
        got = Signal(bb + 1)
        fetch_read = (q.fetching & self.drained & (q.beats.level == 0) & (issued != self.beats)
                      & (out < INFLIGHT_DEPTH))  # fmt: skip
        write = q.writes.r_rdy & q.wdata.w_rdy
        urgent = q.writes.level >= WRITE_DEPTH // 2
        read = (fetch_read | rmw_read) & ~(urgent & write)
        w_index, w_word = q.writes.r_data[:ib], q.writes.r_data[ib:]
        row_index = Cat(issued[:bb], q.row_at)
        r_index = Mux(fetch_read, row_index, head.index)
        m.d.comb += [
            mem.cmd_valid.eq(read | write),
            mem.cmd_we.eq(~read),
            mem.cmd_addr.eq(self.base + Mux(read, r_index, w_index)),
        ]
        taken = mem.cmd_valid & mem.cmd_ready
        # a fetch reads once no beat is queued; a beat's read only while one is
        rmw_sent = taken & read & rmw_read
        m.d.comb += [
            q.beats.r_en.eq(rmw_sent | q.fresh_go),
            q.inflight.w_en.eq(rmw_sent),
            q.inflight.w_data.eq(q.beats.r_data),
            q.writes.r_en.eq(taken & ~read),
            q.wdata.w_en.eq(taken & ~read),
            q.wdata.w_data.eq(w_word),
            # litedram takes the word when it asks; `valid` only tells the underrun check
            mem.wdata_valid.eq(q.wdata.r_rdy),
            mem.wdata_data.eq(q.wdata.r_data),
            q.wdata.r_en.eq(mem.wdata_ready),
        ]
        # the fetch: its reads, and its words into the row (nothing else reads then)
        q.fill = q.fetching & q.words.r_rdy & ~q.inflight.r_rdy
        q.got = got
        sent = taken & read & fetch_read
        m.d.sync += out.eq(out + sent - q.fill)
        with m.If(self.fetch):
            m.d.sync += [q.fetching.eq(1), q.row_at.eq(self.fetch_row), issued.eq(0),
                         got.eq(0), self.fetched.eq(0)]  # fmt: skip
        with m.Else():
            with m.If(sent):
                m.d.sync += issued.eq(issued + 1)
            with m.If(q.fill):
                m.d.sync += got.eq(got + 1)
                with m.If(got == self.beats - 1):
                    m.d.sync += [q.fetching.eq(0), self.fetched.eq(1)]

    def _row(self, m: Module, q: SimpleNamespace, platform) -> None:
        """The fetched row, read as the on-chip accumulators are: word and top bits a
        cycle after the address, held while `rd_en` is low."""
        bb = self.beat_bits
        m.submodules.row = row = block_ram(shape=unsigned(WORD), depth=1 << bb)
        row_wr = row.write_port()
        row_rd = read_port(m, row, (row_wr,), platform=platform)
        m.d.comb += [
            row_wr.en.eq(q.fill),
            row_wr.addr.eq(q.got[:bb]),
            row_wr.data.eq(q.words.r_data),
            q.words.r_en.eq(q.paired | q.fill),
            row_rd.addr.eq(self.rd_beat),
            row_rd.en.eq(self.rd_en),
            # the top bits' one read port: the combine's beat, else the readout's
            q.top_rd.addr.eq(Mux(q.take, q.top_addr_rmw, Cat(self.rd_beat, q.row_at))),
            q.top_rd.en.eq(q.take | self.rd_en),
            self.rd_data.eq(Cat(row_rd.data, q.top_rd.data)),
        ]
