"""Chain figure (the receive half of aggregate->decode; the aggregator's own readout rate is
in fig_aggregator): reduced packets -> gather buffer -> inverse FWHT -> divider -> signs ->
float32 (hw/decoder.py), at the default NicParams on one whole chunk C.

cycles_per_element: output floats per cycle once the DRAIN is taken (no backpressure);
latency_cycles: DRAIN taken -> first float out; place_cycles_per_element: the rate at
which reduced packets are taken in (the aggregator's means and the peers' gather
packets land here).
"""

from __future__ import annotations

import numpy as np

from optireduce.hw.decoder import Decoder
from optireduce.hw.gather_buffer import GatherOp
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, simulate


def figures(p: NicParams | None = None) -> dict:
    p = p or NicParams()
    n, nb = p.c, p.p // p.lanes
    rng = np.random.default_rng(0)
    dut = Decoder(p)
    res: dict = {"in": [], "out": [], "cmd": None}

    async def bench(ctx):
        # place every packet of one op, back to back
        cycle = 0
        for i in range(n // p.p):
            vals = rng.integers(-(1 << 30), 1 << 30, p.p)
            for j in range(nb):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, element_payload(vals[j * p.lanes : (j + 1) * p.lanes],
                                                       j == 0, j == nb - 1))  # fmt: skip
                ctx.set(dut.slot, 0)
                ctx.set(dut.pkt_index, i)
                ctx.set(dut.contributors, 1)
                while not ctx.get(dut.i.ready):
                    await ctx.tick()
                    cycle += 1
                res["in"].append(cycle)
                await ctx.tick()
                cycle += 1
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.seed, 1)
        ctx.set(dut.cmd.payload, {"gather": {"op": GatherOp.DRAIN, "slot": 0, "n": n},
                                  "op_id": 0, "exponent": -20})  # fmt: skip
        ctx.set(dut.o.ready, 1)
        while len(res["out"]) < n // p.lanes:
            if res["cmd"] is None and ctx.get(dut.cmd.ready):
                res["cmd"] = cycle
            if ctx.get(dut.o.valid):
                res["out"].append(cycle)
            await ctx.tick()
            cycle += 1
            if res["cmd"] is not None:
                ctx.set(dut.cmd.valid, 0)
            if cycle > 40 * n + 100_000:
                raise TimeoutError("decoder figures: no output")

    simulate(dut, bench)
    out = res["out"]
    return {
        "cycles_per_element": (out[-1] - out[0] + 1) / n,
        "latency_cycles": out[0] - res["cmd"],
        "place_cycles_per_element": (res["in"][-1] - res["in"][0] + 1) / n,
    }
