"""Csr: register bus, configuration ports, saturating counters, discovery, docs/registers.md."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from amaranth import ResetInserter, Signal
from amaranth.back import rtlil
from amaranth.sim import Simulator

from optireduce.hw.csr import (
    ALL_COUNTERS,
    COUNTER_BASE,
    HOST_COUNTERS,
    PEERS_BASE,
    TYPE_COUNTERS,
    TYPE_HOST,
    TYPE_NIC,
    TYPE_PEERS,
    VERSION,
    Csr,
    counter_step,
    host_block_base,
    register,
    register_map,
    render_markdown,
    walk,
)
from optireduce.params import NicParams
from optireduce.ubt import DEFAULT_ADDRESSING, DROP_REASONS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "registers.md"
TOP = (1 << 32) - 1


def simulate(dut: Csr, bench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def write(ctx, dut: Csr, offset: int, value: int) -> None:
    ctx.set(dut.addr, offset)
    ctx.set(dut.w_data, value)
    ctx.set(dut.w_en, 1)
    await ctx.tick()
    ctx.set(dut.w_en, 0)


async def read(ctx, dut: Csr, offset: int) -> int:
    ctx.set(dut.addr, offset)
    ctx.set(dut.r_en, 1)
    await ctx.tick()
    ctx.set(dut.r_en, 0)
    for _ in range(Csr.MAX_READ_CYCLES):  # a counter's read waits for its visit
        if ctx.get(dut.r_valid):
            return ctx.get(dut.r_data)
        await ctx.tick()
    raise AssertionError(f"no r_valid for 0x{offset:X} in {Csr.MAX_READ_CYCLES} cycles")


def test_docs_registers_md_is_the_rendered_map():
    assert DOCS.read_text() == render_markdown(NicParams())


# Addresses a driver hard-codes, written by hand from the published map (docs/registers.md
# as released): moving or renaming one of them breaks drivers, so it must fail here.
# offset: (name, access, width, reset at the default NicParams)
PUBLISHED = {
    0x000: ("type", "RO", 32, TYPE_NIC),
    0x008: ("next", "RO", 32, 0x100),
    0x00C: ("ctrl", "WO", 1, 0),
    0x010: ("param_p", "RO", 32, 256),
    0x018: ("param_c", "RO", 32, 16_384),
    0x040: ("rank", "RW", 6, 0),
    0x044: ("world", "RW", 7, 2),
    0x048: ("job_id", "RO", 16, 1),  # the build's (BUILD_VALUES)
    0x050: ("t_b_us", "RW", 28, 20_000),  # 32 until the tick clock wrapped (t_B < 2^28)
    0x058: ("seed", "RW", 32, 0x5EED0001),
    0x100: ("type", "RO", 32, TYPE_COUNTERS),
    0x108: ("next", "RO", 32, 0x200),
    0x10C: ("count", "RO", 32, 37),
    0x110: ("truncated", "RO", 32, 0),
    0x140: ("wrong_job", "RO", 32, 0),
    0x168: ("duplicate", "RO", 32, 0),
    0x16C: ("rx_scatter", "RO", 32, 0),
    0x170: ("rx_gather", "RO", 32, 0),
    0x174: ("tx_scatter", "RO", 32, 0),
    0x178: ("tx_gather", "RO", 32, 0),
    0x180: ("ops_completed", "RO", 32, 0),
    0x184: ("exp_given", "RO", 32, 0),
    0x194: ("exp_missing", "RO", 32, 0),
    0x198: ("exp_saturated", "RO", 32, 0),
    0x19C: ("not_member", "RO", 32, 0),
    0x1A0: ("wrong_sender", "RO", 32, 0),
    0x200: ("type", "RO", 32, TYPE_PEERS),
    0x208: ("next", "RO", 32, 0x500),  # after 64 peers: 0x210 + 64 * 8, to 256 bytes
    0x20C: ("admit", "RW", 1, 0),
    0x210: ("peer_ip0", "RW", 32, 0xC6120001),
    0x214: ("peer_port0", "RW", 16, 17017),
    0x218: ("peer_ip1", "RW", 32, 0xC6120002),
    0x500: ("type", "RO", 32, TYPE_HOST),
    0x508: ("next", "RO", 32, 0),
    0x50C: ("count", "RO", 32, 11),
    0x510: ("adapter_rx_frames", "RO", 32, 0),
    0x520: ("adapter_drop_bad_length", "RO", 32, 0),
    0x538: ("adapter_bad_records", "RO", 32, 0),
}


def test_table_is_consistent():
    blocks = register_map(NicParams())
    regs = [r for b in blocks for r in b.regs]
    offsets = [r.offset for r in regs]
    assert len(set(offsets)) == len(offsets) and all(o % 4 == 0 for o in offsets)
    at = {r.offset: (r.name, r.access, r.width, r.reset) for r in regs}
    for offset, want in PUBLISHED.items():
        assert at.get(offset) == want, hex(offset)
    counters = [r for r in regs if r.kind == "counter"]
    assert counters[-1].offset == 0x1A0 and len(counters) == 37  # the count register's value
    # every drop reason the wire spec names has a counter, named as the reason
    assert set(DROP_REASONS) <= {r.name for r in counters}


@pytest.mark.parametrize(
    "p", [NicParams(), NicParams(p=16, b=64, c=256, n_max=8, job_id=7, estimator="plain")]
)
def test_reset_discovery_and_read_only(p):
    """After reset: discovery walks the four blocks, RO registers hold the table, config ports
    hold NicParams' values; writes to RO and unmapped addresses change nothing."""
    dut = Csr(p)
    regs = [r for b in register_map(p) for r in b.regs]
    span = max(r.offset for r in regs) + 8

    async def bench(ctx):
        image = {a: await read(ctx, dut, a) for a in range(0, span, 4)}
        assert walk(image.__getitem__) == [
            (0, TYPE_NIC, VERSION),
            (COUNTER_BASE, TYPE_COUNTERS, VERSION),
            (PEERS_BASE, TYPE_PEERS, VERSION),
            (host_block_base(p), TYPE_HOST, VERSION),  # the header here, its counters 0
        ]
        for r in regs:
            assert image[r.offset] == (0 if r.access == "WO" else r.reset), r.name
        mapped = {r.offset for r in regs}
        assert all(v == 0 for a, v in image.items() if a not in mapped)
        assert ctx.get(dut.rank) == 0 and ctx.get(dut.world) == 2
        assert ctx.get(dut.t_b_us) == p.t_b_us and ctx.get(dut.alpha_q8) == p.alpha_q8
        assert ctx.get(dut.seed) == p.seed
        # the build's values read back (writes below change nothing)
        assert image[register(p, "job_id").offset] == p.job_id
        assert image[register(p, "udp_port").offset] == p.udp_port
        assert image[register(p, "estimator").offset] == (p.estimator == "plain")
        mac = image[register(p, "mac_base_lo").offset]
        mac |= image[register(p, "mac_base_hi").offset] << 32
        assert mac == DEFAULT_ADDRESSING.mac_base
        assert image[register(p, "ip_base").offset] == DEFAULT_ADDRESSING.ip_base
        for r in regs:  # writes to read-only registers are ignored
            if r.access == "RO":
                await write(ctx, dut, r.offset, 0xDEAD_BEEF)
        for a in range(0, span, 4):
            if a not in mapped:
                await write(ctx, dut, a, 0xFFFF_FFFF)
        for r in regs:
            if r.access == "RO":
                assert await read(ctx, dut, r.offset) == r.reset, r.name

    simulate(dut, bench)


