"""BlockDivider: reciprocal-multiply division == host/model/codec.py div_round, bit for bit."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from optireduce.host.model.codec import div_round
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.hw.block_divider import (
    BlockDivider,
    divide_model,
    quotient_width,
    recip_shift,
    recip_table,
)
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, read_element, simulate

SMALL = NicParams(p=16, b=64, c=256, n_max=8)
SMALL2 = NicParams(p=16, b=64, c=256, n_max=8, lanes=2)
DEFAULT = NicParams()


async def lockstep(
    ctx,
    dut,
    sources: dict[str, list],
    sinks: dict[str, tuple[int, Callable]],
    out: dict,
    rng: random.Random,
    *,
    idle: float = 0.0,
    backpressure: float | dict[str, float] = 0.0,
    start: int = 0,
    max_cycles: int = 200_000,
) -> int:
    """Drive several sources and drain several sinks at once until all are done (the
    multi-stream form of run_stream). sources: port -> items, an item being a payload or
    (payload, [(side signal, value), ...]) set while it is offered; sinks: port -> (beats, reader).
    backpressure may be per sink ({port: probability}). Appends to out[port] and
    out[port + "_cycles"]; returns the cycle count reached."""
    for name in [*sinks, *(s + "_cycles" for s in (*sinks, *sources))]:
        out.setdefault(name, [])
    pos = dict.fromkeys(sources, 0)
    goal = {s: len(out[s]) + n for s, (n, _) in sinks.items()}
    for cycle in range(start, start + max_cycles):
        if all(pos[s] >= len(v) for s, v in sources.items()) and all(
            len(out[s]) >= goal[s] for s in sinks
        ):
            for s in sources:
                ctx.set(getattr(dut, s).valid, 0)
            for s in sinks:
                ctx.set(getattr(dut, s).ready, 0)
            return cycle
        offered = {}
        for s, items in sources.items():
            port = getattr(dut, s)
            offer = pos[s] < len(items) and not (idle and rng.random() < idle)
            ctx.set(port.valid, offer)
            if offer:
                item = items[pos[s]]
                payload, side = item if isinstance(item, tuple) else (item, ())
                ctx.set(port.payload, payload)
                for sig, v in side:
                    ctx.set(sig, v)
            offered[s] = offer
        readies = {}
        for s in sinks:
            bp = backpressure.get(s, 0.0) if isinstance(backpressure, dict) else backpressure
            readies[s] = len(out[s]) < goal[s] and not (bp and rng.random() < bp)
            ctx.set(getattr(dut, s).ready, readies[s])
        for s in sources:
            if offered[s] and ctx.get(getattr(dut, s).ready):
                out[s + "_cycles"].append(cycle)
                pos[s] += 1
        for s, (_, read) in sinks.items():
            port = getattr(dut, s)
            if readies[s] and ctx.get(port.valid):
                out[s].append(read(ctx.get(port.payload)))
                out[s + "_cycles"].append(cycle)
        await ctx.tick()
    raise TimeoutError(f"inputs {pos}, outputs { {s: len(out[s]) for s in sinks} }")


def run_streams(
    dut,
    sources: dict[str, list],
    sinks: dict[str, tuple[int, Callable]],
    *,
    idle: float = 0.0,
    backpressure: float = 0.0,
    seed: int = 0,
    setup: Callable | None = None,
) -> dict:
    """One lockstep run in a fresh simulation; setup(ctx) first sets configuration ports."""
    out: dict = {}

    async def bench(ctx):
        if setup is not None:
            await setup(ctx)
        rng = random.Random(seed)
        await lockstep(ctx, dut, sources, sinks, out, rng, idle=idle, backpressure=backpressure)

    simulate(dut, bench)
    return out


def edge_values(p: NicParams, w: int, k: int, plain: bool) -> list[int]:
    """0, +-1, the rounding ties of D and their neighbours, the extremes of a w-bit input."""
    d = p.b if plain else k * p.p
    top = (1 << (w - 1)) - 1
    ties = [d // 2 + j * d for j in (0, 1, 2, 1000)] if d % 2 == 0 else []
    vals = [0, 1, 2, d - 1, d, d + 1, top, top - 1, top - d // 2, -(top + 1)]
    for x in ties:
        vals += [x - 1, x, x + 1]
    vals += [-v for v in vals]
    return [v for v in vals if -(top + 1) <= v <= top]


# ---- the arithmetic --------------------------------------------------------------------
@pytest.mark.parametrize("p", [SMALL, DEFAULT, NicParams(p=1, b=8, c=8), NicParams(p=4096)])
def test_reciprocal_condition_and_model(p):
    """For every D the table meets N_max * e < 2^s, and the model equals div_round."""
    w = p.w_inv
    s, table = recip_shift(p, w), recip_table(p, w)
    a = p.p.bit_length() - 1
    n_max = ((2 * ((1 << w) - 1)) >> a) + p.packets_per_block  # |t| < 2^w, as the brief asks
    rng = np.random.default_rng(1)
    for k in range(1, p.packets_per_block + 1):
        e = table[k] * 2 * k - (1 << s)
        assert 0 <= e < 2 * k and n_max * e < 1 << s
        assert table[k] == -(-(1 << (s + a)) // (2 * k * p.p))  # = ceil(2^S / 2D)
        for plain in (False, True):
            d = p.b if plain else k * p.p
            t = edge_values(p, w, k, plain) + [
                int(x) for x in rng.integers(-(1 << (w - 1)), 1 << (w - 1), 200)
            ]
            got = [divide_model(x, k, plain, p, w) for x in t]
            np.testing.assert_equal(got, div_round(np.array(t), d))
            # beyond the input width, up to the brief's bound |t| < 2^w (exact Python ints)
            big = [(1 << w) - 1, (1 << w) - 2, (1 << w) - d // 2 - 1, (1 << (w - 1)) + d // 2]
            for x in big + [-x for x in big]:
                exact = (2 * abs(x) + d) // (2 * d)
                assert divide_model(x, k, plain, p, w) == (exact if x >= 0 else -exact)
    assert divide_model(12345, 0, False, p, w) == 0 and divide_model(-7, 0, True, p, w) == 0


def test_quotient_width_is_tight():
    for p in (SMALL, DEFAULT, NicParams(p=1, b=8, c=8)):
        w = p.w_inv
        wo = quotient_width(p, w)
        ext = [div_round(np.array([(1 << (w - 1)) - 1, -(1 << (w - 1))]), p.p)]
        hi, lo = int(ext[0][0]), int(ext[0][1])
        assert lo >= -(1 << (wo - 1)) and hi <= (1 << (wo - 1)) - 1
        assert hi > (1 << (wo - 2)) - 1 or lo < -(1 << (wo - 2))  # one bit fewer would not hold it


# ---- RTL == model ------------------------------------------------------------------------
def blocks_for(p: NicParams, ks: list[int], block_len: int, w: int, plain: bool, rng) -> list:
    """Per block: (k, t values): that k's edge values, small values (where the rounding
    decides the result) and full-range random values; shuffled, cut to block_len."""
    out = []
    top = (1 << (w - 1)) - 1
    for k in ks:
        vals = edge_values(p, w, max(k, 1), plain)
        vals += [int(x) for x in rng.integers(-4 * p.b, 4 * p.b, 16)]
        vals += [int(x) for x in rng.integers(-(top + 1), top + 1, max(0, block_len - len(vals)))]
        rng.shuffle(vals)
        out.append((k, vals[:block_len]))
    return out


def run_divider(p, blocks, plain, *, idle=0.0, bp=0.0, seed=0):
    dut = BlockDivider(p)
    lanes = p.lanes
    beats = []
    for _, vals in blocks:
        nb = len(vals) // lanes
        for j in range(nb):
            beats.append(element_payload(vals[j * lanes : (j + 1) * lanes], j == 0, j == nb - 1))

    async def setup(ctx):
        ctx.set(dut.plain, plain)

    res = run_streams(
        dut,
        {"i": beats, "k": [k for k, _ in blocks]},
        {"o": (len(beats), read_element)},
        idle=idle, backpressure=bp, seed=seed, setup=setup,
    )  # fmt: skip
    got = np.array([v for o in res["o"] for v in o[0]])
    firsts = [o[1] for o in res["o"]]
    lasts = [o[2] for o in res["o"]]
    return got, firsts, lasts, res, beats


def expected(p, blocks, plain):
    out = []
    for k, vals in blocks:
        d = p.b if plain else max(k, 1) * p.p
        v = div_round(np.array(vals), d)
        out.append(v if k else np.zeros_like(v))  # an empty block decodes to zeros
    return np.concatenate(out)


@pytest.mark.parametrize("plain", [False, True])
def test_default_width_every_d(plain):
    """Default widths (w_inv = 44, p = 256): every k in 0..16, edge and random t.

    The divider takes its block boundaries from first/last only, so short blocks of 64
    elements test every D at the default width in little simulated time."""
    p = DEFAULT
    rng = np.random.default_rng(2 + plain)
    ks = list(range(p.packets_per_block + 1))
    blocks = blocks_for(p, ks, 64, p.w_inv, plain, rng)
    got, firsts, lasts, res, _ = run_divider(p, blocks, plain)
    np.testing.assert_equal(got, expected(p, blocks, plain))
    assert firsts == ([1] + [0] * 63) * len(ks) and lasts == ([0] * 63 + [1]) * len(ks)
    assert res["o_cycles"][0] - res["i_cycles"][0] == BlockDivider(p).LATENCY
    assert res["o_cycles"][-1] - res["o_cycles"][0] == len(res["o_cycles"]) - 1  # no bubbles


@pytest.mark.parametrize(("p", "plain"), [(SMALL, False), (SMALL2, True), (SMALL2, False)])
def test_full_blocks_random_idle_backpressure(p, plain):
    rng = np.random.default_rng(5)
    ks = [int(k) for k in rng.integers(0, p.packets_per_block + 1, 12)] + [
        p.packets_per_block,
        1,
        0,
    ]
    blocks = blocks_for(p, ks, p.b, p.w_inv, plain, rng)
    got, firsts, lasts, _, beats = run_divider(p, blocks, plain, idle=0.3, bp=0.3, seed=7)
    np.testing.assert_equal(got, expected(p, blocks, plain))
    assert firsts == [b["first"] for b in beats] and lasts == [b["last"] for b in beats]


def test_single_element_blocks():
    """A block of one beat (first and last together) takes its own k."""
    p = SMALL
    rng = np.random.default_rng(9)
    ks = [int(k) for k in rng.integers(0, p.packets_per_block + 1, 40)]
    blocks = blocks_for(p, ks, 1, p.w_inv, False, rng)
    got, firsts, lasts, _, _ = run_divider(p, blocks, False, idle=0.5, bp=0.5, seed=3)
    np.testing.assert_equal(got, expected(p, blocks, False))
    assert firsts == [1] * 40 and lasts == [1] * 40


# ---- cocotb + Verilator --------------------------------------------------------------------
def test_cocotb_verilator():
    p = SMALL2
    top = AxisWrapper(PlainStreams(BlockDivider(p), k="axis"))
    cfg = {"p": p.p, "b": p.b, "lanes": p.lanes, "w_in": p.w_inv,
           "w_out": quotient_width(p, p.w_inv)}  # fmt: skip
    run_bench(top, "block_divider_top", f"{__package__}.benches.tb_block_divider", cfg)


def test_few_packets_per_block_take_the_digit_tables():
    """P_b = 4 (SMALL, the 25F's 1024 / 256): the digit-table divider; P_b = 16 (the
    default): the reciprocal multiply. Both give the model's quotients above."""
    assert BlockDivider(SMALL).uses_digits and BlockDivider(SMALL2).uses_digits
    assert not BlockDivider(DEFAULT).uses_digits
    assert BlockDivider(NicParams(p=256, b=1024, c=2048, n_max=8)).uses_digits
