"""cocotb bench (run by sim/sdram_sim.py: nic_aggregation_rate): the whole NIC core with
its accumulators on litedram's simulated controller, fed its peers' scatter frames on
the network port as fast as it takes them.

One op of rank 0 in a lossless run (sim/sdram_sim.py: nic_rate_inputs): the CSR's
configuration, the op's START, then its words on the host port at the host link's
pace (`host_rate` words a cycle: the 5A-75B's host port is a GbE port too) while every
peer's scatter frame comes on the network port back to back, the next beat offered as
soon as the last one is taken: the core encodes, sends and sums its own op while it
takes its peers'. No tick is given, so no deadline fires. Measured in simulated time (the
core on `clk`, the store and the controller on `sdram_clk`) from the first peer beat
offered: until the last host word is taken (`host`), until the last peer beat is
taken (`taken`: the port's rate), until every element (the op's own and its peers')
is in the store and every sum a write command (`summed`), and until every frame the
model sends for these inputs has left on net_tx (`phase1`: its own scatter frames and
the means). Every frame sent is reported, for the comparison with the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotb.utils import get_sim_time

from optireduce.sim.cocotb_run import bench_config, until
from optireduce.sim.core_sim import beat_bytes, frame_beats

BOUND_CYCLES = 1_000_000  # any wait here


@cocotb.test()
async def nic_aggregation_rate(dut):
    cfg = bench_config()
    cfg |= json.loads(Path(cfg["inputs"]).read_text())  # CSR writes, words, peers' frames
    Clock(dut.clk, cfg["clk_ps"], unit="ps").start()
    if hasattr(dut, "sdram_clk"):  # two clocks (NicOnSdram's two_clocks)
        Clock(dut.sdram_clk, cfg["sdram_clk_ps"], unit="ps").start()
    for name in ("net_rx__valid", "host_cmd__valid", "host_i__valid", "tick", "csr_w_en",
                 "csr_r_en", "adapter_counts"):  # fmt: skip
        getattr(dut, name).value = 0
    dut.net_tx__ready.value = 1
    dut.host_o__ready.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    sent: list[str] = []
    cycle = {"n": 0}

    async def collect():  # net_tx, always ready
        frame = b""
        while True:
            await RisingEdge(dut.clk)
            cycle["n"] += 1
            if int(dut.net_tx__valid.value):
                chunk, last = beat_bytes(int(dut.net_tx__payload.value))
                frame += chunk
                if last:
                    sent.append(frame.hex())
                    frame = b""

    cocotb.start_soon(collect())

    async def wait(cond, what: str) -> None:
        await until(dut.clk, cond, what, BOUND_CYCLES)

    def idle() -> bool:
        return bool(int(dut.idle.value))

    async def offer(valid, ready, payload, words, rate: float = 1.0) -> None:
        """`words` on a stream, each held until taken; at most `rate` words a cycle on
        average (a slower link's pace)."""
        start = cycle["n"]
        for k, w in enumerate(words):
            while cycle["n"] - start < k / rate:  # word k not before cycle k / rate
                valid.value = 0
                await RisingEdge(dut.clk)
            valid.value, payload.value = 1, w
            await wait(lambda: int(ready.value), "a word taken")
        valid.value = 0

    await wait(idle, "idle after reset (the SDRAM's init)")
    for addr, value in cfg["csr"]:
        dut.csr_addr.value, dut.csr_w_data.value, dut.csr_w_en.value = addr, value, 1
        await RisingEdge(dut.clk)
    dut.csr_w_en.value = 0
    # the START, then its words while the peers' frames come: every peer beat offered
    # as soon as the last is taken
    await offer(dut.host_cmd__valid, dut.host_cmd__ready, dut.host_cmd__payload, [cfg["start"]])
    port, store = dut.nic.aggregator.store, dut.nic.aggregator.store.store  # its logic
    beats_in = {"n": 0}

    async def count_in() -> None:  # beats into the store's port (the core's clock)
        while True:
            await RisingEdge(dut.clk)
            beats_in["n"] += int(port.i__valid.value) & int(port.i__ready.value)

    cocotb.start_soon(count_in())
    beats = [b for f in cfg["peer_frames"] for b in frame_beats(bytes.fromhex(f))]
    c0, ns0 = cycle["n"], get_sim_time("ns")

    def since() -> dict:
        """Cycles of `clk` and simulated ns from the first peer beat offered."""
        return {"cycles": cycle["n"] - c0, "ns": get_sim_time("ns") - ns0}

    taken, summed = {}, {}

    async def peers_in() -> None:
        await offer(dut.net_rx__valid, dut.net_rx__ready, dut.net_rx__payload, beats)
        taken.update(since())
        # every element (the op's own and its peers') through the parser and into the
        # store's port, then every sum a write command
        await wait(lambda: beats_in["n"] >= cfg["store_beats"], "every beat into the store")
        await wait(lambda: int(store.drained.value) and not int(store.queued.value),
                    "the store drained")  # fmt: skip
        summed.update(since())

    peers = cocotb.start_soon(peers_in())
    words = cfg["words"]
    await offer(dut.host_i__valid, dut.host_i__ready, dut.host_i__payload,
                [w | (k == 0) << 32 | (k == len(words) - 1) << 33
                 for k, w in enumerate(words)], cfg["host_rate"])  # fmt: skip
    host = since()
    await peers
    await wait(
        lambda: len(sent) >= cfg["frames_out"],
        f"the model's {cfg['frames_out']} frames sent (sent: {len(sent)})",
    )
    done = since()
    await ClockCycles(dut.clk, 8)
    await wait(idle, "idle after phase 1")
    report = {
        "host": host,
        "taken": taken,
        "summed": summed,
        "phase1": done,
        "beats": len(beats),
        "sent": sent,
    }
    Path(cfg["out"]).write_text(json.dumps(report))
