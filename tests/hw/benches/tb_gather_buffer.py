"""cocotb bench of GatherBuffer (in PlainStreams + AxisWrapper): reduced packets on s_axis with
their side ports, DRAIN/CLEAR on cmd_*, blocks on m_axis and k per block on k_*; random idle
and backpressure; compared with host/model/gather_buffer.py GatherBuffer."""

from __future__ import annotations

import logging
import random

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamSink

from optireduce.host.model.gather_buffer import GatherBuffer
from optireduce.params import NicParams
from optireduce.sim.axis_tb import AxisTB, pack, pauses, unpack
from optireduce.sim.cocotb_run import bench_config
from tests.hw.benches.sdram_watch import count_refreshes, inner, sdram_clock

DRAIN, CLEAR = 0, 1


BOUND_CYCLES = 100_000  # any wait here; an SDRAM-backed buffer's init takes about 21 000


async def command(dut, op: int, slot: int, n: int = 0) -> None:
    dut.cmd_op.value, dut.cmd_slot.value, dut.cmd_n.value = op, slot, n
    dut.cmd_valid.value = 1
    await until_ready(dut)
    dut.cmd_valid.value = 0


async def until_ready(dut) -> None:
    """The edge at which cmd_ready is high (bounded)."""
    for _ in range(BOUND_CYCLES):
        await RisingEdge(dut.clk)
        if dut.cmd_ready.value == 1:
            return
    raise AssertionError(f"cmd_ready stayed low for {BOUND_CYCLES} cycles")


async def hist_entry(dut, slot: int, addr: int) -> int:
    dut.hist_slot.value, dut.hist_addr.value = slot, addr
    await RisingEdge(dut.clk)
    await ReadOnly()
    value = int(dut.hist_data.value)
    await RisingEdge(dut.clk)
    return value


@cocotb.test(timeout_time=50, timeout_unit="ms")  # every wait bounded (sim time)
async def loss_duplicates_two_slots(dut):
    cfg = bench_config()
    p = NicParams(p=cfg["p"], b=cfg["b"], c=cfg["c"], n_max=cfg["n_max"], lanes=cfg["lanes"])
    tb = AxisTB(dut, seed=5, idle=0.3, backpressure=0.3)
    ksink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "k"), dut.clk, dut.rst)
    ksink.log.setLevel(logging.WARNING)
    ksink.set_pause_generator(pauses(random.Random(6), 0.6))
    clock = sdram_clock(dut, cfg)  # an SDRAM-backed buffer's, maybe a clock of its own
    dut.cmd_valid.value = 0
    await tb.reset()
    await until_ready(dut)  # the reset-time clear of the histograms (and an SDRAM's init)

    dups = {"n": 0}

    async def count_dups():
        while True:
            await RisingEdge(dut.clk)
            dups["n"] += int(dut.duplicate.value)

    cocotb.start_soon(count_dups())
    # an SDRAM-backed buffer: count the controller's refreshes
    refreshes = count_refreshes(dut, cfg["refresh"], clock=clock) if "refresh" in cfg else {"n": 0}
    rng = np.random.default_rng(7)
    lim = 1 << 31
    ops = {0: (p.c, GatherBuffer(p, p.packets_for(p.c))), 1: (90, GatherBuffer(p, 2 * p.b // p.p))}
    expect_dups = 0
    for slot, (n, model) in ops.items():
        order = []
        for i in range(p.packets_for(n)):
            if rng.random() < 0.7:
                order += [i] * (2 if rng.random() < 0.2 else 1)
        rng.shuffle(order)
        for i in order:
            vals = rng.integers(-lim, lim, p.p)
            vals[0] = rng.choice([-lim, lim - 1, 0])
            contrib = int(rng.integers(1, p.n_max + 1))
            expect_dups += not model.place(i, vals, contrib)
            dut.slot.value, dut.pkt_index.value, dut.contributors.value = slot, i, contrib
            await tb.send(pack(vals, 32, p.lanes), first=True)
            await tb.source.wait()  # side ports change only between packets

    for slot, (n, model) in ops.items():
        await command(dut, DRAIN, slot, n)
        z = model.z.ravel()
        nblk = p.padded_len(n) // p.b
        for j in range(nblk):
            got = await tb.recv()
            np.testing.assert_array_equal(
                unpack(got.tdata, 32, p.lanes), z[j * p.b : (j + 1) * p.b]
            )
        ks = [(await ksink.recv()).tdata[0] for _ in range(nblk)]
        want = model.have.reshape(-1, p.packets_per_block).sum(axis=1)
        assert ks == want.tolist(), (ks, want)
        hist = [await hist_entry(dut, slot, a) for a in range(p.n_max + 1)]
        assert hist == model.histogram(p.n_max).tolist(), (hist, model.histogram(p.n_max))
    assert dups["n"] == expect_dups and expect_dups > 0
    if "refresh" in cfg:  # the packets and drains went on through refreshes, all taken
        assert refreshes["n"] >= 2, refreshes
        assert dut.underrun.value == 0 and dut.error.value == 0 and dut.fault.value == 0

    # clear slot 1: a drain then gives zeros, k = 0 and every packet missing
    await command(dut, CLEAR, 1)
    await command(dut, DRAIN, 1, 1)
    got = await tb.recv()
    np.testing.assert_array_equal(unpack(got.tdata, 32, p.lanes), np.zeros(p.b, dtype=np.int64))
    assert (await ksink.recv()).tdata[0] == 0
    assert await hist_entry(dut, 1, 0) == p.packets_per_block


@cocotb.test(timeout_time=50, timeout_unit="ms")  # every wait bounded (sim time)
async def drain_right_behind_the_packets(dut):
    """A whole op back to back at full rate, then DRAIN the moment its last beat is in:
    the drain gives every packet as placed (a deadline right behind the last packet)."""
    cfg = bench_config()
    p = NicParams(p=cfg["p"], b=cfg["b"], c=cfg["c"], n_max=cfg["n_max"], lanes=cfg["lanes"])
    tb = AxisTB(dut, seed=8)
    ksink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "k"), dut.clk, dut.rst)
    ksink.log.setLevel(logging.WARNING)
    sdram_clock(dut, cfg)
    dut.cmd_valid.value = 0
    await tb.reset()
    await until_ready(dut)
    rng = np.random.default_rng(9)
    model = GatherBuffer(p, p.packets_for(p.c))
    dut.slot.value, dut.contributors.value = 0, 1
    for i in reversed(range(p.packets_for(p.c))):  # the last in is the first drained
        vals = rng.integers(-(1 << 31), 1 << 31, p.p)
        model.place(i, vals, 1)
        dut.pkt_index.value = i
        await tb.send(pack(vals, 32, p.lanes), first=True)
        await tb.source.wait()
    # SDRAM: how many writes still wait at the DRAIN (a regression check of the order;
    # the fence itself is tested with a stalling port in tests/hw/test_sdram_gather_buffer.py)
    waiting = int(inner(dut, cfg["writes_level"]).value) if "writes_level" in cfg else None
    await command(dut, DRAIN, 0, p.c)
    z = model.z.ravel()
    for j in range(p.padded_len(p.c) // p.b):
        got = await tb.recv()
        np.testing.assert_array_equal(unpack(got.tdata, 32, p.lanes), z[j * p.b : (j + 1) * p.b])
    if waiting is not None:
        assert waiting > 0, "no write was still waiting for the SDRAM at the DRAIN"
