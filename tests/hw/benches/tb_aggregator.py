"""cocotb bench of the phase-1 aggregator under Verilator: the model's scenarios, replayed.

The pytest side (tests/hw/test_aggregator.py) runs each scenario through NicModel
and writes a JSON file: the aggregator events with their ticks, and what the model
did (phase-1 ends, gather payloads, counters, own t_C and T). This bench drives the
events (tick strobes, the event port, the payload on s_axis with random idle),
drains m_axis with random backpressure, and checks every result.
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config, pack_fields
from tests.hw.benches import phase_owner_tb as owner
from tests.hw.benches.sdram_watch import count_refreshes, sdram_clock


async def run_scenario(dut, tb: AxisTB, sc: dict, layout: dict, lanes: int, seed: int) -> None:
    rng = random.Random(seed)
    clk = dut.clk
    await tb.reset()
    owner.configure(dut, sc)
    dut.tick.value = 0
    dut.ev_valid.value = 0
    firsts = []

    def first_beats():
        hs = int(dut.m_axis_tvalid.value) and int(dut.m_axis_tready.value)
        if hs and int(dut.m_axis_tuser.value):
            firsts.append((int(dut.o_op.value), int(dut.o_index.value),
                           int(dut.o_count.value)))  # fmt: skip

    mon = owner.EndMonitor(dut, first_beats)
    ticks = 0

    async def tick_to(t: int) -> None:
        nonlocal ticks
        while ticks < t:
            dut.tick.value = 1
            await RisingEdge(clk)
            dut.tick.value = 0
            ticks += 1
            for _ in range(rng.randint(0, 4)):
                await RisingEdge(clk)

    for t, kind, fields, vals in sc["events"]:
        await tick_to(t)
        await owner.send_event(dut, pack_fields({"kind": kind, **fields}, layout), t)
        if vals is not None:
            await tb.send(pack(vals, 32, lanes), first=True)
    await tick_to(sc["t_end"])
    slots = {}
    for _ in range(len(sc["slots"])):
        frame = await tb.recv()
        op, idx, count = firsts[len(slots)]
        slots[f"{op},{idx}"] = [count, unpack(frame.tdata, 32, lanes).tolist()]
    await mon.wind_down(sc["t_end"], 5000)

    mon.check(sc, "rx_scatter")
    assert sorted(slots) == sorted(sc["slots"])
    for key, (count, vals) in sc["slots"].items():
        assert slots[key][0] == count, key
        np.testing.assert_equal(slots[key][1], vals, err_msg=key)
    assert tb.sink.empty()


@cocotb.test()
async def aggregator_scenarios_match_the_model(dut):
    tb = AxisTB(dut, seed=3, idle=0.3, backpressure=0.3)
    cfg = bench_config()
    clock = sdram_clock(dut, cfg)  # the store and the controller on a clock of their own?
    if "refresh" in cfg:  # accumulators in SDRAM: the controller's refreshes, and those
        # that came while the store had beats on their way
        refreshes = count_refreshes(dut, cfg["refresh"], cfg["store_drained"], clock)
    for k, sc, cfg in owner.scenarios(dut):
        await run_scenario(dut, tb, sc, cfg["layout"], cfg["lanes"], seed=k)
    if "refresh" in cfg:  # accumulators in SDRAM: refreshes came while they were busy
        dut._log.info("refreshes: %d, %d of them with beats on their way", *refreshes.values())
        assert refreshes["busy"] >= 2, refreshes
        assert dut.underrun.value == 0 and dut.error.value == 0
