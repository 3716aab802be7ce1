"""Saturate (hw/saturate.py) against host/model/codec.py: saturate, bit for bit, and its counter."""

import random

import numpy as np
import pytest

from optireduce.host.model.codec import saturate
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.saturate import Saturate
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, run_stream, simulate


def small(lanes: int = 1) -> NicParams:
    return NicParams(p=16, b=64, c=256, n_max=8, lanes=lanes)


def edge_values(width_in: int, limit_bits: int) -> np.ndarray:
    lim = (1 << (limit_bits - 1)) - 1
    top = (1 << (width_in - 1)) - 1
    v = [0, 1, -1, lim, -lim, lim - 1, -lim + 1, top, -top, -top - 1]
    if width_in > limit_bits:
        v += [lim + 1, -lim - 1, lim + 2, -lim - 2]
    else:  # same width: only the most negative code is out of the symmetric range
        v += [-lim - 1]
    return np.array(v, dtype=np.int64)


def make_ops(rng, width_in: int, limit_bits: int, lanes: int) -> list[np.ndarray]:
    """Ops of whole beats: edges, random over the input range, random near the limit, zeros."""
    lim = (1 << (limit_bits - 1)) - 1
    lo, hi = -(1 << (width_in - 1)), (1 << (width_in - 1)) - 1
    edges = edge_values(width_in, limit_bits)
    near = rng.integers(max(lo, -2 * lim), min(hi, 2 * lim) + 1, 40)
    ops = [
        edges,
        rng.integers(lo, hi + 1, 50),
        near,
        np.zeros(6, dtype=np.int64),
        np.array([lim + 1 if width_in > limit_bits else lo] * lanes),  # a single beat
    ]
    return [np.resize(x, -(-len(x) // lanes) * lanes) for x in ops]


def run_ops(dut, ops, lanes, idle, bp, seed):
    """Drive ops back to back; return (outputs, count sampled on each op's last beat)."""
    beats = []
    for x in ops:
        b = x.reshape(-1, lanes)
        beats += [element_payload(v, k == 0, k == len(b) - 1) for k, v in enumerate(b)]
    outs, counts = [], []
    rng_i, rng_o = random.Random(seed), random.Random(seed + 1)

    async def bench(ctx):
        k = 0
        for _ in range(20 * len(beats) + 100):
            if k >= len(beats) and len(counts) == len(ops):
                return
            offer = k < len(beats) and rng_i.random() >= idle
            ctx.set(dut.i.valid, offer)
            if offer:
                ctx.set(dut.i.payload, beats[k])
            ready = rng_o.random() >= bp
            ctx.set(dut.o.ready, ready)
            if offer and ctx.get(dut.i.ready):
                k += 1
            if ready and ctx.get(dut.o.valid):
                pl = ctx.get(dut.o.payload)
                outs.append(([int(v) for v in pl.data], int(pl.first), int(pl.last)))
                if pl.last:  # the op's whole count is in once its last beat is in `o`
                    counts.append(ctx.get(dut.count))
            await ctx.tick()
        raise TimeoutError(f"{k}/{len(beats)} beats in, {len(outs)} out")

    simulate(dut, bench)
    assert [o[1] for o in outs] == [b["first"] for b in beats]
    assert [o[2] for o in outs] == [b["last"] for b in beats]
    return np.array([o[0] for o in outs], dtype=np.int64).ravel(), counts


@pytest.mark.parametrize(
    ("lanes", "width_in", "limit_bits", "idle", "bp"),
    [
        (1, 35, 32, 0.3, 0.3),  # forward: w_fwd -> w_wire at the default b
        (2, 44, 32, 0.5, 0.2),  # inverse width into the wire width
        (2, 20, 12, 0.2, 0.5),
        (1, 16, 16, 0.3, 0.3),  # same width: only -2^15 clamps
    ],
)
def test_matches_model_with_counts(lanes, width_in, limit_bits, idle, bp):
    p = small(lanes)
    rng = np.random.default_rng(width_in * lanes)
    ops = make_ops(rng, width_in, limit_bits, lanes)
    dut = Saturate(p, width_in, limit_bits)
    assert dut.limit == (1 << (limit_bits - 1)) - 1
    y, counts = run_ops(dut, ops, lanes, idle, bp, seed=lanes + limit_bits)
    want = [saturate(x, dut.limit) for x in ops]
    np.testing.assert_equal(y, np.concatenate([w[0] for w in want]))
    assert counts == [w[1] for w in want]
    assert counts[0] > 0 and counts[3] == 0  # the edges clamp, the zeros do not


def test_default_limit_is_the_wire():
    p = NicParams()
    dut = Saturate(p, p.w_fwd)
    dut._MustUse__silence = True  # only its ports are inspected
    assert dut.limit == p.wire_max and dut.limit_bits == p.w_wire
    assert len(dut.o.payload.data[0]) == p.w_wire


def test_full_rate_and_latency():
    p = small(2)
    rng = np.random.default_rng(1)
    x = rng.integers(-(1 << 34), 1 << 34, (40, 2))
    pl = [element_payload(v, k == 0, k == 39) for k, v in enumerate(x)]
    dut = Saturate(p, 35)
    run = run_stream(dut, pl, len(pl))
    assert run.latency == Saturate.LATENCY and run.cycles_per_beat() == 1.0
    np.testing.assert_equal(np.diff(run.in_cycles), 1)
    np.testing.assert_equal([o[0] for o in run.outputs], saturate(x, dut.limit)[0])


def test_cocotb_verilator():
    p = small(2)
    run_bench(
        AxisWrapper(Saturate(p, 35, 32)),
        "saturate_l2",
        f"{__package__}.benches.tb_saturate",
        {"lanes": 2, "width_in": 35, "limit_bits": 32},
    )


def test_an_op_of_c_elements_all_clamped_counts_c():
    """The count is NicParams.op_count_bits wide: an op has at most C elements, and one whose
    every element clamps counts C (C = 256 here: a 9-bit count, one bit more than C - 1)."""
    p = small(1)
    x = np.full(p.c, 1 << 20, dtype=np.int64)
    dut = Saturate(p, 24, 16)
    assert len(dut.count) == 9
    y, counts = run_ops(dut, [x, x[:3]], 1, 0.0, 0.0, seed=5)
    assert counts == [p.c, 3]
    np.testing.assert_equal(y, np.full(p.c + 3, (1 << 15) - 1))
