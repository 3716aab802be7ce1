"""cocotb bench of BlockDivider (in PlainStreams + AxisWrapper): blocks on s_axis, one k per
block on the k_* stream, quotients on m_axis; random idle and backpressure on all three."""

from __future__ import annotations

import logging
import random

import cocotb
import numpy as np
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource

from optireduce.host.model.codec import div_round
from optireduce.sim.axis_tb import AxisTB, pack, pauses, unpack
from optireduce.sim.cocotb_run import bench_config


def _first_flags(frame, nbeats: int) -> list[int]:
    """tuser per beat (cocotbext-axi gives one value per byte lane, or one int)."""
    tu = frame.tuser
    if isinstance(tu, int):
        return [tu]
    per = len(tu) // nbeats
    return [int(tu[j * per + per - 1]) for j in range(nbeats)]


async def _run(dut, plain: bool, seed: int) -> None:
    cfg = bench_config()
    p, b, lanes, w_in, w_out = cfg["p"], cfg["b"], cfg["lanes"], cfg["w_in"], cfg["w_out"]
    ppb = b // p
    tb = AxisTB(dut, seed=seed, idle=0.3, backpressure=0.3)
    ksrc = AxiStreamSource(AxiStreamBus.from_prefix(dut, "k"), dut.clk, dut.rst)
    ksrc.log.setLevel(logging.WARNING)
    ksrc.set_pause_generator(pauses(random.Random(seed + 9), 0.5))
    dut.plain.value = int(plain)
    await tb.reset()
    rng = np.random.default_rng(seed)
    top = (1 << (w_in - 1)) - 1
    ks = [*range(ppb + 1), *(int(k) for k in rng.integers(0, ppb + 1, 6))]
    blocks = []
    for k in ks:
        d = b if plain else max(k, 1) * p
        t = rng.integers(-(top + 1), top + 1, b)
        t[: b // 4] = rng.integers(-8 * d, 8 * d, b // 4)  # small values: rounding matters
        t[0], t[1], t[2], t[3] = top, -(top + 1), d // 2, -(d // 2 + d)  # extremes and ties
        blocks.append((k, t))
        await ksrc.send(AxiStreamFrame(bytes([k])))
        await tb.send(pack(t, w_in, lanes), first=True)
    for k, t in blocks:
        got = await tb.recv()
        d = b if plain else max(k, 1) * p
        want = div_round(t, d) if k else np.zeros(b, dtype=np.int64)
        np.testing.assert_array_equal(unpack(got.tdata, w_out, lanes), want)
        firsts = _first_flags(got, b // lanes)
        assert firsts[0] == 1 and not any(firsts[1:]), firsts[:4]


@cocotb.test()
async def unbiased_every_k(dut):
    await _run(dut, plain=False, seed=1)


@cocotb.test()
async def plain_every_k(dut):
    await _run(dut, plain=True, seed=2)
