"""Skid (hw/skid.py): every beat once and in order under random valid and ready; `i.ready`
never follows `o.ready` within a cycle; with nothing held a beat passes in the same cycle."""

import numpy as np
from amaranth.sim import Simulator

from optireduce.hw.skid import Skid


def test_skid_keeps_order_and_registers_ready():
    dut = Skid(16)
    rng = np.random.default_rng(3)
    beats = [int(v) for v in rng.integers(0, 1 << 16, 400)]
    got, stalls = [], 0

    async def bench(ctx):
        nonlocal stalls
        k = 0
        for _ in range(3000):
            offer = k < len(beats) and rng.random() < 0.7
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, beats[k] if offer else 0)
            ready_before = ctx.get(dut.i.ready)
            for take in (0, 1, rng.random() < 0.6):  # o.ready toggled inside the cycle
                ctx.set(dut.o.ready, int(take))
                assert ctx.get(dut.i.ready) == ready_before
            if offer and ready_before and take:
                # nothing held: the offered beat is on `o` in the same cycle
                assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == beats[k]
            if ctx.get(dut.o.valid) and take:
                got.append(ctx.get(dut.o.payload))
            if offer and ready_before:
                k += 1
            stalls += offer and not ready_before
            await ctx.tick()
            if len(got) == len(beats):
                break
        assert got == beats
        assert stalls > 50  # the spare register was used, and held its beat

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
