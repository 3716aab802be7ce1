"""The crossings between sync (125 MHz) and core (hw/clock_crossing.py), in amaranth.sim
with both clocks running at unrelated periods: streams arrive whole and in order under
random stalls on both sides; every register access crosses to a real Csr bank and
comes back with the value its register map says."""

from __future__ import annotations

import random

import pytest
from amaranth import DomainRenamer

from optireduce.hw.clock_crossing import (
    CsrCrossing,
    HandshakeCrossing,
    StreamCrossing,
    csr_bus,
)
from optireduce.hw.csr import Csr, register_map
from optireduce.hw.streams import frame_layout
from optireduce.params import NicParams
from optireduce.sim.stream_sim import two_clock_sim


def _every_beat_in_order(dut, w_domain: str, r_domain: str, n: int) -> None:
    """n random frame beats through `dut` (i in w_domain, o in r_domain) under random gaps
    and stalls: all arrive, once each, in order."""
    rng = random.Random(7)
    beats = [(rng.getrandbits(64), rng.getrandbits(8), rng.random() < 0.2) for _ in range(n)]
    sim = two_clock_sim(dut)
    got = []

    async def producer(ctx):
        for data, keep, last in beats:
            while rng.random() < 0.3:  # gaps
                ctx.set(dut.i.valid, 0)
                await ctx.tick(w_domain)
            ctx.set(dut.i.payload, {"data": [(data >> 8 * k) & 0xFF for k in range(8)],
                                    "keep": keep, "last": last})  # fmt: skip
            ctx.set(dut.i.valid, 1)
            await ctx.tick(w_domain).until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        for _ in range(20000):
            ready = rng.random() < 0.6
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-12)  # the FIFO's outputs settle on this cycle's inputs
            if ready and ctx.get(dut.o.valid):
                pl = ctx.get(dut.o.payload)
                data = sum(b << 8 * k for k, b in enumerate(pl.data))
                got.append((data, pl.keep, bool(pl.last)))
            await ctx.tick(r_domain)
            if len(got) == len(beats):
                return
        raise AssertionError(f"{len(got)} of {len(beats)} beats crossed")

    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    assert got == beats


@pytest.mark.parametrize("skid_domains", [None, ("sync",)])  # both sides; the shell's
@pytest.mark.parametrize("w_domain, r_domain", [("sync", "core"), ("core", "sync")])
def test_stream_crossing_keeps_every_beat_in_order(w_domain, r_domain, skid_domains):
    dut = StreamCrossing(frame_layout(8), w_domain=w_domain, r_domain=r_domain, depth=8,
                         skid_domains=skid_domains)  # fmt: skip
    _every_beat_in_order(dut, w_domain, r_domain, 300)


@pytest.mark.parametrize("w_domain, r_domain", [("sync", "core"), ("core", "sync")])
def test_handshake_crossing_keeps_every_beat_in_order(w_domain, r_domain):
    dut = HandshakeCrossing(frame_layout(8), w_domain=w_domain, r_domain=r_domain)
    _every_beat_in_order(dut, w_domain, r_domain, 150)


def test_csr_crossing_reaches_the_bank_and_returns_each_access():
    """Writes and reads through the crossing to a Csr in `core`: a read returns the
    register map's reset value, or the last value written (masked to the register's
    width), a counter the count its strobes made (each counter a different one, so a
    read answered early or for another counter is wrong); write-only, read-only and
    unmapped addresses behave as the map says; every access comes back exactly once."""
    p = NicParams(n_max=8, p=16, b=64, c=256)
    regs = [r for blk in register_map(p) for r in blk.regs]
    csr = Csr(p)
    x = CsrCrossing(csr.addr_bits)

    def bank_in_core(top):
        top.submodules.csr = DomainRenamer("core")(csr)
        top.d.comb += [*csr_bus(x, csr), x.csr_r_valid.eq(csr.r_valid)]

    rng = random.Random(3)
    config = [r for r in regs if r.kind == "config"]
    expect = {r.offset: r.reset for r in regs if r.access != "WO"}
    by_offset = {r.offset: r for r in regs}
    accesses = []
    for _ in range(60):
        r = rng.choice(regs)
        if rng.random() < 0.5 and r.kind == "config":
            accesses.append((r.offset, rng.getrandbits(32)))
        elif rng.random() < 0.1:
            accesses.append((0xFC, None))  # unmapped: reads 0
        else:
            accesses.append((r.offset, None))
    accesses += [(config[0].offset, 0xFFFFFFFF), (config[0].offset, None)]
    counters = [r for r in regs if r.kind == "counter"]
    counts = {r.offset: 3 + k for k, r in enumerate(counters)}  # strobe cycles
    expect.update(counts)
    accesses += [(r.offset, None) for r in rng.sample(counters, 12)]
    rng.shuffle(accesses)
    got, want = [], []
    counted = []

    async def strobes(ctx):  # in core: each counter strobed its own number of cycles
        for cycle in range(max(counts.values())):
            for r in counters:
                ctx.set(getattr(csr, f"inc_{r.name}"), int(cycle < counts[r.offset]))
            await ctx.tick("core")
        for r in counters:
            ctx.set(getattr(csr, f"inc_{r.name}"), 0)
        await ctx.tick("core").repeat(2)
        counted.append(True)

    async def host(ctx):
        while not counted:
            await ctx.tick()
        for addr, value in accesses:
            ctx.set(x.addr, addr)
            ctx.set(x.w_data, value or 0)
            ctx.set(x.w_en, value is not None)
            ctx.set(x.r_en, value is None)
            await ctx.tick()
            ctx.set(x.w_en, 0)
            ctx.set(x.r_en, 0)
            for _ in range(40 + 4 * Csr.MAX_READ_CYCLES):  # a counter waits for its visit
                if ctx.get(x.done):
                    break
                await ctx.tick()
            else:
                raise AssertionError(f"access to {addr:#x} did not come back")
            got.append(ctx.get(x.r_data))
            for _ in range(3 * Csr.MAX_READ_CYCLES):  # and no second answer
                await ctx.tick()
                assert not ctx.get(x.done), f"access to {addr:#x} came back twice"
            if value is not None:
                r = by_offset[addr]
                if r.access == "RW":
                    expect[addr] = value & ((1 << r.width) - 1)
                want.append(0)
            else:
                want.append(expect.get(addr, 0))

    sim = two_clock_sim(x, bank_in_core)
    sim.add_testbench(strobes)
    sim.add_testbench(host)
    sim.run()
    assert got == want
    assert any(w not in (0,) for w in want)  # the reads saw real register values
    assert sum(a in counts and v is None for a, v in accesses) >= 12
