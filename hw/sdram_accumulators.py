"""The aggregator's accumulators in SDRAM: each payload beat read-modify-written over
litedram's native port, and an ended op's rows fetched for the readout.

An accumulator is w_acc bits (35 at n_max = 8) and an SDRAM word 32: the low 32 bits
live in the word at `base + index`, the top w_acc - 32 in a block RAM beside it (3 bits
per accumulator), so the sums are the on-chip aggregator's to the bit.

- Beats (`i`: index, value, fresh, first) queue in `beats`, whose head passes a
  registered skid (the choices below read flip-flops, not a block RAM's output, at the
  SDRAM's 62.5 MHz on the 25F). A fresh beat (the slot's first contribution) is
  written without a read. Any other beat's read is a command;
  the beat waits in `inflight` until its word comes back (read words cannot be held
  off: `words` is as deep as `inflight`, so it always has room), then the sum is formed
  with the top bits (`combine`: one register, the top RAM read beside it) and queued
  in `writes`. Commands reach litedram in order, each write with its word, through
  `SdramIssuer` (hw/sdram_issuer.py: a registered skid, and the word kept until litedram
  asks for it; the Verilator benches check the controller's `underrun`).
- The fence: a packet's first read waits until every earlier beat is a write command
  (`drained`). A packet's beats are distinct accumulators, and litedram keeps a read
  behind an earlier write to the same word, so a slot's next contribution reads the
  sum the previous one wrote, however close they come. A fresh packet needs no fence
  (nothing earlier in the op wrote its slot; the context's previous op was read out).
- Commands: reads first, writes when no read can go (the next packet's fence) or once
  their queue is half full (a guard: at P = 256 a packet's sums queue to just under
  half before its successor's fence lets them go).
- The readout (`fetch` with a row: context and slot bits) queues behind the beats, so
  it comes after every beat taken before it; at the head it waits until `drained`,
  then reads the row's words, with their top bits, into `row` (a block RAM of one
  slot, w_acc wide); `fetched` rises when the last is in. `rd_beat`/`rd_en` read it
  as the on-chip accumulator memory is read: the word a cycle after its address, held
  while `rd_en` is low. No beat is taken while a row is fetched.
- Clocks: the ports are in `sync` (the aggregator's), the store and `mem` (and
  `drained`) in `domain`. With another domain the queue's entries cross in an async
  FIFO, the row RAM is written in the store's clock and read in `sync`, and the fetch's
  end and the controller's `ready` (as `open`) cross through synchronizers; the
  aggregator runs at its clock, the store at the memory's.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, DomainRenamer, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.hw.async_fifo import AsyncFifo
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.carry_select import masked_add
from optireduce.hw.sdram_controller import native_port
from optireduce.hw.sdram_issuer import SdramIssuer
from optireduce.hw.skid import Skid
from optireduce.params import NicParams

WORD = 32  # bits of an SDRAM word (the 5A-75B's bus)
INFLIGHT_DEPTH = 32  # reads issued and not yet combined (and so read words)
WRITE_DEPTH = 512  # sums waiting for a write command


CROSSING_DEPTH = 16  # entries on their way to the store's clock (its queue is behind)


def beat_layout(p: NicParams, index_bits: int) -> data.StructLayout:
    """One payload beat for an accumulator: its index, the value, and whether it is its
    slot's first contribution (`fresh`) and its packet's first beat (`first`)."""
    return data.StructLayout(
        {"index": index_bits, "value": signed(p.w_wire), "fresh": 1, "first": 1}
    )


def entry_layout(p: NicParams, index_bits: int) -> data.StructLayout:
    """The store's queue: a beat, or (`fetch`) a row's fetch, its row in `index`."""
    return data.StructLayout({"beat": beat_layout(p, index_bits), "fetch": 1})


class SdramAccumulators(wiring.Component):
    """Accumulators at `base` in SDRAM (see the module docstring). `index_bits` address
    one accumulator, the low `beat_bits` of them a beat within its slot's row; the store
    runs in `domain`."""

    def __init__(
        self,
        p: NicParams,
        index_bits: int,
        beat_bits: int,
        addr_width: int,
        base: int = 0,
        domain: str = "sync",
    ) -> None:
        if p.lanes != 1 or p.w_wire != WORD:
            raise ValueError("SdramAccumulators keeps one 32-bit element per SDRAM word: lanes=1")
        if p.w_acc <= WORD:
            raise ValueError(f"w_acc = {p.w_acc}: the top bits' RAM needs w_acc > {WORD}")
        if base < 0 or base + (1 << index_bits) > 1 << addr_width:
            raise ValueError(f"{1 << index_bits} words at {base:#x} exceed {addr_width} bits")
        self.p, self.index_bits, self.beat_bits, self.base = p, index_bits, beat_bits, base
        self.domain = domain
        self.beats = p.p // p.lanes
        self.layout = beat_layout(p, index_bits)
        self.entry = entry_layout(p, index_bits)
        super().__init__({
            "i": In(stream.Signature(self.layout)),
            "fetch": In(1), "fetch_row": In(index_bits - beat_bits), "fetched": Out(1),
            "rd_en": In(1, init=1), "rd_beat": In(beat_bits), "rd_data": Out(p.w_acc),
            "open": Out(1),  # the controller's init is done (in `sync`)
            "drained": Out(1),  # (in `domain`)
            "mem": Out(native_port(addr_width, WORD)),
        })  # fmt: skip

    def elaborate(self, platform) -> Module:
        m = Module()
        store = Module()  # built in `sync`, renamed to the store's domain
        q = self._queues(store)
        self._combine(store, q, platform)
        self._commands(store, q)
        self._fill(store, q)
        m.submodules.store = DomainRenamer({"sync": self.domain})(store)
        self._core_side(m, q, platform)
        return m

    def _core_side(self, m: Module, q: SimpleNamespace, platform) -> None:
        """In `sync`: beats and fetches into the queue, `fetched`, the row's reads."""
        same = self.domain == "sync"
        entry = Signal(self.entry)
        pend, row = Signal(), Signal(len(self.fetch_row))  # a fetch waiting for room
        if same:
            w_rdy, w_en, w_data = q.beats.w_rdy, q.beats.w_en, q.beats.w_data
            m.d.comb += self.open.eq(self.mem.ready)
        else:
            x = AsyncFifo(width=self.entry.size, depth=CROSSING_DEPTH, w_domain="sync",
                          r_domain=self.domain)  # fmt: skip
            m.submodules.crossing = x
            w_rdy, w_en, w_data = x.w_rdy, x.w_en, x.w_data
            m.d.comb += [
                q.beats.w_data.eq(x.r_data),
                q.beats.w_en.eq(x.r_rdy),
                x.r_en.eq(q.beats.w_rdy),
            ]
            m.submodules.open_sync = FFSynchronizer(self.mem.ready, self.open, o_domain="sync")
        m.d.comb += [
            self.i.ready.eq(w_rdy & self.open & ~pend),
            entry.beat.eq(self.i.payload),
            w_en.eq(Mux(pend, w_rdy, self.i.valid & self.i.ready)),
            w_data.eq(entry),
        ]
        with m.If(pend):
            m.d.comb += [entry.fetch.eq(1), entry.beat.index.eq(Cat(Const(0, self.beat_bits), row))]
            with m.If(w_rdy):
                m.d.sync += pend.eq(0)
        # the fetch's end: a toggle in the store's clock, seen here
        done, seen = Signal(), Signal()
        if same:
            m.d.comb += done.eq(q.done)
        else:
            m.submodules.done_sync = FFSynchronizer(q.done, done, o_domain="sync")
        with m.If(self.fetch):
            m.d.sync += [pend.eq(1), row.eq(self.fetch_row), self.fetched.eq(0)]
        with m.Elif(done != seen):
            m.d.sync += [seen.eq(done), self.fetched.eq(1)]
        # the row: written in the store's clock, read here
        m.submodules.row = ram = block_ram(shape=unsigned(self.p.w_acc), depth=1 << self.beat_bits)
        wr = ram.write_port(domain=self.domain)
        rd = read_port(m, ram, (wr,) if same else (), platform=platform)
        m.d.comb += [
            wr.en.eq(q.row_en), wr.addr.eq(q.row_addr), wr.data.eq(q.row_data),
            rd.addr.eq(self.rd_beat), rd.en.eq(self.rd_en), self.rd_data.eq(rd.data),
        ]  # fmt: skip

    def _queues(self, m: Module) -> SimpleNamespace:
        ib = self.index_bits
        q = SimpleNamespace()
        q.beats = SyncFIFOBuffered(width=self.entry.size, depth=2 * self.beats)
        q.inflight = SyncFIFOBuffered(width=self.layout.size, depth=INFLIGHT_DEPTH)
        q.words = SyncFIFOBuffered(width=WORD, depth=INFLIGHT_DEPTH)
        q.writes = SyncFIFOBuffered(width=ib + WORD, depth=WRITE_DEPTH)
        for name in ("beats", "inflight", "words", "writes"):
            m.submodules[name] = getattr(q, name)
        m.d.comb += [
            q.words.w_en.eq(self.mem.rdata_valid),
            q.words.w_data.eq(self.mem.rdata_data),
        ]
        # the head through registers (module docstring): a block RAM's output, 5.6 ns on
        # the 25F-6, in front of the choices missed 62.5 MHz
        m.submodules.head = h = Skid(self.entry, registered=True)
        m.d.comb += [
            h.i.valid.eq(q.beats.r_rdy),
            h.i.payload.eq(q.beats.r_data),
            q.beats.r_en.eq(h.i.ready),
        ]
        q.at_head, q.next = h.o.valid, h.o.ready
        q.queued = Signal(name="queued")  # a beat or a fetch is waiting (the benches read it)
        m.d.comb += q.queued.eq(q.beats.r_rdy | h.o.valid)
        q.entry = h.o.payload
        q.head = q.entry.beat
        q.is_beat = q.at_head & ~q.entry.fetch
        q.fetching = Signal()  # from the fetch's turn until its last word is taken
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
        q.fresh_go = q.is_beat & q.head.fresh & ~q.paired & room & ~q.fetching
        q.take = q.paired | q.fresh_go
        src = Mux(q.paired, back.as_value(), Value.cast(q.head))
        srcv = data.View(self.layout, src)
        m.d.sync += [
            r.v.eq(q.take),
            r.index.eq(srcv.index),
            r.value.eq(srcv.value),
            r.fresh.eq(~q.paired),
            r.word.eq(q.words.r_data),
        ]
        m.d.comb += q.inflight.r_en.eq(q.paired)
        q.top_addr_rmw = srcv.index
        # a fresh beat's word is ignored: in the adder's carry chain on the ECP5
        total = masked_add(m, r.value, Cat(r.word, q.top_rd.data), ~r.fresh, platform=platform,
                           name="total", width=p.w_acc)  # fmt: skip
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
        rmw_read = q.is_beat & ~head.fresh & fence_ok & q.inflight.w_rdy & ~q.fetching
        issued = Signal(bb + 1)  # the fetch's reads issued
        out = Signal(range(INFLIGHT_DEPTH + 1))  # ... and not yet in
        fetch_read = q.fetching & (issued != self.beats) & (out < INFLIGHT_DEPTH)
        write = q.writes.r_rdy
        urgent = q.writes.level >= WRITE_DEPTH // 2
        read = (fetch_read | rmw_read) & ~(urgent & write)
        w_index, w_word = q.writes.r_data[:ib], q.writes.r_data[ib:]
        r_index = Mux(fetch_read, Cat(issued[:bb], q.row_at), head.index)
        # the commands through the issuer's registers: litedram's `cmd_ready` is logic of
        # its own, and in front of the choices and the queues' levels it missed 62.5 MHz
        # on the 25F. They keep their order, so a command taken here counts as issued.
        m.submodules.issuer = x = SdramIssuer(len(mem.cmd_addr), WORD)
        wiring.connect(m, x.mem, wiring.flipped(mem))
        m.d.comb += [
            x.i.valid.eq(read | write),
            x.i.payload.we.eq(~read),
            x.i.payload.addr.eq(self.base + Mux(read, r_index, w_index)),
            x.i.payload.word.eq(w_word),
        ]
        taken = x.i.valid & x.i.ready
        rmw_sent = taken & read & rmw_read
        # a fetch at the head starts once every earlier beat is a write command
        q.start = Signal()
        m.d.comb += q.start.eq(q.at_head & q.entry.fetch & self.drained & ~q.fetching)
        m.d.comb += [
            q.next.eq(rmw_sent | q.fresh_go | q.start),
            q.inflight.w_en.eq(rmw_sent),
            q.inflight.w_data.eq(q.head),
            q.writes.r_en.eq(taken & ~read),
        ]
        sent = taken & read & fetch_read
        q.fill = Signal()
        m.d.comb += q.fill.eq(q.fetching & q.words.r_rdy)  # every word in flight is the fetch's
        m.d.sync += out.eq(out + sent - q.fill)
        with m.If(q.start):
            m.d.sync += [q.fetching.eq(1), q.row_at.eq(head.index[bb:]), issued.eq(0)]
        with m.If(sent):
            m.d.sync += issued.eq(issued + 1)

    def _fill(self, m: Module, q: SimpleNamespace) -> None:
        """The fetch's words with their top bits into the row (a register between: the
        top RAM's read), and the toggle that says the row is in."""
        bb = self.beat_bits
        got = Signal(bb + 1)
        f = Signal(data.StructLayout({"v": 1, "addr": bb, "word": WORD}))
        m.d.sync += [f.v.eq(q.fill), f.addr.eq(got[:bb]), f.word.eq(q.words.r_data)]
        with m.If(q.start):
            m.d.sync += got.eq(0)
        with m.If(q.fill):
            m.d.sync += got.eq(got + 1)
            with m.If(got == self.beats - 1):
                m.d.sync += q.fetching.eq(0)
        q.done = Signal()
        with m.If(f.v & (f.addr == self.beats - 1)):
            m.d.sync += q.done.eq(~q.done)
        q.row_en, q.row_addr = f.v, f.addr
        q.row_data = Signal(self.p.w_acc)
        m.d.comb += [
            q.row_data.eq(Cat(f.word, q.top_rd.data)),
            q.words.r_en.eq(q.paired | q.fill),
            # the top bits' one read port: the combine's beat, else the fetch's word
            q.top_rd.addr.eq(Mux(q.fill, Cat(got[:bb], q.row_at), q.top_addr_rmw)),
            q.top_rd.en.eq(q.take | q.fill),
        ]
