"""SignFlipAhead (hw/sign_flip_ahead.py) against the model (host/model/signs.py
apply_signs), in Amaranth's simulator: ops of every length class (partial words, one
beat, a whole op of C), keys given ahead or late, random idle and backpressure, every
lane count; with the keys ahead and no stalls, a beat a cycle with one cycle of latency,
across op boundaries too."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.signs import apply_signs
from optireduce.hw.sign_flip_ahead import WORD, SignFlipAhead
from tests.hw.test_quantizer import beats_of
from tests.hw.test_sign_flip import SMALL, WIDTH, sign_ops


def run_ahead(p, ops, *, seed: int, idle: float, bp: float, keys_late: bool):
    """The ops through SignFlipAhead; returns (outputs, in cycles, out cycles)."""
    dut = SignFlipAhead(p, WIDTH)
    rng = random.Random(seed)
    job_seed = ops[0][1]
    keys = [{"op_id": o, "words": -(-len(v) // WORD)} for v, _s, o in ops]
    beats = [b for v, _s, _o in ops for b in beats_of(v, p.lanes)]
    outs, in_cycles, out_cycles = [], [], []
    cycle = {"n": 0}

    async def clock(ctx):
        while True:
            await ctx.tick()
            cycle["n"] += 1

    async def key_source(ctx):
        ctx.set(dut.seed, job_seed)
        for k, key in enumerate(keys):
            if keys_late:  # a key after its op's first beats have waited
                await ctx.tick().repeat(rng.randrange(1, 40) if k else 30)
            ctx.set(dut.key.payload, key)
            ctx.set(dut.key.valid, 1)
            await ctx.tick().until(dut.key.ready)
            ctx.set(dut.key.valid, 0)

    async def beat_source(ctx):
        for b in beats:
            while rng.random() < idle:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload, b)
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            in_cycles.append(cycle["n"] - 1)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        for _ in range(200 * len(beats) + 1000):
            ready = rng.random() >= bp
            ctx.set(dut.o.ready, ready)
            await ctx.delay(1e-12)
            if ready and ctx.get(dut.o.valid):
                pl = ctx.get(dut.o.payload)
                outs.append(([int(x) for x in pl.data], int(pl.first), int(pl.last)))
                out_cycles.append(cycle["n"])
            await ctx.tick()
            if len(outs) == len(beats):
                return
        raise AssertionError(f"{len(outs)} of {len(beats)} beats came out")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(clock, background=True)
    sim.add_testbench(key_source, background=True)
    sim.add_testbench(beat_source, background=True)
    sim.add_testbench(sink)
    sim.run()
    return outs, in_cycles, out_cycles


def _same_seed(ops, seed):
    return [(v, seed, o) for v, _s, o in ops]


@pytest.mark.parametrize("keys_late", [False, True], ids=["ahead", "late"])
@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sign_flip_ahead_matches_model(lanes, keys_late):
    p = SMALL.replace(lanes=lanes)
    lengths = [lanes * 50, lanes, p.b - lanes, p.b, 3 * 32, lanes, lanes * 33, p.c]
    ops = _same_seed(sign_ops(p, np.random.default_rng(lanes), lengths), 0x1234_5678)
    outs, _, _ = run_ahead(p, ops, seed=lanes, idle=0.3, bp=0.3, keys_late=keys_late)
    want = np.concatenate([apply_signs(v, s, o) for v, s, o in ops])
    np.testing.assert_equal(np.array([x for d, _, _ in outs for x in d]), want)
    firsts = [f for v, _, _ in ops for f in [1] + [0] * (len(v) // lanes - 1)]
    assert [f for _, f, _ in outs] == firsts
    assert [la for _, _, la in outs] == [*firsts[1:], 1]


@pytest.mark.parametrize("lanes", [1, 4])
def test_sign_flip_ahead_full_rate_with_keys_ahead(lanes):
    """Keys ahead, no idle, no backpressure: a beat every cycle in and out, one cycle
    apart, across op boundaries (ops of whole words, as the decoder's are) once the
    first words are made."""
    p = SMALL.replace(lanes=lanes)
    ops = _same_seed(sign_ops(p, np.random.default_rng(20), [64, 32, 96, 64, 128, 256]), 7)
    outs, ins, out_cycles = run_ahead(p, ops, seed=0, idle=0.0, bp=0.0, keys_late=False)
    want = np.concatenate([apply_signs(v, s, o) for v, s, o in ops])
    np.testing.assert_equal(np.array([x for d, _, _ in outs for x in d]), want)
    start = ins[0]
    assert ins == list(range(start, start + len(ins)))  # the input never stalled
    assert out_cycles == [c + 1 for c in ins]
