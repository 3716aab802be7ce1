"""The composed RX chain (gather, inverse FWHT, divider, signs, float32, trim) against
host/model/codec.py decode on the same received packets."""

from __future__ import annotations

import random

import numpy as np
import pytest

from optireduce.host.model.codec import decode
from optireduce.hw.decoder import Decoder
from optireduce.hw.gather_buffer import GatherOp
from optireduce.params import NicParams
from optireduce.sim.stream_sim import read_element, simulate
from tests.hw.test_block_divider import lockstep
from tests.hw.test_gather_buffer import beats_of, make_op

SMALL = NicParams(p=16, b=64, c=256, n_max=8)


def run_decoder(p: NicParams, ops, idle: float, bp: float, seed: int):
    """ops: (slot, n, op_id, exponent, model, packets); returns the output float bits."""
    dut = Decoder(p)
    items = []
    for slot, _n, _op, _e, model, pkts in ops:
        items += beats_of(dut, p, slot, pkts, model)[0]  # fills the model in arrival order
    cmds = [
        {"gather": {"op": GatherOp.DRAIN, "slot": slot, "n": n}, "op_id": op_id,
         "exponent": e}
        for slot, n, op_id, e, _m, _p in ops
    ]  # fmt: skip
    total = sum(n for _s, n, *_ in ops)
    out: dict = {}

    async def bench(ctx):
        rng = random.Random(seed)
        ctx.set(dut.seed, p.seed)
        cycle = await lockstep(ctx, dut, {"i": items}, {}, out, rng, idle=idle)
        await lockstep(ctx, dut, {"cmd": cmds}, {"o": (total, read_element)}, out, rng,
                       idle=idle, backpressure=bp, start=cycle)  # fmt: skip

    simulate(dut, bench)
    return out["o"]


@pytest.mark.parametrize(
    ("rht", "estimator", "idle", "bp"),
    [(True, "unbiased", 0.3, 0.3), (True, "plain", 0.0, 0.0), (False, "plain", 0.2, 0.2)],
)
def test_decoder_matches_the_model(rht, estimator, idle, bp):
    p = SMALL.replace(rht=rht, estimator=estimator)
    rng = np.random.default_rng(5)
    ops = []
    for slot, n, op_id, e, loss in ((0, 200, 7, -20, 0.2), (1, 70, 8, 3, 0.3), (0, 64, 9, -128, 0)):
        model, pkts = make_op(p, n, rng, loss, 0.1)
        ops.append((slot, n, op_id, e, model, pkts))
    # slot 0 is reused by the third op: give it a fresh buffer by splitting the runs
    got = run_decoder(p, ops[:2], idle, bp, seed=1) + run_decoder(p, ops[2:], idle, bp, seed=2)
    want, marks = [], []
    for _slot, n, op_id, e, model, _pkts in ops:
        x = decode(model.z.ravel(), model.have, n, e, op_id, p).x
        want += x.view(np.uint32).tolist()
        marks += [(k == 0, k == n - 1) for k in range(n)]
    np.testing.assert_array_equal([o[0][0] for o in got], want)
    assert [(bool(o[1]), bool(o[2])) for o in got] == marks
