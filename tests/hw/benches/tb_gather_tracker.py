"""cocotb bench of the phase-2 gather tracker under Verilator: the model's scenarios, replayed.

The pytest side (tests/hw/test_gather_tracker.py) runs each scenario through NicModel
and writes a JSON file: the tracker events in the model's order with their ticks, and
what the model did (phase-2 ends in order, a verdict per gather frame, counters, own
t_C and T). This bench drives the events with random idle between them while the
`time` fence walks in random steps, and checks every result.
"""

from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from optireduce.sim.cocotb_run import pack_fields
from tests.hw.benches import phase_owner_tb as owner


async def run_scenario(dut, sc: dict, layout: dict, seed: int) -> None:
    rng = random.Random(seed)
    clk = dut.clk
    dut.rst.value = 1
    dut.ev_valid.value = 0
    dut.time.value = 0
    for _ in range(3):
        await RisingEdge(clk)
    dut.rst.value = 0
    owner.configure(dut, sc)
    verdicts = []

    def verdict():
        if int(dut.verdict_valid.value):
            verdicts.append(
                [int(dut.verdict_op.value), int(dut.verdict_index.value), int(dut.verdict.value)]
            )

    mon = owner.EndMonitor(dut, verdict)
    time = 0

    async def walk_to(t: int) -> None:
        nonlocal time
        while time < t:
            time = min(t, time + rng.choice([1, 1, 3, 50]))
            dut.time.value = time
            for _ in range(rng.randint(0, 3)):
                await RisingEdge(clk)

    for at, kind, fields in sc["events"]:
        if rng.random() < 0.4:
            await walk_to(at)
        await owner.send_event(dut, pack_fields({**fields, "kind": kind}, layout), at)
        time = max(time, at)
        dut.time.value = time
    await walk_to(sc["t_end"])
    dut.ev_payload.value = 0
    await mon.wind_down(sc["t_end"], 20000)

    mon.check(sc, "rx_gather")
    assert verdicts == sc["verdicts"], (verdicts, sc["verdicts"])


@cocotb.test()
async def gather_tracker_scenarios_match_the_model(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    for k, sc, cfg in owner.scenarios(dut):
        await run_scenario(dut, sc, cfg["layout"], seed=k)
