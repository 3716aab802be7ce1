"""OpRecords (hw/op_records.py) against the registers it replaced, modelled in Python: a
word per (context, name), zeroed by a clear, written by its group's write, a clear and a
write in one cycle resolved by the statement stated last; reads see the state of the cycle."""

import numpy as np
from amaranth import Elaboratable, Module, Mux, Signal
from amaranth.sim import Simulator

from optireduce.hw.op_records import OpRecords

N_CTX = 4
GROUPS = {"a": {"x": 8, "y": 3}, "b": {"z": 5}, "c": {"w": 32}}


class _Bench(Elaboratable):
    """OpRecords driven from free signals: a clear, one write per group, one read."""

    def __init__(self, clear_last: bool) -> None:
        self.clear_last = clear_last
        self.clr, self.clr_slot = Signal(), Signal(range(N_CTX))
        self.wr = {g: Signal(name=f"wr_{g}") for g in GROUPS}
        self.wr_slot = {g: Signal(range(N_CTX), name=f"wr_slot_{g}") for g in GROUPS}
        self.val = {n: Signal(w, name=f"val_{n}") for ws in GROUPS.values() for n, w in ws.items()}
        self.rd_slot = Signal(range(N_CTX))
        self.out = {n: Signal(w, name=f"out_{n}") for ws in GROUPS.values() for n, w in ws.items()}

    def elaborate(self, platform):
        m = Module()
        rec = OpRecords(m, N_CTX, GROUPS)

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
        words, written = rec.read(m, self.rd_slot)
        # a word reads 0 until its group is written (the core gates the word it selects)
        m.d.comb += [self.out[n].eq(Mux(written[n], v, 0)) for n, v in words.items()]
        return m


def _run(clear_last: bool, seed: int) -> int:
    dut = _Bench(clear_last)
    rng = np.random.default_rng(seed)
    model = [{n: 0 for ws in GROUPS.values() for n in ws} for _ in range(N_CTX)]
    nonzero = 0  # reads that saw a written word

    async def bench(ctx):
        nonlocal nonzero
        for _ in range(3000):
            clr, clr_slot = rng.random() < 0.15, int(rng.integers(N_CTX))
            writes = {g: (rng.random() < 0.3, int(rng.integers(N_CTX))) for g in GROUPS}
            vals = {n: int(rng.integers(1 << w)) for ws in GROUPS.values() for n, w in ws.items()}
            rd = int(rng.integers(N_CTX))
            ctx.set(dut.clr, clr)
            ctx.set(dut.clr_slot, clr_slot)
            for g, (en, slot) in writes.items():
                ctx.set(dut.wr[g], en)
                ctx.set(dut.wr_slot[g], slot)
            for n, v in vals.items():
                ctx.set(dut.val[n], v)
            ctx.set(dut.rd_slot, rd)
            for n, want in model[rd].items():  # this cycle's state, before the edge
                assert ctx.get(dut.out[n]) == want, (n, rd)
                nonzero += want != 0
            steps = [("write", g) for g in GROUPS]
            steps = [*steps, ("clear", None)] if clear_last else [("clear", None), *steps]
            for kind, g in steps:
                if kind == "clear" and clr:
                    model[clr_slot] = dict.fromkeys(model[clr_slot], 0)
                elif kind == "write" and writes[g][0]:
                    model[writes[g][1]].update({n: vals[n] for n in GROUPS[g]})
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return nonzero


def test_op_records_behave_as_registers_clear_stated_first():
    assert _run(clear_last=False, seed=1) > 1000  # most reads saw a written word


def test_op_records_behave_as_registers_clear_stated_last():
    assert _run(clear_last=True, seed=2) > 1000