def test_every_config_register_write_read():
    p = NicParams()
    dut = Csr(p)
    cfg = [r for b in register_map(p) for r in b.regs if r.kind == "config"]
    rng = random.Random(4)

    async def bench(ctx):
        for value_of in (lambda w: (1 << w) - 1, lambda w: 0, lambda w: rng.getrandbits(32)):
            written = {}
            for r in cfg:
                v = value_of(r.width) | (rng.getrandbits(32) << r.width)  # high bits dropped
                await write(ctx, dut, r.offset, v & TOP)
                written[r.name] = v & ((1 << r.width) - 1)
            for r in cfg:
                assert await read(ctx, dut, r.offset) == written[r.name], r.name
            ports: dict[str, int] = {}
            for r in cfg:
                ports[r.port] = ports.get(r.port, 0) | written[r.name] << r.lsb
            for port, v in ports.items():
                assert ctx.get(getattr(dut, port)) == v, port
        # the bus read is registered: r_data holds until the next r_en
        v = await read(ctx, dut, cfg[0].offset)
        ctx.set(dut.addr, cfg[1].offset)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.r_data) == v

    simulate(dut, bench)


def test_a_reset_after_writes_reads_the_reset_values():
    """The bank reads its registers from a RAM image that a reset does not clear: after a
    reset, every register reads its reset value again; then the ones written since read
    their new values, the others still their reset values."""
    p = NicParams(n_max=8)
    rst = Signal()
    dut = Csr(p)
    cfg = [r for b in register_map(p) for r in b.regs if r.kind == "config"]
    mask = {r.name: (1 << r.width) - 1 for r in cfg}
    rng = random.Random(7)

    async def bench(ctx):
        for r in cfg:
            await write(ctx, dut, r.offset, rng.getrandbits(32))
        ctx.set(rst, 1)
        await ctx.tick()
        ctx.set(rst, 0)
        for r in cfg:
            assert await read(ctx, dut, r.offset) == r.reset, r.name
        again = {r.name: rng.getrandbits(32) for r in cfg[::2]}
        for r in cfg[::2]:
            await write(ctx, dut, r.offset, again[r.name])
        for r in cfg:
            want = again[r.name] & mask[r.name] if r.name in again else r.reset
            assert await read(ctx, dut, r.offset) == want, r.name

    sim = Simulator(ResetInserter(rst)(dut))
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_counters_count_saturate_and_clear():
    """Random strobes on every counter (several at once; the host block's too), counts
    read back over the bus; a counter preloaded near 2^32 stops at 2^32 - 1; a clear
    keeps a same-cycle event."""
    p = NicParams(p=16, b=64, c=256, n_max=8)
    dut = Csr(p)
    regs = [r for b in register_map(p) for r in b.regs]
    offs = {r.port: r.offset for r in regs if r.kind == "counter"}
    offs |= {r.name: r.offset for r in regs if r.kind == "adapter"}  # the host block's
    counted = (*ALL_COUNTERS, *HOST_COUNTERS)
    ctrl = next(r.offset for r in register_map(p)[0].regs if r.kind == "ctrl")
    rng = np.random.default_rng(6)

    async def bench(ctx):
        expect = dict.fromkeys(counted, 0)
        strobes = rng.random((300, len(counted))) < rng.random(len(counted))
        for row in strobes:
            for name, s in zip(counted, row, strict=True):
                v = int(s) * int(rng.integers(1, counter_step(p, name) + 1))
                ctx.set(getattr(dut, f"inc_{name}"), v)
                expect[name] += v
            await ctx.tick()
        for name in counted:
            ctx.set(getattr(dut, f"inc_{name}"), 0)
        for name in counted:
            assert await read(ctx, dut, offs[name]) == expect[name], name
        assert max(expect.values()) > 200 and min(expect.values()) >= 0
        assert expect["exp_missing"] > sum(strobes[:, ALL_COUNTERS.index("exp_missing")])

        # a counter that adds several at once saturates too (the carry out)
        ctx.set(dut.store.data[ALL_COUNTERS.index("exp_missing")], TOP - 3)
        ctx.set(dut.inc_exp_missing, counter_step(p, "exp_missing"))
        await ctx.tick()
        ctx.set(dut.inc_exp_missing, 0)
        assert await read(ctx, dut, offs["exp_missing"]) == TOP

        # saturation: never wraps
        sat = "duplicate"
        ctx.set(dut.store.data[ALL_COUNTERS.index(sat)], TOP - 2)
        ctx.set(getattr(dut, f"inc_{sat}"), 1)
        await ctx.tick().repeat(5)
        ctx.set(getattr(dut, f"inc_{sat}"), 0)
        assert await read(ctx, dut, offs[sat]) == TOP
        assert await read(ctx, dut, offs["late"]) == expect["late"]  # neighbours untouched

        # clear: every counter to 0, except an increment in the clear cycle counts 1
        ctx.set(dut.inc_rx_gather, 1)
        await write(ctx, dut, ctrl, 0x2)  # bit 0 clear: not a clear
        ctx.set(dut.inc_rx_gather, 0)
        assert await read(ctx, dut, offs["rx_gather"]) == expect["rx_gather"] + 1
        ctx.set(dut.inc_stale_op, 1)
        ctx.set(dut.inc_adapter_tx_frames, 1)
        await write(ctx, dut, ctrl, 0x1)
        ctx.set(dut.inc_stale_op, 0)
        ctx.set(dut.inc_adapter_tx_frames, 0)
        for name in counted:
            kept = name in ("stale_op", "adapter_tx_frames")
            assert await read(ctx, dut, offs[name]) == kept, name
        assert await read(ctx, dut, ctrl) == 0

    simulate(dut, bench)


