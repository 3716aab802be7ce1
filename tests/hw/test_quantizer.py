# amaranth: UnusedElaboratable=no
"""Quantizer RTL against host/model/quantize.py `quantize` (+ the zero padding of codec.encode)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.quantize import propose_exponent, quantize
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.quantizer import Quantizer
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import OpsRun, element_payload, run_stream
from optireduce.sim.stream_sim import run_ops as drive_ops

SMALL = NicParams(p=16, b=64, c=256, n_max=8)  # w_in = 26

# float32 specials and boundaries, as bit patterns
EDGE_BITS = [
    0x00000000, 0x80000000,  # +-0
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,  # smallest, largest subnormal
    0x00800000, 0x80800000,  # smallest normal
    0x7F7FFFFF, 0xFF7FFFFF,  # largest normal
    0x7F800000, 0xFF800000,  # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF,  # NaNs (quiet, signalling, all ones)
    0x3F800000, 0xBF800000, 0x3F000000, 0xBF000000,  # +-1, +-0.5
]  # fmt: skip


# --- a test driver shared by the converter and sign tests ---------------------------------


def beats_of(values, lanes: int) -> list[dict]:
    """Payloads of one op: `values` in beats of `lanes`, first and last marked."""
    v = [int(x) for x in np.asarray(values).ravel()]
    n = len(v) // lanes
    return [element_payload(v[j * lanes : (j + 1) * lanes], j == 0, j == n - 1) for j in range(n)]


def flat(run: OpsRun) -> np.ndarray:
    return np.array([x for d, _, _ in run.outputs for x in d], dtype=np.int64)


# --- vectors -------------------------------------------------------------------------------


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)


def ties(e: int, p: NicParams, rng) -> np.ndarray:
    """Values exactly halfway between two quantization steps at exponent e (and around
    q_max), where that is a float32; both signs."""
    j = np.concatenate([np.arange(4), rng.integers(0, p.q_max, 12), [p.q_max - 1, p.q_max]])
    x = (j.astype(np.float64) + 0.5) * 2.0**e
    x = np.concatenate([x, -x])
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
    return f32_bits(f[np.isfinite(f) & (f.astype(np.float64) == x)])


def gradient_like(rng, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * np.exp(rng.uniform(-12, 6, n))).astype(np.float32)


def op_vectors(p: NicParams, lanes: int, rng) -> list[tuple[np.ndarray, int]]:
    """(float32 bit patterns, exponent) per op: edges, ties, random bits, exponents at the
    int8 ends, and lengths 1 beat, b - 1 beat, b, b + 1 beat."""
    b = p.b
    ops = []
    for e in (-128, 127, 0, -20):
        bits = np.concatenate([EDGE_BITS, ties(e, p, rng)])
        ops.append((bits, e))
    ops.append((rng.integers(0, 1 << 32, b - lanes), -128))  # any pattern, tiny step
    ops.append((rng.integers(0, 1 << 32, b), 127))  # any pattern, huge step
    g = gradient_like(rng, b + lanes)
    ops.append((f32_bits(g), propose_exponent(g, p)))
    g = gradient_like(rng, b)
    ops.append((f32_bits(g), propose_exponent(g, p) - 3))  # some saturate
    ops.append((f32_bits([rng.standard_normal()] * lanes), 0))  # one beat
    out = []
    for bits, e in ops:
        bits = np.asarray(bits, dtype=np.int64)
        bits = bits[: len(bits) - len(bits) % lanes] if len(bits) >= lanes else bits
        out.append((bits, int(e)))
    return out


def model_stream(ops, p: NicParams) -> tuple[np.ndarray, list[int], list[int], int, int]:
    """Expected elements, first/last flags per beat and counters of a run of ops."""
    vals, firsts, lasts, sat, nf = [], [], [], 0, 0
    for bits, e in ops:
        x = np.asarray(bits, dtype=np.uint32).view(np.float32)
        r = quantize(x, e, p)
        q = np.zeros(p.padded_len(len(x)), dtype=np.int64)
        q[: len(x)] = r.q
        nbeats = len(q) // p.lanes
        vals.append(q)
        firsts += [1] + [0] * (nbeats - 1)
        lasts += [0] * (nbeats - 1) + [1]
        sat, nf = sat + r.saturated, nf + r.nonfinite
    return np.concatenate(vals), firsts, lasts, sat, nf


def check_quantizer(p: NicParams, ops, *, idle: float, backpressure: float, seed: int) -> None:
    dut = Quantizer(p)
    want, firsts, lasts, sat, nf = model_stream(ops, p)
    run = drive_ops(
        dut,
        [(beats_of(bits, p.lanes), {"exponent": e}) for bits, e in ops],
        len(firsts),
        idle=idle,
        backpressure=backpressure,
        seed=seed,
        scramble={"exponent": 8},
        read_ports=("saturated", "nonfinite"),
    )
    np.testing.assert_equal(flat(run), want)
    assert [f for _, f, _ in run.outputs] == firsts
    assert [la for _, _, la in run.outputs] == lasts
    assert (run.ports["saturated"], run.ports["nonfinite"]) == (sat, nf)
    assert sat > 0 and nf > 0  # the vectors do exercise both counters


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_quantizer_matches_model_with_idle_and_backpressure(lanes):
    p = SMALL.replace(lanes=lanes)
    ops = op_vectors(p, lanes, np.random.default_rng(lanes))
    check_quantizer(p, ops, idle=0.3, backpressure=0.3, seed=lanes)


def test_quantizer_narrow_input_width_rounds_and_saturates_on_right_shifts():
    # w_in = 22 < 24: a float's mantissa can overflow q_max even when it is shifted right,
    # and ties up to q_max are exact float32 values.
    p = NicParams(p=16, b=1024, c=1024, n_max=8, headroom_bits=10)
    assert p.w_in == 22
    rng = np.random.default_rng(7)
    ops = []
    for e in (-23, -3, 0):
        g = gradient_like(rng, 200)
        ops.append((np.concatenate([EDGE_BITS, ties(e, p, rng), f32_bits(g)]), e))
    check_quantizer(p, ops, idle=0.2, backpressure=0.2, seed=5)


def test_quantizer_default_params_b_plus_one():
    p = NicParams()
    rng = np.random.default_rng(11)
    g = gradient_like(rng, p.b + 1)
    bits = np.concatenate([f32_bits(g[:-40]), EDGE_BITS, ties(-20, p, rng)])[: p.b + 1]
    check_quantizer(p, [(bits, propose_exponent(g, p))], idle=0.1, backpressure=0.1, seed=2)


@pytest.mark.parametrize("lanes", [1, 4])
def test_quantizer_full_rate_latency_and_padding(lanes):
    p = SMALL.replace(lanes=lanes)
    rng = np.random.default_rng(3)
    lengths = [p.b - lanes, p.b, lanes]
    pl = [b for n in lengths for b in beats_of(f32_bits(gradient_like(rng, n)), lanes)]
    n_out = sum(p.padded_len(n) for n in lengths) // lanes

    async def setup(ctx):
        ctx.set(dut.exponent, -10)

    dut = Quantizer(p)
    run = run_stream(dut, pl, n_out, setup=setup)
    assert run.latency == Quantizer.LATENCY == 5
    # no bubble anywhere, padding beats included
    assert run.out_cycles == list(range(run.out_cycles[0], run.out_cycles[0] + n_out))
    lasts = [i for i, o in enumerate(run.outputs) if o[2]]
    assert lasts == [p.b // lanes - 1, 2 * p.b // lanes - 1, 3 * p.b // lanes - 1]


def test_quantizer_clear_resets_counters():
    p = SMALL
    dut = Quantizer(p)
    x = f32_bits([np.inf, np.nan, 1e30, 1.0])
    want = quantize(x.astype(np.uint32).view(np.float32), 0, p)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for rep in range(2):
            for j, b in enumerate(x):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.exponent, 0)
                ctx.set(dut.i.payload, element_payload([int(b)], j == 0, j == len(x) - 1))
                await ctx.tick()
            ctx.set(dut.i.valid, 0)
            while not (ctx.get(dut.o.valid) and ctx.get(dut.o.payload.last)):
                await ctx.tick()
            await ctx.tick()
            seen[rep] = (ctx.get(dut.saturated), ctx.get(dut.nonfinite))
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
        seen["cleared"] = (ctx.get(dut.saturated), ctx.get(dut.nonfinite))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    one = (want.saturated, want.nonfinite)
    assert one == (2, 2)
    assert seen == {0: one, 1: one, "cleared": (0, 0)}


def test_quantizer_rejects_unsupported_lanes():
    with pytest.raises(ValueError):
        Quantizer(SMALL.replace(lanes=8))


def test_quantizer_cocotb_verilator():
    p = SMALL.replace(lanes=2)
    ops = op_vectors(p, 2, np.random.default_rng(21))
    cfg = {
        "params": {"p": p.p, "b": p.b, "c": p.c, "n_max": p.n_max, "lanes": p.lanes},
        "ops": [{"bits": [int(b) for b in bits], "exponent": e} for bits, e in ops],
    }
    run_bench(AxisWrapper(Quantizer(p)), "quantizer_top", f"{__package__}.benches.tb_quantizer",
              cfg)  # fmt: skip
