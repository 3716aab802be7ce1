"""wide_multiply (hw/wide_multiplier.py): every product equals Python's a * b, LATENCY
enabled cycles after its operands, with the enable dropping at random."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from optireduce.hw import wide_multiplier as wmul


class _Dut(wiring.Component):
    def __init__(self, wa: int, wb: int) -> None:
        self.wa, self.wb = wa, wb
        super().__init__({"a": In(wa), "b": In(wb), "en": In(1), "p": Out(wa + wb)})

    def elaborate(self, platform):
        m = Module()
        prod = wmul.wide_multiply(m, self.a, self.b, self.en)
        m.d.comb += self.p.eq(prod)
        return m


@pytest.mark.parametrize("wa,wb", [(37, 43), (17, 17), (5, 40), (34, 18)])
def test_products_are_exact_and_follow_the_enable(wa, wb):
    rng = random.Random(wa * 100 + wb)
    dut = _Dut(wa, wb)
    edges = [(0, 0), ((1 << wa) - 1, (1 << wb) - 1), (1, (1 << wb) - 1), ((1 << wa) - 1, 1)]
    ops = edges + [(rng.getrandbits(wa), rng.getrandbits(wb)) for _ in range(200)]
    checked = []

    async def bench(ctx):
        fed: list[int | None] = []  # the last LATENCY products fed, oldest first
        k = 0
        while k < len(ops) + wmul.LATENCY:
            en = rng.random() < 0.7
            a, b = ops[k] if k < len(ops) else (0, 0)
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            ctx.set(dut.en, en)
            await ctx.tick()
            if en:  # one more product in, the pipeline moved
                fed = [*fed, a * b if k < len(ops) else None][-wmul.LATENCY :]
                k += 1
            if len(fed) == wmul.LATENCY and fed[0] is not None:
                assert ctx.get(dut.p) == fed[0]  # and held while the enable is low
                checked.append(fed[0])

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert set(checked) == {a * b for a, b in ops}  # every product came out
    assert ((1 << wa) - 1) * ((1 << wb) - 1) in checked
