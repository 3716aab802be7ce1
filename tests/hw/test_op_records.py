"""OpRecords (hw/op_records.py) against the registers it replaced, modelled in Python: a
word per (context, name), zeroed by a clear, written by its group's write, a clear and a
write in one cycle resolved by the statement stated last. Reads go to the memory once
the writer is done (`busy` low), as the drain reads; a group written again before its
last write reached the memory sets `overrun`."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Mux, Signal
from amaranth.sim import Simulator

from optireduce.hw.op_records import OpRecords

N_CTX = 4
# a row of 36 bits: "a" packs into two rows, "c" needs one of its own, "d" fills a row
GROUPS = {"a": {"x": 24, "y": 3, "w": 20, "u": 7}, "b": {"z": 5}, "c": {"v": 32},
          "d": {"p": 12, "q": 12, "r": 12}}  # fmt: skip
NAMES = {n: w for ws in GROUPS.values() for n, w in ws.items()}


class _Bench(Elaboratable):
    """OpRecords driven from free signals: a clear, one write per group, one read."""

    def __init__(self, clear_last: bool) -> None:
        self.clear_last = clear_last
        self.clr, self.clr_slot = Signal(), Signal(range(N_CTX))
        self.wr = {g: Signal(name=f"wr_{g}") for g in GROUPS}
        self.wr_slot = {g: Signal(range(N_CTX), name=f"wr_slot_{g}") for g in GROUPS}
        self.val = {n: Signal(w, name=f"val_{n}") for n, w in NAMES.items()}
        self.rd_slot, self.rd_row = Signal(range(N_CTX)), Signal(3)
        self.out = {n: Signal(w, name=f"out_{n}") for n, w in NAMES.items()}
        self.busy, self.overrun = Signal(), Signal()

    def elaborate(self, platform):
        m = Module()
        self.rec = rec = OpRecords(m, N_CTX, GROUPS)

        def clear():
            with m.If(self.clr):
                rec.clear(m, self.clr_slot)

        if not self.clear_last:
            clear()
        for g, words in GROUPS.items():
            with m.If(self.wr[g]):
                rec.write(m, g, self.wr_slot[g], {n: self.val[n] for n in words})
        if self.clear_last:
            clear()
        words, written = rec.read(m, self.rd_slot, self.rd_row)
        # a word reads 0 until its group is written (the core gates the word it selects)
        m.d.comb += [self.out[n].eq(Mux(written[n], v, 0)) for n, v in words.items()]
        m.d.comb += [self.busy.eq(rec.busy), self.overrun.eq(rec.overrun)]
        return m


def _simulate(dut, bench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_the_rows_pack_first_fit_widest_first():
    """The layout the drain addresses: rows by group, in order; a group's words widest
    first, each in the first row it fits (x, then w in a row of its own, then u and y
    back in x's row)."""
    rec = _Bench(False)
    _simulate(rec, _noop)
    assert rec.rec.place == {
        "x": (0, 0, 24), "u": (0, 24, 7), "y": (0, 31, 3), "w": (1, 0, 20),
        "z": (2, 0, 5), "v": (3, 0, 32), "p": (4, 0, 12), "q": (4, 12, 12), "r": (4, 24, 12),
    }  # fmt: skip
    assert rec.rec.rows == 5
    # the 25F's phase-1 words: in the order given they would take three rows
    g = {"end": 24, "reason": 2, "timeout": 20, "expected": 9, "received": 9}
    assert OpRecords(Module(), 2, {"p1": g}).rows == 2


async def _noop(ctx):
    await ctx.tick()


def _run(clear_last: bool, seed: int) -> int:
    dut = _Bench(clear_last)
    rng = np.random.default_rng(seed)
    model = [dict.fromkeys(NAMES, 0) for _ in range(N_CTX)]
    nonzero = 0  # words read that were written
    last_write = dict.fromkeys(GROUPS, -100)

    async def bench(ctx):
        nonlocal nonzero
        for cycle in range(4000):
            clr, clr_slot = rng.random() < 0.05, int(rng.integers(N_CTX))
            # the contract: a group again only once its last write is in the memory (its
            # rows, after the groups before it: 5 rows in all here)
            writes = {g: (cycle - last_write[g] > 5 and rng.random() < 0.2,
                          int(rng.integers(N_CTX))) for g in GROUPS}  # fmt: skip
            vals = {n: int(rng.integers(1 << w)) for n, w in NAMES.items()}
            rd_slot, rd_row = int(rng.integers(N_CTX)), int(rng.integers(dut.rec.rows))
            ctx.set(dut.clr, clr)
            ctx.set(dut.clr_slot, clr_slot)
            for g, (en, slot) in writes.items():
                ctx.set(dut.wr[g], en)
                ctx.set(dut.wr_slot[g], slot)
                if en:
                    last_write[g] = cycle
            for n, v in vals.items():
                ctx.set(dut.val[n], v)
            ctx.set(dut.rd_slot, rd_slot)
            ctx.set(dut.rd_row, rd_row)
            if not ctx.get(dut.busy):  # this cycle's state, before the edge
                for n, (row, _, _) in dut.rec.place.items():
                    if row == rd_row:
                        assert ctx.get(dut.out[n]) == model[rd_slot][n], (cycle, n, rd_slot)
                        nonzero += model[rd_slot][n] != 0
            steps = [("write", g) for g in GROUPS]
            steps = [*steps, ("clear", None)] if clear_last else [("clear", None), *steps]
            for kind, g in steps:
                if kind == "clear" and clr:
                    model[clr_slot] = dict.fromkeys(model[clr_slot], 0)
                elif kind == "write" and writes[g][0]:
                    model[writes[g][1]].update({n: vals[n] for n in GROUPS[g]})
            await ctx.tick()
        assert not ctx.get(dut.overrun)

    _simulate(dut, bench)
    return nonzero


@pytest.mark.parametrize(("clear_last", "seed"), [(False, 1), (True, 2)])
def test_op_records_behave_as_registers(clear_last, seed):
    assert _run(clear_last, seed) > 1000  # many reads saw a written word


def test_every_group_at_once_is_in_memory_within_rows_cycles_and_a_rewrite_overruns():
    dut = _Bench(False)

    async def bench(ctx):
        for g in GROUPS:
            ctx.set(dut.wr[g], 1)
            ctx.set(dut.wr_slot[g], 2)
        for n, w in NAMES.items():
            ctx.set(dut.val[n], (1 << w) - 1)
        await ctx.tick()
        for g in GROUPS:
            ctx.set(dut.wr[g], 0)
        busy = 0
        while ctx.get(dut.busy) and busy <= 4 * dut.rec.rows:
            busy += 1
            await ctx.tick()
        assert busy == dut.rec.rows and not ctx.get(dut.overrun)
        for row in range(dut.rec.rows):  # all ones, each word as wide as it is
            ctx.set(dut.rd_slot, 2)
            ctx.set(dut.rd_row, row)
            for n, (r, _, w) in dut.rec.place.items():
                if r == row:
                    assert ctx.get(dut.out[n]) == (1 << w) - 1, n
        # "c" again while it waits behind "a" and "b": its first write is lost, flagged
        ctx.set(dut.wr["a"], 1)
        ctx.set(dut.wr["c"], 1)
        await ctx.tick()
        ctx.set(dut.wr["a"], 0)
        assert not ctx.get(dut.overrun)
        await ctx.tick()  # "c" again: the writer is on "a"'s first row
        ctx.set(dut.wr["c"], 0)
        await ctx.tick()
        assert ctx.get(dut.overrun)

    _simulate(dut, bench)
