"""litedram's controller, generated for the 5A-75B's SDRAM and started by SdramInit,
under Verilator with litedram's SDRAM model."""

from __future__ import annotations

import math

import pytest
from amaranth.sim import Simulator

from optireduce.hw.sdram_controller import SdramSpec
from optireduce.hw.sdram_init import ACK_TIMEOUT, SdramInit, program
from optireduce.sim import sdram_sim
from optireduce.sim.sdram_gen import generate

SPEC = SdramSpec()
# M12L16161A: 4096 refreshes every 64 ms
T_REFI_S = 64e-3 / 4096


def test_the_init_program_is_litedrams_sequence_then_hardware_control():
    csr = {"sdram_dfii_control": 0x800, "sdram_dfii_pi0_command": 0x804,
           "sdram_dfii_pi0_command_issue": 0x808, "sdram_dfii_pi0_address": 0x80C,
           "sdram_dfii_pi0_baddress": 0x810, "ddrctrl_init_done": 0x0}  # fmt: skip
    steps = [[0, 0, 1, 0x0E, 20000], [0x400, 1, 0, 0x0B, 7]]  # CKE, then precharge all
    assert program(csr, steps) == [
        (0x80C, 0, 0), (0x810, 0, 0), (0x800, 0x0E, 20000),
        (0x80C, 0x400, 0), (0x810, 1, 0), (0x804, 0x0B, 0), (0x808, 1, 7),
        (0x800, 0x01, 0), (0x0, 1, 0),
    ]  # fmt: skip


def test_the_generated_init_is_the_sdr_power_up_sequence():
    # JEDEC SDR power-up, with CL = 2 and burst length 1 (mode register 0x020; bit 8 is
    # litedram's DLL reset), as DFII bits: CS 1, WE 2, CAS 4, RAS 8; control CKE|ODT|RESET_N
    pre, mrs, ref = 0x8 | 0x2 | 0x1, 0x8 | 0x4 | 0x2 | 0x1, 0x8 | 0x4 | 0x1
    for sim in (True, False):
        core = generate(SPEC, sim=sim)
        assert core.cl == 2
        assert core.init == (
            (0, 0, 1, 0x2 | 0x4 | 0x8, 20000),
            (0x400, 0, 0, pre, 0),
            (0x120, 0, 0, mrs, 200),
            (0x400, 0, 0, pre, 0),
            (0, 0, 0, ref, 4),
            (0, 0, 0, ref, 4),
            (0x020, 0, 0, mrs, 200),
        ), sim
        assert (core.addr_width, core.data_width) == (20, 32)  # 1M words of 32 bits: 4 MiB


def _play(writes, ack_after: int | None, cycles: int) -> tuple[list, int, int, list]:
    dut = SdramInit(writes)
    seen: list = []
    flags = {}
    errors: list[int] = []  # error, every cycle

    async def bench(ctx):
        pending = 0
        for _ in range(cycles):
            await ctx.tick()
            req = ctx.get(dut.cyc) and ctx.get(dut.stb)
            ack = req and ack_after is not None and pending >= ack_after
            if ack:
                seen.append(tuple(ctx.get(s) for s in (dut.adr, dut.dat_w, dut.we, dut.sel)))
                pending = 0
            else:
                pending = pending + 1 if req else 0
            ctx.set(dut.ack, int(bool(ack)))
            errors.append(ctx.get(dut.error))
        flags["done"], flags["error"] = ctx.get(dut.done), ctx.get(dut.error)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen, flags["done"], flags["error"], errors


def test_init_writes_every_word_in_order_and_waits_between():
    writes = [(0x80C, 0x400, 0), (0x800, 0x0E, 30), (0x0, 1, 0)]
    seen, done, error, _ = _play(writes, ack_after=1, cycles=60)
    assert seen == [(0x203, 0x400, 1, 0xF), (0x200, 0x0E, 1, 0xF), (0x0, 1, 1, 0xF)]
    assert (done, error) == (1, 0)
    seen, done, error, _ = _play(writes, ack_after=1, cycles=30)  # still in the 30-cycle wait
    assert len(seen) == 2 and (done, error) == (0, 0)
    seen, done, error, _ = _play(writes, ack_after=ACK_TIMEOUT - 2, cycles=4 * ACK_TIMEOUT)
    assert len(seen) == 3 and (done, error) == (1, 0)  # a slow bus is waited for


def test_init_without_an_answer_ends_in_error():
    seen, done, error, errors = _play([(0x800, 1, 0)], ack_after=None, cycles=ACK_TIMEOUT + 10)
    assert (seen, done, error) == ([], 0, 1)
    # the request is up from the first cycle: error only after ACK_TIMEOUT cycles of it
    assert not any(errors[: ACK_TIMEOUT - 1]) and errors[ACK_TIMEOUT + 1]


def test_a_bad_init_write_is_refused():
    for bad in ([], [(0x802, 1, 0)], [(0x800, 1 << 32, 0)], [(0x800, 1, -1)]):
        with pytest.raises(ValueError):
            SdramInit(bad)


def test_data_round_trips_and_a_read_behind_a_write_sees_it():
    sdram_sim.run(SPEC, "data_round_trip", seed=3)  # the bench asserts; a failure raises


@pytest.fixture(scope="module")
def figures():
    return sdram_sim.throughput(SPEC, n=8192, batch=256)


def test_streams_run_near_one_word_per_cycle(figures):
    for kind in ("write", "read"):
        f = figures[kind]
        # at most row changes (every 256 words: precharge + activate) and refreshes
        assert f["words"] <= f["cycles"] <= f["words"] * 1.06, (kind, f)


def test_read_modify_write_costs_two_accesses_and_little_more(figures):
    f = figures["rmw"]
    assert 2 * f["words"] <= f["cycles"] <= 2 * f["words"] * 1.08, f


def test_refresh_keeps_its_interval_under_load(figures):
    clk = SPEC.clk_mhz * 1e6
    for kind in ("write", "read", "rmw"):
        f = figures[kind]
        expect = f["cycles"] / (T_REFI_S * clk)
        assert math.floor(expect) - 1 <= f["refreshes"] <= math.ceil(expect) + 1, (kind, f)
    # the chips' retention: no refresh later than the interval, whatever the traffic (a
    # refresh waits for the banks to close: a few tens of cycles)
    t_refi = T_REFI_S * clk
    gaps = figures["refresh_gap_cycles"]
    assert gaps["n"] >= 25 and t_refi - 40 <= gaps["min"] <= gaps["max"] <= t_refi + 40, gaps
