# amaranth: UnusedElaboratable=no
"""Dequantizer RTL against host/model/quantize.py `dequantize` (float32 nearest even)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.quantize import dequantize
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.dequantizer import Dequantizer
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, run_stream
from tests.hw.test_quantizer import beats_of, drive_ops, flat

SMALL = NicParams(p=16, b=64, c=256, n_max=8)


def edge_values(width: int, rng) -> np.ndarray:
    """0, +-1, the extremes, round-to-even ties with even and odd kept parts, all-ones
    patterns (the rounding carries into the exponent), and just-above/below ties."""
    top = (1 << (width - 1)) - 1
    v = [0, 1, -1, 2, 3, -3, 7, top, -top, -(1 << (width - 1)), 1 << 23, (1 << 24) - 1, 1 << 24]
    for length in range(25, width):
        q = int(rng.integers(1 << 23, 1 << 24))
        for kept in (q & ~1, q | 1):  # tie: rounds to the even one of kept, kept + 1
            tie = ((kept << 1) | 1) << (length - 25)
            v += [tie, -tie]
            if length > 25:
                v += [tie + 1, tie - 1]  # just above / below half
        v += [(1 << length) - 1, -((1 << length) - 1)]
    v = np.array(v, dtype=np.int64)
    lo = -(1 << (width - 1))
    return v[(v >= lo) & (v <= top)]


def random_values(width: int, n: int, rng) -> np.ndarray:
    """Uniform in range, and magnitudes of every bit length."""
    lo, hi = -(1 << (width - 1)), 1 << (width - 1)
    a = rng.integers(lo, hi, n // 2)
    bits = rng.integers(0, width, n - n // 2)
    b = rng.integers(0, 1 << 62, n - n // 2) >> (62 - bits)
    return np.concatenate([a, np.where(rng.random(len(b)) < 0.5, -b, b)])


def op_vectors(p: NicParams, width: int, rng) -> list[tuple[np.ndarray, int]]:
    lanes, b = p.lanes, p.b

    def cut(v):
        return v[: len(v) - len(v) % lanes] if len(v) >= lanes else v

    ops = []
    for e in (-128, -127, 127, 0, 90, -60):  # subnormals, overflow, plain
        ops.append((cut(edge_values(width, rng)), e))
    ops.append((random_values(width, b - lanes, rng), -128))
    ops.append((random_values(width, b, rng), 127))
    ops.append((random_values(width, b + lanes, rng), int(rng.integers(-128, 128))))
    ops.append((np.array([-5] * lanes), -128))  # one beat
    return ops


def check_dequantizer(p: NicParams, width: int, ops, *, idle: float, bp: float, seed: int):
    dut = Dequantizer(p, width)
    want = [dequantize(v, e) for v, e in ops]
    run = drive_ops(
        dut,
        [(beats_of(v, p.lanes), {"exponent": e}) for v, e in ops],
        sum(len(v) for v, _ in ops) // p.lanes,
        idle=idle,
        backpressure=bp,
        seed=seed,
        scramble={"exponent": 8},
        read_ports=("saturated",),
    )
    got = flat(run).astype(np.uint32)
    np.testing.assert_equal(got, np.concatenate([w.x.view(np.uint32) for w in want]))
    firsts = [f for v, _ in ops for f in [1] + [0] * (len(v) // p.lanes - 1)]
    assert [f for _, f, _ in run.outputs] == firsts
    assert [la for _, _, la in run.outputs] == [*firsts[1:], 1]
    sat = sum(w.saturated for w in want)
    assert run.ports["saturated"] == sat
    return sat, got


@pytest.mark.parametrize(("width", "lanes"), [(48, 1), (44, 2), (23, 4), (16, 1)])
def test_dequantizer_matches_model_with_idle_and_backpressure(width, lanes):
    p = SMALL.replace(lanes=lanes)
    ops = op_vectors(p, width, np.random.default_rng(width + lanes))
    sat, got = check_dequantizer(p, width, ops, idle=0.3, bp=0.3, seed=width)
    assert sat > 0  # E = 127 overflows
    exp_field = (got >> 23) & 0xFF
    assert np.any((exp_field == 0) & ((got & 0x7FFFFF) != 0))  # subnormals were produced


def test_dequantizer_output_width_of_the_inverse_transform_default_params():
    p = NicParams()
    rng = np.random.default_rng(5)
    v = np.concatenate([edge_values(p.w_inv, rng), random_values(p.w_inv, p.b + 1, rng)])
    check_dequantizer(p, p.w_inv, [(v[: p.b + 1], -40)], idle=0.1, bp=0.1, seed=1)


@pytest.mark.parametrize("lanes", [1, 4])
def test_dequantizer_full_rate_and_latency(lanes):
    p = SMALL.replace(lanes=lanes)
    v = random_values(40, 256, np.random.default_rng(1))
    dut = Dequantizer(p, 40)

    async def setup(ctx):
        ctx.set(dut.exponent, -30)

    run = run_stream(dut, beats_of(v, lanes), 256 // lanes, setup=setup)
    assert run.latency == Dequantizer.LATENCY == 5
    assert run.cycles_per_beat() == 1.0
    np.testing.assert_equal(
        np.array([x for o in run.outputs for x in o[0]], dtype=np.uint32),
        dequantize(v, -30).x.view(np.uint32),
    )


def test_dequantizer_clear_resets_counter():
    dut = Dequantizer(SMALL, 48)
    v = [(1 << 47) - 1, 1, -((1 << 47) - 1)]
    assert dequantize(np.array(v), 127).saturated == 2
    seen = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.exponent, 127)
        for _ in range(2):
            for j, x in enumerate(v):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, element_payload([x], j == 0, j == 2))
                await ctx.tick()
            ctx.set(dut.i.valid, 0)
            await ctx.tick().repeat(Dequantizer.LATENCY + 1)
            seen.append(ctx.get(dut.saturated))
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        seen.append(ctx.get(dut.saturated))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [2, 4, 0]


def test_dequantizer_rejects_too_wide():
    with pytest.raises(ValueError):
        Dequantizer(SMALL, 49)


def test_dequantizer_cocotb_verilator():
    p = SMALL.replace(lanes=2)
    ops = op_vectors(p, 44, np.random.default_rng(33))
    cfg = {
        "width": 44,
        "lanes": 2,
        "ops": [{"v": [int(x) for x in v], "exponent": e} for v, e in ops],
    }
    run_bench(AxisWrapper(Dequantizer(p, 44)), "dequantizer_top",
              f"{__package__}.benches.tb_dequantizer", cfg)  # fmt: skip
