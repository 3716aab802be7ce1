"""SdramAccumulators (hw/sdram_accumulators.py) against Python integer sums, on a model of
litedram's port that holds commands back on purpose (tests/hw/sdram_port_model.py): the
orderings the store must keep whatever the memory's pace. The whole aggregator on
litedram's own controller is tests/hw/test_sdram_aggregator.py.

Each case is a script: packets of P beats for rows of the store (values at the wire's
extremes, so the sums need the top bits), and fetches of rows, each raised the cycle
after the last beat before it was taken and read through `rd_*` as the readout reads
it; every accumulator read equals the sum of what was sent to it before its fetch.
"""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.hw.sdram_accumulators import SdramAccumulators
from optireduce.params import NicParams
from optireduce.sim.stream_sim import simulate
from tests.hw.sdram_port_model import PortModel

P = NicParams(p=16, b=64, c=256, n_max=8)
P256 = NicParams(p=256, b=1024, c=2048, n_max=8)
BASE = 0x300
BOUND = 20_000  # cycles any wait here may take


def _run(script: list, p: NicParams = P, *, open_at: int = 0, seed: int = 0, **port) -> tuple:
    """`script`: ("packet", row, fresh) and ("fetch", row) in order. Returns (each fetch's
    (row, words read, sums expected), the port)."""
    bb = (p.p - 1).bit_length()
    dut = SdramAccumulators(p, bb + 4, bb, 20, base=BASE)
    model = PortModel(dut.mem, open_at, **port)
    rng = np.random.default_rng(seed)
    wmax = (1 << 31) - 1
    sums: dict[int, list[int]] = {}
    reads: list = []

    async def bench(ctx):
        for step in script:
            if step[0] == "packet":
                _, row, fresh = step
                if rng.random() < 0.5:
                    vals = rng.choice([wmax, -wmax, 0, 1, -1], p.p)
                else:
                    vals = rng.integers(-wmax, wmax + 1, p.p)
                old = [0] * p.p if fresh else sums[row]
                sums[row] = [o + int(v) for o, v in zip(old, vals, strict=True)]
                for b, v in enumerate(vals):
                    ctx.set(dut.i.valid, 1)
                    ctx.set(dut.i.payload, {"index": (row << bb) | b, "value": int(v),
                                            "fresh": fresh, "first": b == 0})  # fmt: skip
                    await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)
                continue
            row = step[1]
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
            for b in range(p.p):  # the word of beat b shows a cycle after its address
                ctx.set(dut.rd_beat, b)
                await ctx.tick()
                words.append(_signed(ctx.get(dut.rd_data), p))
            reads.append((row, words, list(sums[row])))

    simulate(dut, bench, model.run)
    return reads, model


def _signed(v: int, p: NicParams) -> int:
    return v - (1 << p.w_acc) if v >> (p.w_acc - 1) else v


def _check(reads: list) -> None:
    assert reads
    for row, got, want in reads:
        assert got == want, f"row {row}"


@pytest.mark.parametrize(("open_at", "refresh"), [(200, (40, 6)), (0, None)])
def test_back_to_back_read_modify_writes_of_one_slot(open_at, refresh):
    """Eight contributions to one row with no gap (the first fresh): the port closed for
    200 cycles (the queue fills, the input stalls), refreshes after; or open, each write
    going out as it comes. Each read follows the previous write."""
    script = [("packet", 5, True)] + [("packet", 5, False)] * 7 + [("fetch", 5)]
    reads, port = _run(script, open_at=open_at, refresh=refresh)
    _check(reads)
    assert max(abs(v) for v in reads[0][2]) >= 1 << 31  # the top bits carried
    assert port.underruns == 0


def test_interleaved_slots_with_refreshes():
    """Contributions to three rows in turn, the port held 6 cycles in every 30."""
    rows = [1, 9, 14]
    script = [("packet", r, True) for r in rows] + [("packet", r, False) for r in rows * 3]
    reads, port = _run(script + [("fetch", r) for r in rows], refresh=(30, 6), seed=2)
    _check(reads)
    assert port.underruns == 0


@pytest.mark.parametrize("open_at", [0, 60])
def test_a_fetch_reads_the_sums_still_on_their_way(open_at):
    """Each fetch raised the cycle after its row's last beat is taken (as a deadline can
    end the phase then), the port slow or closed: it reads the new sums."""
    script = [("packet", 3, True), ("packet", 7, True), ("packet", 3, False), ("fetch", 3),
              ("packet", 7, False), ("fetch", 7)]  # fmt: skip
    reads, port = _run(script, open_at=open_at, seed=3)
    _check(reads)
    assert port.underruns == 0


def test_a_fresh_contribution_overwrites_what_the_row_held():
    """A row summed and read out, then started again (the context's next op): the old
    sums are gone."""
    script = [("packet", 2, True), ("packet", 2, False), ("packet", 2, False), ("fetch", 2),
              ("packet", 2, True), ("packet", 2, False), ("fetch", 2)]  # fmt: skip
    reads, _ = _run(script, seed=5, latency=12, cl=16)
    _check(reads)


@pytest.mark.parametrize("cl", [40, 2], ids=["slow_reads", "fast_reads"])
def test_whole_packets(cl):
    """P = 256. With 40-cycle reads and refreshes: reads outstanding up to the in-flight
    queue's depth (32), and a fetch's reads held by the same bound. With 2-cycle reads:
    a packet's reads all go first, its sums queue (245 of 512) until the next packet's
    fence lets the writes go."""
    script = [("packet", 1, True), ("packet", 4, True), ("packet", 1, False),
              ("packet", 4, False), ("packet", 1, False), ("fetch", 1), ("fetch", 4)]  # fmt: skip
    refresh = (97, 9) if cl > 2 else None
    reads, port = _run(script, P256, seed=6, refresh=refresh, latency=6, cl=cl)
    _check(reads)
    assert port.underruns == 0


def test_every_word_lands_at_base_plus_index():
    reads, port = _run([("packet", 0, True), ("packet", 15, True), ("fetch", 0), ("fetch", 15)])
    _check(reads)
    want = [BASE + i for i in range(P.p)] + [BASE + (15 << 4) + i for i in range(P.p)]
    assert sorted(port.mem) == want
