"""Gather buffer with its elements in SDRAM: the GatherBuffer's bookkeeping (have bits,
histograms, CLEAR and DRAIN, the k per block) over litedram's native port.

The 5A-75B's block RAM cannot hold the NIC's gather slots at C >= 16K (docs/boards.md),
so this variant keeps only the have bits and histograms on chip (GatherBuffer's code)
and each element in one 32-bit SDRAM word at `base + slot * c + index` (lanes = 1).
The ports are GatherBuffer's, plus the memory port `mem`. What differs in time: a
drain's beats come at the memory's pace (`o` stalls while words are on their way, and
a block's k goes out when the walk reaches the block, up to WORD_DEPTH beats ahead of
its first beat on `o`: the decoder queues k); no fixed LATENCY.

- Writes: a placed packet's beats queue (address, word) in `writes`; the input stalls
  while fewer than WRITE_SLACK entries are free. A command goes to the port with its
  word through `SdramIssuer` (hw/sdram_issuer.py), which keeps the word until litedram
  asks for it.
- Reads: a drain's beats are walked in order as GatherBuffer does; each beat puts its
  have bit and first/last in `beats`, and a read for it in `reads` only if the packet
  is present (missing packets are zeros, no access). Read words cannot be held off; a
  beat stays in `beats` until it goes out, and `words` is as deep, so it always has room.
- Arbitration: reads first (a drain is what the decoder waits for), writes when their
  queue is half full (so the input does not stall through a long drain), and behind a
  fence: a DRAIN issues no read until every write placed before it is a command,
  including the rest of a packet that was arriving when the DRAIN came (its have bit is
  set at its first beat). litedram keeps a read behind an earlier write to the same
  word, so the drain reads what was placed. Reads queued by an earlier drain wait too.
  A slot is cleared only after its drain has been read out (the core reuses a context
  after the op's STATS), so no write overtakes a read of the same slot.
- The whole block is held in reset until the controller's init is done: `cmd` and `i`
  stay not ready meanwhile.
- Two clocks (`mem_domain`, the SDRAM's): the block runs in `sync`, the issuer in the
  memory's clock. Commands cross in order through an AsyncFifo, and read words come
  back through another, CROSSING_WORDS deep. Words on their way never outnumber the beats
  in `beats` (WORD_DEPTH), and the memory's side sees the reader's takes a few cycles
  late, so twice that depth always has room; a word that found none would set `fault`
  (sticky, in the memory's clock), which the core reports as not idle.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, DomainRenamer, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import Out

from optireduce.hw.async_fifo import AsyncFifo
from optireduce.hw.clock_crossing import StreamCrossing
from optireduce.hw.gather_buffer import GatherBuffer, GatherOp
from optireduce.hw.sdram_controller import native_port
from optireduce.hw.sdram_issuer import SdramIssuer
from optireduce.params import NicParams

WRITE_DEPTH = 64  # placed beats waiting for a write command
WRITE_SLACK = 3  # a beat is stored the cycle after it is taken
WORD_DEPTH = 32  # beats walked and not yet given out on `o` (and so read words)
CROSSING_CMDS = 16  # commands on their way to the memory's clock
CROSSING_WORDS = 2 * WORD_DEPTH  # read words on their way back (module docstring)


class SdramGatherBuffer(GatherBuffer):
    """GatherBuffer whose slots live in SDRAM (module docstring)."""

    LATENCY = None  # the memory's

    def __init__(
        self,
        p: NicParams,
        addr_width: int,
        slots: int | None = None,
        base: int = 0,
        mem_domain: str = "sync",
    ) -> None:
        """`mem_domain`: the clock of `mem` (and of `fault`); the block runs in `sync`."""
        if p.lanes != 1 or p.w_wire != 32:
            raise ValueError("SdramGatherBuffer keeps one 32-bit element per SDRAM word: lanes=1")
        self.addr_width, self.base, self.mem_domain = addr_width, base, mem_domain
        self.entry = data.StructLayout({"addr": addr_width, "word": 32})  # a queued write
        super().__init__(p, slots, mem=Out(native_port(addr_width)), fault=Out(1))
        n = self.n_slots * p.c
        if base < 0 or base + n > 1 << addr_width:
            raise ValueError(f"{n} words at {base:#x} do not fit {addr_width} address bits")

    def elaborate(self, platform):
        m = Module()
        self._open = open_ = Signal()  # the controller's init is done, seen in `sync`
        if self.mem_domain == "sync":
            m.d.comb += open_.eq(self.mem.ready)
        else:  # outside the reset it releases
            m.submodules.open_sync = FFSynchronizer(self.mem.ready, open_, o_domain="sync")
        # the reset holds the crossings' `sync` sides alone (AsyncFifo wants both sides
        # reset together): safe, as nothing enters either before `open`, which stays up
        m.submodules.buffer = ResetInserter({"sync": ~open_})(super().elaborate(platform))
        return m

    def _element_memory(self, m: Module, s: SimpleNamespace) -> None:
        aw, d = self.addr_width, self.mem_domain
        s.writes = SyncFIFOBuffered(width=self.entry.size, depth=WRITE_DEPTH)
        s.reads = SyncFIFOBuffered(width=aw, depth=WORD_DEPTH)
        s.beats = SyncFIFOBuffered(width=3, depth=WORD_DEPTH)  # have, first, last
        for name in ("writes", "reads", "beats"):
            m.submodules[name] = getattr(s, name)
        issuer = SdramIssuer(aw)
        if d == "sync":
            m.submodules.issuer = issuer
            s.cmd = issuer.i
            s.words = SyncFIFOBuffered(width=32, depth=WORD_DEPTH)
        else:
            m.submodules.issuer = DomainRenamer({"sync": d})(issuer)
            # the issuer's skid is the memory side's register; the block's is ours
            x = StreamCrossing(issuer.layout, w_domain="sync", r_domain=d,
                               depth=CROSSING_CMDS, skid_domains=())  # fmt: skip
            m.submodules.cmd_crossing = x
            wiring.connect(m, x.o, issuer.i)
            s.cmd = x.i
            s.words = AsyncFifo(width=32, depth=CROSSING_WORDS, w_domain=d, r_domain="sync")
            with m.If(self.mem.rdata_valid & ~s.words.w_rdy):
                m.d[d] += self.fault.eq(1)
        m.submodules.words = s.words
        wiring.connect(m, issuer.mem, wiring.flipped(self.mem))

    def _arbiter(self, m: Module, s: SimpleNamespace) -> None:
        """One command stream from the reads and writes queues, each write with its word."""
        mem, w = self.mem, data.View(self.entry, s.writes.r_data)
        # the fence: writes placed before the last DRAIN and not yet commands, counted
        # once no placed packet is still arriving (`pending` until then)
        fence = Signal(range(WRITE_DEPTH + 2))
        pending = Signal()
        urgent = s.writes.level >= WRITE_DEPTH // 2
        read = s.reads.r_rdy & (fence == 0) & ~pending & ~urgent
        write = s.writes.r_rdy
        cmd = s.cmd
        m.d.comb += [
            cmd.valid.eq(read | write),
            cmd.payload.we.eq(~read),
            cmd.payload.addr.eq(self.base + Mux(read, s.reads.r_data, w.addr)),
            cmd.payload.word.eq(w.word),
        ]
        taken = cmd.valid & cmd.ready
        issued = taken & ~read
        drain = self.cmd.valid & self.cmd.ready & (self.cmd.payload.op == GatherOp.DRAIN)
        with m.If(drain):
            m.d.sync += pending.eq(1)
        with m.Elif(pending & ~s.placing):  # a beat taken last cycle is being queued now
            m.d.sync += [pending.eq(0), fence.eq(s.writes.level + s.writes.w_en - issued)]
        with m.Elif(issued & (fence != 0)):
            m.d.sync += fence.eq(fence - 1)
        m.d.comb += [
            s.reads.r_en.eq(taken & read),
            s.writes.r_en.eq(issued),
            s.words.w_en.eq(mem.rdata_valid),
            s.words.w_data.eq(mem.rdata_data),
        ]

    def _store_room(self, m: Module, s: SimpleNamespace) -> Value:
        return s.writes.level <= WRITE_DEPTH - WRITE_SLACK

    def _store(self, m: Module, s: SimpleNamespace, en, addr, value) -> None:
        entry = data.View(self.entry, s.writes.w_data)
        m.d.comb += [s.writes.w_en.eq(en), entry.addr.eq(addr), entry.word.eq(value.as_value())]

    def _drain(self, m: Module, s: SimpleNamespace) -> None:
        self._arbiter(m, s)  # here: it needs the input section's `placing`
        # every word asked for has its beat in `beats` until it goes out on `o`, so the
        # words queued, in flight or waiting never outnumber `beats`: `words` (as deep)
        # always has room for a read word, which cannot be held off
        room = Signal()
        m.d.comb += room.eq(s.beats.w_rdy & s.reads.w_rdy)
        beat = self._drain_walk(m, s, room)
        m.d.comb += [
            s.beats.w_en.eq(beat.go),
            s.beats.w_data.eq(Cat(beat.have, beat.first, beat.last)),
            s.reads.w_en.eq(beat.go & beat.have),
            s.reads.w_data.eq(beat.addr),
        ]
        have, first, last = s.beats.r_data[0], s.beats.r_data[1], s.beats.r_data[2]
        m.d.comb += [
            self.o.valid.eq(s.beats.r_rdy & (~have | s.words.r_rdy)),
            self.o.payload.first.eq(first),
            self.o.payload.last.eq(last),
            self.o.payload.data[0].eq(Mux(have, s.words.r_data, 0)),
        ]
        out = self.o.valid & self.o.ready
        m.d.comb += [s.beats.r_en.eq(out), s.words.r_en.eq(out & have)]
