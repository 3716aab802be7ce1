"""cocotb bench of the phase-1 aggregator under Verilator: the model's scenarios, replayed.

The pytest side (tests/hw/test_aggregator.py) runs each scenario through NicModel
and writes a JSON file: the aggregator events with their ticks, and what the model
did (phase-1 ends, gather payloads, counters, own t_C and T). This bench drives the
events (tick strobes, the event port, the payload on s_axis with random idle),
drains m_axis with random backpressure, and checks every result.
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config

REASONS = {1: "complete", 2: "early", 3: "deadline"}


def pack_event(fields: dict, layout: dict) -> int:
    word = 0
    for name, (offset, width) in layout.items():
        word |= (int(fields.get(name, 0)) & ((1 << width) - 1)) << offset
    return word


async def run_scenario(dut, tb: AxisTB, sc: dict, layout: dict, lanes: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    clk = dut.clk
    await tb.reset()
    dut.rank.value = sc["rank"]
    dut.world.value = sc["world"]
    dut.t_b.value = sc["t_b"]
    dut.alpha_q8.value = sc["alpha_q8"]
    dut.tick.value = 0
    dut.ev_valid.value = 0
    ends, order, firsts, stop = {}, [], [], False

    async def monitor():
        while not stop:
            await RisingEdge(clk)
            if int(dut.end_valid.value):
                op = int(dut.end_op.value)
                assert str(op) not in ends, f"op {op} ended twice"
                order.append(op)
                ends[str(op)] = [
                    REASONS[int(dut.end_reason.value)], int(dut.end_tick.value),
                    int(dut.end_timeout.value), int(dut.end_received.value),
                    int(dut.end_expected.value),
                ]  # fmt: skip
            hs = int(dut.m_axis_tvalid.value) and int(dut.m_axis_tready.value)
            if hs and int(dut.m_axis_tuser.value):
                firsts.append((int(dut.o_op.value), int(dut.o_index.value),
                               int(dut.o_count.value)))  # fmt: skip

    mon = cocotb.start_soon(monitor())
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
        dut.ev_payload.value = pack_event({"kind": kind, **fields}, layout)
        dut.ev_valid.value = 1
        while True:
            await RisingEdge(clk)
            if int(dut.ev_ready.value):
                break
        dut.ev_valid.value = 0
        assert int(dut.now.value) == t, (int(dut.now.value), t)
        if vals is not None:
            await tb.send(pack(vals, 32, lanes), first=True)
    await tick_to(sc["t_end"])
    slots = {}
    for _ in range(len(sc["slots"])):
        frame = await tb.recv()
        op, idx, count = firsts[len(slots)]
        slots[f"{op},{idx}"] = [count, unpack(frame.tdata, 32, lanes).tolist()]
    for _ in range(5000):
        await RisingEdge(clk)
        if int(dut.now.value) == sc["t_end"] and int(dut.ev_ready.value):
            break
    for _ in range(40):
        await RisingEdge(clk)
    stop = True
    await mon

    assert ends == sc["ends"], (ends, sc["ends"])
    assert order == sc["end_order"], (order, sc["end_order"])
    assert sorted(slots) == sorted(sc["slots"])
    for key, (count, vals) in sc["slots"].items():
        assert slots[key][0] == count, key
        np.testing.assert_equal(slots[key][1], vals, err_msg=key)
    counters = {
        "rx_scatter": int(dut.cnt_rx.value),
        "duplicate": int(dut.cnt_duplicate.value),
        "late": int(dut.cnt_late.value),
    }
    assert counters == sc["counters"], (counters, sc["counters"])
    assert int(dut.own_tc.value) == sc["own_tc"]
    assert int(dut.timeout.value) == sc["timeout"]
    assert tb.sink.empty()


@cocotb.test()
async def aggregator_scenarios_match_the_model(dut):
    cfg = bench_config()
    with open(cfg["scenarios"]) as f:
        scenarios = json.load(f)
    tb = AxisTB(dut, seed=3, idle=0.3, backpressure=0.3)
    for k, sc in enumerate(scenarios):
        dut._log.info("scenario %s", sc["name"])
        await run_scenario(dut, tb, sc, cfg["layout"], cfg["lanes"], seed=k)
