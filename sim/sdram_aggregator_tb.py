"""cocotb bench (run by sim/sdram_sim.py: aggregation_rate): SdramAggregator on litedram's
controller (simulation variant), fed scatter packets as fast as it takes them.

One op of C elements: the op's START, the rank under test's own packets (fresh sums),
then every peer of `world` sends it each of its slots (read-modify-writes), payload
beats back to back, the next event offered as the last beat goes. Measured in cycles
of `clk` and in simulated time (the store and the controller may have a clock of
their own, `sdram_clk`): from the first event taken (the SDRAM's init is done) until the
store has every sum as a write command (`drained`, nothing queued), and from then
until the last mean has left (the readout: a fetch per row, then its means).
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotb.utils import get_sim_time

from optireduce.sim.cocotb_run import bench_config, pack_fields, until

BOUND_CYCLES = 2_000_000  # any wait here
T_C_US = 1000  # no tick is given: no deadline fires


async def _until(dut, cond, what: str) -> int:
    return await until(dut.clk, cond, what, BOUND_CYCLES)


@cocotb.test()
async def aggregation_rate(dut):
    cfg = bench_config()
    layout, world, rank, c, p = cfg["layout"], cfg["world"], 0, cfg["c"], cfg["p"]
    Clock(dut.clk, cfg["clk_ps"], unit="ps").start()
    if "sdram_clk_ps" in cfg:  # the store and the controller on a clock of their own
        Clock(dut.sdram_clk, cfg["sdram_clk_ps"], unit="ps").start()
    for name in ("ev_valid", "i_valid", "tick", "i_first", "i_last"):
        getattr(dut, name).value = 0
    dut.o_ready.value = 1
    dut.rank.value, dut.world.value = rank, world
    dut.t_b.value, dut.t_c_min.value, dut.t_c_init.value = cfg["t_b"], 1, T_C_US
    dut.alpha_q8.value = 64
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    store = dut.block.agg.store.store  # the store's logic inside SdramAccumulators
    refresh = dut.block.ctrl.litedram
    for name in cfg["refresh"]:
        refresh = getattr(refresh, name)
    cycle = {"n": 0, "refreshes": 0}

    async def count():
        while True:
            await RisingEdge(dut.clk)
            cycle["n"] += 1

    async def count_refreshes():  # a strobe of the controller's clock
        mem_clk = dut.sdram_clk if "sdram_clk_ps" in cfg else dut.clk
        while True:
            await RisingEdge(mem_clk)
            cycle["refreshes"] += int(refresh.value)

    cocotb.start_soon(count())
    cocotb.start_soon(count_refreshes())

    async def event(fields: dict) -> None:
        dut.ev_payload.value = pack_fields(fields, layout)
        dut.ev_valid.value = 1
        await _until(dut, lambda: int(dut.ev_ready.value), "event taken")
        dut.ev_valid.value = 0

    npk = c // p
    slots = list(range(rank, npk, world))
    t0 = {}

    async def packet(fields: dict, seed: int) -> None:
        await event({"op_id": 0, "op_len": c, "pkt_index": fields["idx"], **fields})
        t0.setdefault("cycle", cycle["n"])  # from the first event taken (after the init)
        t0.setdefault("ns", get_sim_time("ns"))
        t0.setdefault("refreshes", cycle["refreshes"])
        dut.i_valid.value = 1
        for b in range(p):
            dut.i_data.value = (seed * 104729 + b) & 0xFFFF_FFFF
            dut.i_first.value, dut.i_last.value = b == 0, b == p - 1
            await _until(dut, lambda: int(dut.i_ready.value), "payload beat taken")
        dut.i_valid.value = 0

    # the op's START, its own packets (fresh sums), then every peer's packets (the wire)
    await event({"kind": 3, "op_id": 0, "op_len": c})
    for idx in slots:
        await packet({"kind": 2, "sender": rank, "idx": idx}, idx)
    elements = 0
    for k, idx in enumerate(slots):
        for s in range(1, world):
            await packet({"kind": 0, "sender": s, "idx": idx, "last": k == len(slots) - 1,
                          "t_c": T_C_US}, idx * world + s)  # fmt: skip
            elements += p
    await ClockCycles(dut.clk, 3)  # the last beat shows in the store's queue
    await _until(dut, lambda: int(store.drained.value) and not int(store.queued.value),
                 "store drained")  # fmt: skip
    ingest = {"elements": elements, "own_elements": len(slots) * p,
              "cycles": cycle["n"] - t0["cycle"], "ns": get_sim_time("ns") - t0["ns"],
              "refreshes": cycle["refreshes"] - t0["refreshes"]}  # fmt: skip
    c1, ns1, out = cycle["n"], get_sim_time("ns"), 0
    while out < len(slots) * p:
        await _until(dut, lambda: int(dut.o_valid.value), "a mean")
        out += 1
    readout = {"elements": out, "cycles": cycle["n"] - c1, "ns": get_sim_time("ns") - ns1}
    path = Path(cfg["out"])
    path.write_text(json.dumps({"ingest": ingest, "readout": readout}, indent=1))
