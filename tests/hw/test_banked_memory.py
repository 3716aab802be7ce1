"""BankedMemory (hw/banked_memory.py) against a Python list: random writes and reads over
several banks (the last one short), each read's data LATENCY cycles after its address,
each write in the banks WRITE_LATENCY cycles after it is offered; a read of the address
being written is poisoned in simulation (hw/block_ram.py)."""

import random

import pytest
from amaranth.sim import Simulator

from optireduce.hw.banked_memory import BankedMemory


def test_reads_return_the_last_write_after_latency_cycles():
    dut = BankedMemory(12, depth=50, bank_depth=16)  # banks of 16, 16, 16, 2
    assert dut.n_banks == 4
    rng = random.Random(4)
    model = [0] * 50
    got, want = [], []

    async def bench(ctx):
        pending = []  # (cycle the data is due, expected)
        landing = None  # the write offered last cycle, reaching the banks this one
        for cyc in range(600):
            w_addr, w_data, w_en = rng.randrange(50), rng.getrandbits(12), rng.random() < 0.5
            r_addr = rng.randrange(50)
            ctx.set(dut.w_addr, w_addr)
            ctx.set(dut.w_data, w_data)
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.r_addr, r_addr)
            if pending and pending[0][0] == cyc:
                got.append(ctx.get(dut.r_data))
                want.append(pending.pop(0)[1])
            # a write reaches the banks a cycle after it is offered: a read sees the
            # writes offered before the last cycle; one of the address offered then is
            # undefined, and the simulation gives the old word's complement
            collides = landing is not None and landing[0] == r_addr
            old = model[r_addr]
            pending.append((cyc + BankedMemory.LATENCY, ~old & 0xFFF if collides else old))
            if landing is not None:
                model[landing[0]] = landing[1]
            landing = (w_addr, w_data) if w_en else None
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(got) > 500 and got == want
    assert len(set(want)) > 100  # real data, not zeros


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        BankedMemory(8, depth=0)
    with pytest.raises(ValueError):
        BankedMemory(8, depth=64, bank_depth=24)
