"""SdramAccumulators (hw/sdram_accumulators.py) against Python integer sums, on a model of
litedram's port that holds commands back on purpose (tests/hw/sdram_port_model.py): the
orderings the store must keep whatever the memory's pace. The whole aggregator on
litedram's own controller is tests/hw/test_sdram_aggregator.py.

Each case: packets of P beats for rows of the store, values at the wire's extremes so
the sums need the top bits; then the rows fetched and read through `rd_*` as the
readout reads them; every accumulator equals the sum of what was sent to it.
"""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.hw.sdram_accumulators import SdramAccumulators
from optireduce.params import NicParams
from optireduce.sim.stream_sim import simulate
from tests.hw.sdram_port_model import PortModel

P = NicParams(p=16, b=64, c=256, n_max=8)
BEAT_BITS, INDEX_BITS, BASE = 4, 8, 0x300
BOUND = 20_000  # cycles any wait here may take


def _run(packets: list[tuple[int, bool]], *, open_at: int, refresh=None, fetch_at=None,
         seed: int = 0) -> tuple[dict, dict, PortModel]:  # fmt: skip
    """`packets`: (row, fresh) in order, sent back to back. Each row in `fetch_at`
    ({row: beats sent before its fetch}, default: after all) is fetched and read.
    Returns (what the rows read, the integer sums, the port)."""
    dut = SdramAccumulators(P, INDEX_BITS, BEAT_BITS, 20, base=BASE)
    port = PortModel(dut.mem, open_at, refresh)
    rng = np.random.default_rng(seed)
    wmax = (1 << 31) - 1
    sums: dict[int, list[int]] = {}
    sent = {"beats": 0}
    fetch_at = fetch_at or {}

    async def inputs(ctx):
        for row, fresh in packets:
            vals = rng.choice([wmax, -wmax, 0, 1, -1], P.p) if rng.random() < 0.5 else (
                rng.integers(-wmax, wmax + 1, P.p))  # fmt: skip
            old = [0] * P.p if fresh else sums[row]
            sums[row] = [o + int(v) for o, v in zip(old, vals, strict=True)]
            for b, v in enumerate(vals):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"index": (row << BEAT_BITS) | b, "value": int(v),
                                        "fresh": fresh, "first": b == 0})  # fmt: skip
                await ctx.tick().until(dut.i.ready)
                sent["beats"] += 1
        ctx.set(dut.i.valid, 0)

    got: dict[int, list[int]] = {}

    async def readout(ctx):
        last = sum(1 for _ in packets) * P.p
        order = sorted({r for r, _ in packets}, key=lambda r: fetch_at.get(r, last))
        for row in order:
            for _ in range(BOUND):
                if sent["beats"] >= fetch_at.get(row, last):
                    break
                await ctx.tick()
            ctx.set(dut.fetch_row, row)
            ctx.set(dut.fetch, 1)
            await ctx.tick()
            ctx.set(dut.fetch, 0)
            for _ in range(BOUND):
                if ctx.get(dut.fetched):
                    break
                await ctx.tick()
            else:
                raise AssertionError(f"row {row} not fetched in {BOUND} cycles")
            words = []
            for b in range(P.p):  # the word of beat b shows a cycle after its address
                ctx.set(dut.rd_beat, b)
                await ctx.tick()
                words.append(ctx.get(dut.rd_data))
            got[row] = words
        # every row fetched: the sums later packets add are not read

    simulate(dut, readout, port.run, inputs)
    return got, sums, port


def _signed(v: int) -> int:
    return v - (1 << P.w_acc) if v >> (P.w_acc - 1) else v


def _check(got: dict, sums: dict, rows) -> None:
    for row in rows:
        assert [_signed(w) for w in got[row]] == sums[row], f"row {row}"


@pytest.mark.parametrize(("open_at", "refresh"), [(200, (40, 6)), (0, None)])
def test_back_to_back_read_modify_writes_of_one_slot(open_at, refresh):
    """Eight contributions to one row with no gap (the first fresh): the port closed
    until they all queue, then refreshes; or open, each write going out as it comes.
    Each read follows the previous write."""
    packets = [(5, True)] + [(5, False)] * 7
    got, sums, port = _run(packets, open_at=open_at, refresh=refresh)
    _check(got, sums, [5])
    assert max(abs(v) for v in sums[5]) >= 1 << 31  # the top bits carried
    assert port.underruns == 0


def test_interleaved_slots_with_refreshes():
    """Contributions to three rows in turn, the port held 6 cycles in every 30."""
    rows = [1, 9, 14]
    packets = [(r, True) for r in rows] + [(r, False) for r in rows * 3]
    got, sums, port = _run(packets, open_at=0, refresh=(30, 6), seed=2)
    _check(got, sums, rows)
    assert port.underruns == 0


@pytest.mark.parametrize("open_at", [0, 60])
def test_a_fetch_reads_the_sums_still_on_their_way(open_at):
    """The readout's fetch raised the cycle the last beat of its row is taken (as a
    deadline can end the phase then), the port slow or closed: it reads the new sums."""
    packets = [(3, True), (7, True), (3, False), (7, False), (3, False)]
    n = len(packets) * P.p
    got, sums, port = _run(packets, open_at=open_at, fetch_at={3: n, 7: n}, seed=3)
    _check(got, sums, [3, 7])
    assert port.underruns == 0


def test_a_fresh_contribution_overwrites_what_the_row_held():
    """A row summed, then started again (a context's next op): the old sums are gone."""
    packets = [(2, True), (2, False), (2, False), (2, True), (2, False)]
    got, sums, _ = _run(packets, open_at=0, seed=5)
    _check(got, sums, [2])


def test_every_word_lands_at_base_plus_index():
    got, sums, port = _run([(0, True), (255 >> BEAT_BITS, True)], open_at=0)
    _check(got, sums, [0, 15])
    want = [BASE + i for i in range(P.p)] + [BASE + (15 << BEAT_BITS) + i for i in range(P.p)]
    assert sorted(port.mem) == want
