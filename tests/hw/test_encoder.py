"""The composed TX chain (quantize, signs, FWHT, saturate) against host/model/codec.py encode."""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.host.model.codec import encode
from optireduce.host.model.quantize import propose_exponent
from optireduce.hw.encoder import Encoder
from optireduce.params import NicParams
from optireduce.sim.stream_sim import run_ops
from tests.hw.test_quantizer import beats_of

P = NicParams(p=16, b=64, c=256, n_max=8)


def float_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)


@pytest.mark.parametrize("rht", [True, False])
@pytest.mark.parametrize(("idle", "bp"), [(0.0, 0.0), (0.3, 0.3)])
def test_encoder_matches_the_model(rht, idle, bp):
    p = P.replace(rht=rht)
    rng = np.random.default_rng(1)
    ops, want, marks, keys = [], [], [], []
    for op_id, n in enumerate((1, 63, 64, 65, 200)):
        x = (rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))).astype(np.float32)
        if op_id == 2:
            x[:] = 0  # an all-zero op
        e = propose_exponent(x, p)
        ops.append((beats_of(float_bits(x), 1), {"exponent": e}))
        y = encode(x, e, op_id, p).y
        want.append(y)
        keys.append({"op_id": op_id, "words": len(y) // 32})  # y: the op padded to blocks
        marks += [(k == 0, k == len(y) - 1) for k in range(len(y))]
    want = np.concatenate(want)
    enc = Encoder(p)
    run = run_ops(enc, ops, len(want), idle=idle, backpressure=bp, seed=3,
                  scramble={"exponent": 8}, keys=keys, static={"seed": p.seed})  # fmt: skip
    got = np.array([o[0][0] for o in run.outputs])
    np.testing.assert_array_equal(got, want)
    assert [(bool(o[1]), bool(o[2])) for o in run.outputs] == marks


def test_encoder_full_rate_and_latency():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4 * P.b).astype(np.float32)
    e = propose_exponent(x, P)
    enc = Encoder(P)
    run = run_ops(
        enc,
        [(beats_of(float_bits(x), 1), {"exponent": e})],
        4 * P.b,
        scramble={"exponent": 8},
        keys=[{"op_id": 0, "words": 4 * P.b // 32}],
        static={"seed": P.seed},
        lead=40,
    )  # the key ahead, as the core gives it
    assert run.out_cycles[-1] - run.out_cycles[0] == 4 * P.b - 1  # no bubble
    assert run.out_cycles[0] - run.in_cycles[0] == enc.LATENCY
