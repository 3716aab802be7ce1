"""Gather buffer with its elements in SDRAM: the GatherBuffer's bookkeeping (have bits,
histograms, CLEAR and DRAIN, the k per block) over litedram's native port.

The 5A-75B's block RAM cannot hold the NIC's gather slots at C >= 16K (docs/boards.md),
so this variant keeps only the have bits and histograms on chip and each element in
one 32-bit SDRAM word at `base + slot * c + index` (lanes = 1). The ports and the
behaviour are GatherBuffer's; the latency of a drain is the memory's, and `o` stalls
while words are on their way.

- Writes: a placed packet's beats queue (address, word) in `writes`; the input stalls
  while fewer than WRITE_SLACK entries are free. litedram takes a write word whenever
  it raises `wdata_ready` (it does not look at a valid), so a word goes to the
  `wdata` queue as its command is accepted: it is always there before it is asked for.
- Reads: a drain's beats are walked in order as GatherBuffer does; each beat puts its
  have bit and first/last in `beats`, and a read for it in `reads` only if the packet
  is present (missing packets are zeros, no access). Read words cannot be held off, so
  a read is issued only while the words already asked for fit the `words` queue.
- Arbitration: reads first (a drain is what the decoder waits for), writes otherwise,
  behind a fence: a DRAIN accepted while placed beats still wait in `writes` (a
  deadline ends the phase right behind its last packets) issues no read until those
  writes are commands. litedram keeps a read behind an earlier write to the same word,
  so the drain reads what was placed.
- The whole block is held in reset until the controller's init is done: `cmd` and `i`
  stay not ready meanwhile.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.hw.gather_buffer import GatherBuffer, GatherOp
from optireduce.params import NicParams

WRITE_DEPTH = 64  # placed beats waiting for a write command
WRITE_SLACK = 3  # a beat is stored the cycle after it is taken
WDATA_DEPTH = 64  # write words whose command litedram took, waiting to be asked for
WORD_DEPTH = 32  # read words asked for and not yet given out on `o`


def sdram_port(addr_width: int, data_width: int = 32) -> dict:
    """The master side of litedram's native port (hw/sdram_controller.py), plus its ready."""
    return {
        "mem_ready": In(1),
        "mem_cmd_valid": Out(1), "mem_cmd_ready": In(1), "mem_cmd_we": Out(1),
        "mem_cmd_addr": Out(addr_width),
        "mem_wdata_valid": Out(1), "mem_wdata_ready": In(1), "mem_wdata_data": Out(data_width),
        "mem_rdata_valid": In(1), "mem_rdata_data": In(data_width),
    }  # fmt: skip


class SdramGatherBuffer(GatherBuffer):
    """GatherBuffer whose slots live in SDRAM (module docstring)."""

    def __init__(self, p: NicParams, addr_width: int, slots: int | None = None, base: int = 0):
        if p.lanes != 1 or p.w_wire != 32:
            raise ValueError("SdramGatherBuffer keeps one 32-bit element per SDRAM word: lanes=1")
        n = (slots or p.ops_in_flight) * p.c
        if base < 0 or base + n > 1 << addr_width:
            raise ValueError(f"{n} words at {base:#x} do not fit {addr_width} address bits")
        self.addr_width, self.base = addr_width, base
        self.entry = data.StructLayout({"addr": addr_width, "word": 32})  # a queued write
        super().__init__(p, slots, **sdram_port(addr_width))

    def elaborate(self, platform):
        return ResetInserter({"sync": ~self.mem_ready})(super().elaborate(platform))

    def _element_memory(self, m: Module, s: SimpleNamespace) -> None:
        aw = self.addr_width
        s.writes = SyncFIFOBuffered(width=self.entry.size, depth=WRITE_DEPTH)
        s.wdata = SyncFIFOBuffered(width=32, depth=WDATA_DEPTH)
        s.reads = SyncFIFOBuffered(width=aw, depth=WORD_DEPTH)
        s.words = SyncFIFOBuffered(width=32, depth=WORD_DEPTH)
        s.beats = SyncFIFOBuffered(width=3, depth=WORD_DEPTH)  # have, first, last
        for name in ("writes", "wdata", "reads", "words", "beats"):
            m.submodules[name] = getattr(s, name)
        self._arbiter(m, s)

    def _arbiter(self, m: Module, s: SimpleNamespace) -> None:
        """One command stream from the reads and writes queues; write words follow."""
        w = data.View(self.entry, s.writes.r_data)
        # writes queued before the last DRAIN (counted the cycle after it, when a beat
        # taken with it is being queued) and not yet commands
        fence = Signal(range(WRITE_DEPTH + 2))
        arm = Signal()
        read = s.reads.r_rdy & (fence == 0) & ~arm
        write = s.writes.r_rdy & s.wdata.w_rdy
        m.d.comb += [
            self.mem_cmd_valid.eq(read | write),
            self.mem_cmd_we.eq(~read),
            self.mem_cmd_addr.eq(self.base + Mux(read, s.reads.r_data, w.addr)),
        ]
        taken = self.mem_cmd_valid & self.mem_cmd_ready
        issued = taken & ~read
        drain = self.cmd.valid & self.cmd.ready & (self.cmd.payload.op == GatherOp.DRAIN)
        m.d.sync += arm.eq(drain)
        with m.If(arm):
            m.d.sync += fence.eq(s.writes.level + s.writes.w_en - issued)
        with m.Elif(issued & (fence != 0)):
            m.d.sync += fence.eq(fence - 1)
        m.d.comb += [
            s.reads.r_en.eq(taken & read),
            s.writes.r_en.eq(taken & ~read),
            s.wdata.w_en.eq(taken & ~read),
            s.wdata.w_data.eq(w.word),
            # litedram takes the word when it asks; `valid` only tells the underrun check
            self.mem_wdata_valid.eq(s.wdata.r_rdy),
            self.mem_wdata_data.eq(s.wdata.r_data),
            s.wdata.r_en.eq(self.mem_wdata_ready),
            s.words.w_en.eq(self.mem_rdata_valid),
            s.words.w_data.eq(self.mem_rdata_data),
        ]

    def _store_room(self, m: Module, s: SimpleNamespace):
        return s.writes.level <= WRITE_DEPTH - WRITE_SLACK

    def _store(self, m: Module, s: SimpleNamespace, en, addr, value) -> None:
        entry = data.View(self.entry, s.writes.w_data)
        m.d.comb += [s.writes.w_en.eq(en), entry.addr.eq(addr), entry.word.eq(value.as_value())]

    def _drain(self, m: Module, s: SimpleNamespace) -> None:
        # words asked for (queued or issued) and not yet given out: at most WORD_DEPTH
        owed = Signal(range(WORD_DEPTH + 1))
        room = Signal()
        m.d.comb += room.eq(s.beats.w_rdy & (owed < WORD_DEPTH) & s.reads.w_rdy)
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
        asked, given = beat.go & beat.have, out & have
        with m.If(asked & ~given):
            m.d.sync += owed.eq(owed + 1)
        with m.Elif(given & ~asked):
            m.d.sync += owed.eq(owed - 1)