def test_counters_read_while_counting_and_clearing():
    """After a reset the counters read 0 whatever their RAM held. Then they are read back
    one after another under a random strobe pattern, with clears at random moments (also
    while a read waits), near-saturated starts, bursts on one counter and reads that
    replace a waiting one: each read's value, when `r_valid` says it is there, is the sum of
    the increments of the cycles before that since the last clear, saturated (summed
    here), and no read waits longer than Csr.MAX_READ_CYCLES."""
    p = NicParams(p=16, b=64, c=256, n_max=64)  # exp_missing adds up to 63 a cycle
    dut = Csr(p)
    regs = [r for b in register_map(p) for r in b.regs]
    offs = [r.offset for r in regs if r.kind == "counter"]
    offs += [r.offset for r in regs if r.kind == "adapter"]  # the host block's, stored after
    counted = (*ALL_COUNTERS, *HOST_COUNTERS)
    ctrl = next(r.offset for r in register_map(p)[0].regs if r.kind == "ctrl")
    cfg = next(r for r in regs if r.kind == "config" and r.reset != 0)
    rng = np.random.default_rng(11)
    n = len(counted)
    steps = [counter_step(p, name) if name in ALL_COUNTERS else 1 for name in counted]

    async def bench(ctx):
        # the counter RAM has no reset: what it held before reads as 0 after one
        for j in range(n):
            ctx.set(dut.store.data[j], 0xDEAD_0000 + j)
        for j in range(0, n, 5):
            assert await read(ctx, dut, offs[j]) == 0, counted[j]
        await ctx.tick().repeat(n)
        start = {j: TOP - int(rng.integers(0, 60)) for j in rng.choice(n, 6, replace=False)}
        for j, v in start.items():
            ctx.set(dut.store.data[j], v)
        expect = [start.get(j, 0) for j in range(n)]
        clears = saturated = reads = replaced = slowest = 0
        inflight, age, plain_due, plains, rest = None, 0, False, 0, 0
        for cycle in range(8000):
            burst = int(rng.integers(n)) if cycle % 200 < 60 else None  # one counter, every cycle
            incs = [
                int(rng.integers(1, steps[j] + 1)) if j == burst or rng.random() < 0.15 else 0
                for j in range(n)
            ]
            for j, name in enumerate(counted):
                ctx.set(getattr(dut, f"inc_{name}"), incs[j])
            # the near-saturated ones half the time, until the clears begin
            near = cycle < 2000 and rng.random() < 0.5
            j = int(rng.choice(list(start))) if near else int(rng.integers(n))
            clear = cycle > 2000 and rng.random() < 0.01
            # (after a plain read the bus may rest: no counter read follows at once)
            issue = not clear and cycle >= rest and (inflight is None or rng.random() < 0.02)
            plain = issue and rng.random() < 0.1  # a register, not a counter: one cycle
            ctx.set(dut.addr, ctrl if clear else (cfg.offset if plain else offs[j]))
            ctx.set(dut.w_data, 1)
            ctx.set(dut.w_en, int(clear))
            ctx.set(dut.r_en, int(issue))
            if issue:
                replaced += inflight is not None
                inflight, age = (None if plain else j), 0
                plain_due = plain
            await ctx.tick()
            age += 1
            if plain_due:
                assert ctx.get(dut.r_valid) and ctx.get(dut.r_data) == cfg.reset, cycle
                plain_due, plains = False, plains + 1
                rest = cycle + int(rng.integers(0, 2 * n))
            elif ctx.get(dut.r_valid):
                assert inflight is not None, cycle
                want = min(expect[inflight], TOP)
                assert ctx.get(dut.r_data) == want, (cycle, counted[inflight])
                saturated += expect[inflight] >= TOP
                reads += 1
                slowest = max(slowest, age)
                inflight = None
            assert age <= Csr.MAX_READ_CYCLES or inflight is None, (cycle, age)
            if clear:
                clears += 1
                expect = [0] * n
            expect = [e + i for e, i in zip(expect, incs, strict=True)]
        assert clears >= 10 and saturated >= 10 and replaced >= 10 and reads >= 150
        assert plains >= 10
        assert slowest >= Csr.MAX_READ_CYCLES - 3  # a whole round is waited, not only bounded

    simulate(dut, bench)


def test_the_bank_elaborates_more_than_once():
    """Its counter RAM is made at elaboration, so one instance converts twice alike."""
    dut = Csr(NicParams(n_max=8))
    first = rtlil.convert(dut, ports=None)
    assert rtlil.convert(dut, ports=None) == first and "store" in first


def test_cocotb_verilator_driver_view():
    from optireduce.sim.cocotb_run import run_bench

    p = NicParams(n_max=8)
    run_bench(Csr(p), "csr_n8", f"{__package__}.benches.tb_csr", {"n_max": 8})
