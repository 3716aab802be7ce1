"""hw/async_fifo.py between two unrelated clocks: it holds exactly `depth` entries, says
nothing is there when it is empty, gives every entry once and in order, and moves one
entry a cycle of the slower clock when both sides always want to."""

from __future__ import annotations

import pytest

from optireduce.hw.async_fifo import AsyncFifo
from optireduce.sim.stream_sim import CORE_NS, two_clock_sim


@pytest.mark.parametrize("w_domain, r_domain", [("sync", "core"), ("core", "sync")])
@pytest.mark.parametrize("depth", [2, 8])
def test_holds_depth_entries_then_gives_them_in_order(w_domain, r_domain, depth):
    dut = AsyncFifo(width=12, depth=depth, w_domain=w_domain, r_domain=r_domain)
    sim = two_clock_sim(dut)
    res = {}

    async def bench(ctx):
        ctx.set(dut.r_en, 0)
        taken = 0
        for k in range(60):  # every other cycle, a write if there is room; nobody reads
            ctx.set(dut.w_data, 0x100 + taken)
            ctx.set(dut.w_en, k % 2)
            if k % 2 and ctx.get(dut.w_rdy):
                taken += 1
            await ctx.tick(w_domain)
        ctx.set(dut.w_en, 0)
        res["taken"] = taken
        got = []
        ctx.set(dut.r_en, 1)
        for _ in range(60):  # then the reader reads whenever there is an entry
            if ctx.get(dut.r_rdy):
                got.append(ctx.get(dut.r_data))
            await ctx.tick(r_domain)
        res["got"] = got

    sim.add_testbench(bench)
    sim.run()
    assert res["taken"] == depth
    assert res["got"] == [0x100 + k for k in range(depth)]


@pytest.mark.parametrize("w_domain, r_domain", [("sync", "core"), ("core", "sync")])
def test_moves_one_entry_per_cycle_of_the_slower_clock(w_domain, r_domain):
    dut = AsyncFifo(width=16, depth=8, w_domain=w_domain, r_domain=r_domain)
    sim = two_clock_sim(dut)
    got = []
    n = 400

    async def writer(ctx):
        k = 0
        while k < n:
            ctx.set(dut.w_data, k)
            ctx.set(dut.w_en, 1)
            await ctx.delay(1e-12)
            if ctx.get(dut.w_rdy):
                k += 1
            await ctx.tick(w_domain)
        ctx.set(dut.w_en, 0)

    async def reader(ctx):
        ctx.set(dut.r_en, 1)
        while len(got) < n:
            if ctx.get(dut.r_rdy):
                got.append(ctx.get(dut.r_data))
            await ctx.tick(r_domain)

    sim.add_testbench(writer, background=True)
    sim.add_testbench(reader)
    sim.run_until(n * CORE_NS * 1.15 * 1e-9 + 1e-6)
    # the slower clock (core) sets the pace: n entries within 1.15 n of its cycles
    assert got == list(range(n))
