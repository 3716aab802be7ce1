"""The phase-1 aggregator with its accumulators in SDRAM (hw/sdram_accumulators.py).

At C = 16K the accumulators (n_ctx · C/2 × 35 bits) exceed the 5A-75B's block RAM
(docs/boards.md). This variant is the Aggregator's code, events, phase ends and
readout, with only the accumulator store changed:
- a payload beat goes to the store's queue (the payload stalls while it is full; the
  beats of a late or duplicate frame are taken and dropped, as on chip);
- the readout fetches each owned row before streaming it (MeanReadout's `row_fetch`,
  `acc_ready`), once every beat queued before it is a write command;
- no event is taken until the controller's init is done (`mem.ready`);
- the store and `mem` may run in a clock of their own (`mem_domain`): the aggregator
  at the core's clock, the store at the memory's (hw/sdram_accumulators.py).
The results are the on-chip aggregator's, bit for bit; what changes is time: a slot
costs its read-modify-write at the memory's pace, and a row's fetch before its means.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from optireduce.hw.aggregator import Aggregator
from optireduce.hw.sdram_accumulators import WORD, SdramAccumulators
from optireduce.hw.sdram_controller import native_port
from optireduce.params import NicParams


class SdramAggregator(Aggregator):
    """Aggregator whose accumulators live in SDRAM at `base` (module docstring)."""

    def __init__(
        self,
        p: NicParams,
        addr_width: int,
        base: int = 0,
        tick0: int = 0,
        *,
        tc_external: bool = False,
        mem_domain: str = "sync",
    ) -> None:
        self.beat_bits, self.index_bits = self.index_width(p)
        # raises here (not at elaboration) if the parameters do not suit the store
        self.store = SdramAccumulators(
            p, self.index_bits, self.beat_bits, addr_width, base, domain=mem_domain
        )
        super().__init__(p, tick0, tc_external=tc_external, mem=Out(native_port(addr_width, WORD)))

    @staticmethod
    def index_width(p: NicParams) -> tuple[int, int]:
        """(beat bits, index bits) of an accumulator's index Cat(beat, row, context), as on
        chip: 1 << index bits words of SDRAM from `base`."""
        n_ctx, rows_max, beats = Aggregator.sizes(p)
        bits = [max(1, (n - 1).bit_length()) for n in (beats, rows_max, n_ctx)]
        return bits[0], sum(bits)

    def _accumulator_memory(self, m: Module, s: SimpleNamespace) -> None:
        m.submodules.store = s.store = acc = self.store
        wiring.connect(m, acc.mem, wiring.flipped(self.mem))
        s.i_room = acc.i.ready
        s.mem_open = acc.open

    def _accumulate(self, m: Module, s: SimpleNamespace) -> None:
        """Each payload beat of an accepted frame into the store's queue."""
        beat = s.store.i.payload
        m.d.comb += [
            s.store.i.valid.eq(s.in_payload & self.i.valid & ~s.drop),
            beat.index.eq(Cat(s.beat, s.row, s.c)),
            beat.value.eq(self.i.payload.data[0]),
            beat.fresh.eq(s.fresh),
            beat.first.eq(s.beat == 0),
        ]

    def _readout_memory(self, m: Module, s: SimpleNamespace) -> None:
        ro, acc = s.ro, s.store
        m.d.comb += [
            acc.fetch.eq(ro.row_fetch),
            acc.fetch_row.eq(ro.bm_addr),
            ro.acc_ready.eq(acc.fetched),
            acc.rd_en.eq(ro.acc_en),
            acc.rd_beat.eq(ro.acc_addr[: self.beat_bits]),
            ro.acc_data.eq(acc.rd_data),
        ]
