"""cocotb bench of the CSR bank under Verilator: the driver's view over the bus.

Discovery by walking the block chain, every configuration register written and read
back, counter strobes counted, clear. Expected values come from register_map()."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from optireduce.counters import COUNTERS
from optireduce.hw.csr import (
    COUNTER_BASE,
    PEERS_BASE,
    TYPE_COUNTERS,
    TYPE_HOST,
    TYPE_NIC,
    TYPE_PEERS,
    VERSION,
    Csr,
    host_block_base,
    register_map,
    walk,
)
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import bench_config


class Bus:
    def __init__(self, dut) -> None:
        self.dut = dut

    async def write(self, addr: int, value: int) -> None:
        d = self.dut
        d.addr.value, d.w_data.value, d.w_en.value = addr, value, 1
        await RisingEdge(d.clk)
        d.w_en.value = 0

    async def read(self, addr: int) -> int:
        d = self.dut
        d.addr.value, d.r_en.value = addr, 1
        await RisingEdge(d.clk)
        d.r_en.value = 0
        for _ in range(Csr.MAX_READ_CYCLES):  # a counter's read waits for its visit
            await ReadOnly()
            if int(d.r_valid.value):
                value = int(d.r_data.value)
                await RisingEdge(d.clk)
                return value
            await RisingEdge(d.clk)
        raise AssertionError(f"no r_valid for 0x{addr:X} in {Csr.MAX_READ_CYCLES} cycles")


@cocotb.test()
async def driver_view(dut):
    p = NicParams(**bench_config())
    Clock(dut.clk, 8, unit="ns").start()
    for name in ("w_en", "r_en", *(f"inc_{c}" for c in COUNTERS)):
        getattr(dut, name).value = 0
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    bus = Bus(dut)
    image = {}
    for blk in register_map(p):
        for r in blk.regs:
            image[r.offset] = await bus.read(r.offset)
    assert walk(image.__getitem__) == [(0, TYPE_NIC, VERSION), (COUNTER_BASE, TYPE_COUNTERS,
                                                                VERSION),
                                       (PEERS_BASE, TYPE_PEERS, VERSION),
                                       (host_block_base(p), TYPE_HOST, VERSION)]  # fmt: skip
    rng = random.Random(1)
    for r in (r for blk in register_map(p) for r in blk.regs):  # every block's header
        if r.kind in ("param", "header"):
            assert image[r.offset] == r.reset, (r.name, hex(r.offset))
    regs = {r.name: r for blk in register_map(p) for r in blk.regs}
    for r in regs.values():
        if r.kind == "config":
            assert image[r.offset] == r.reset, r.name
            v = rng.getrandbits(32)
            await bus.write(r.offset, v)
            assert await bus.read(r.offset) == v & ((1 << r.width) - 1), r.name
    # counters: random strobe patterns, counted exactly
    counts = dict.fromkeys(COUNTERS, 0)
    for _ in range(200):
        for c in COUNTERS:
            bit = rng.random() < 0.3
            getattr(dut, f"inc_{c}").value = int(bit)
            counts[c] += bit
        await RisingEdge(dut.clk)
    for c in COUNTERS:
        getattr(dut, f"inc_{c}").value = 0
    for c in COUNTERS:
        assert await bus.read(regs[c].offset) == counts[c], c
    await bus.write(regs["ctrl"].offset, 1)
    for c in COUNTERS:
        assert await bus.read(regs[c].offset) == 0, c
