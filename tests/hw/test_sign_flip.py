# amaranth: UnusedElaboratable=no
"""Speck32/64 core and SignFlip RTL against host/model/signs.py (`speck_encrypt`, `apply_signs`)."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.signs import apply_signs, round_keys, speck_encrypt
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.sign_flip import SignFlip
from optireduce.hw.speck import Speck3264
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import run_stream
from tests.hw.test_quantizer import beats_of, drive_ops, flat

SMALL = NicParams(p=16, b=64, c=256, n_max=8)
WIDTH = 23


def run_speck(requests: list[tuple[int, int]], ready_pattern=None) -> tuple[list, list, list]:
    """Send (key, pt) requests back to back; returns ciphertexts, accept and output cycles."""
    dut = Speck3264()
    cts, acc, outs = [], [], []

    async def bench(ctx):
        k = 0
        for cycle in range(100 * (len(requests) + 1)):
            if len(cts) == len(requests):
                return
            ready = ready_pattern(cycle) if ready_pattern else True
            ctx.set(dut.ct.ready, ready)
            ctx.set(dut.req.valid, k < len(requests))
            if k < len(requests):
                ctx.set(dut.req.payload, {"key": requests[k][0], "pt": requests[k][1]})
                if ctx.get(dut.req.ready):
                    acc.append(cycle)
                    k += 1
            if ready and ctx.get(dut.ct.valid):
                cts.append(ctx.get(dut.ct.payload))
                outs.append(cycle)
            await ctx.tick()
        raise TimeoutError

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return cts, acc, outs


def test_speck_published_test_vector():
    # Beaulieu et al., "The SIMON and SPECK Families of Lightweight Block Ciphers", App. C
    cts, acc, outs = run_speck([(0x1918_1110_0908_0100, 0x6574_694C)])
    assert cts == [0xA868_42F2]
    assert outs[0] - acc[0] == Speck3264.LATENCY == 23


def test_speck_random_keys_match_model_back_to_back_and_held():
    rng = np.random.default_rng(0)
    keys = [int(k) for k in rng.integers(0, 1 << 63, 12, dtype=np.uint64)] + [0, (1 << 64) - 1]
    pts = [int(x) for x in rng.integers(0, 1 << 32, len(keys))]
    # The ciphertext consumer stalls at random: results must be held, none lost.
    stall = rng.random(5000) < 0.5
    cts, _, _ = run_speck(list(zip(keys, pts, strict=True)), lambda c: not stall[c])
    want = []
    for key, pt in zip(keys, pts, strict=True):
        rk = round_keys((key >> 48, (key >> 32) & 0xFFFF, (key >> 16) & 0xFFFF, key & 0xFFFF))
        x, y = speck_encrypt(np.array([pt >> 16]), np.array([pt & 0xFFFF]), rk)
        want.append((int(x[0]) << 16) | int(y[0]))
    assert cts == want
    # no backpressure: one block every PERIOD cycles
    _, _, outs = run_speck(list(zip(keys, pts, strict=True)))
    assert np.diff(outs).tolist() == [Speck3264.PERIOD] * (len(keys) - 1)


def sign_ops(p: NicParams, rng, lengths: list[int]) -> list[tuple[np.ndarray, int, int]]:
    """(values, seed, op_id) per op; values in the symmetric range, edges first."""
    top = (1 << (WIDTH - 1)) - 1
    edges = np.array([0, 1, -1, top, -top, top - 1, -(top - 1)] * 40)
    ops = []
    for j, n in enumerate(lengths):
        v = rng.integers(-top, top + 1, n)
        if j == 0:
            v[: min(n, len(edges))] = edges[:n]
        seed = int(rng.integers(0, 1 << 32)) if j % 3 else p.seed
        op_id = [0, 0xFFFF_FFFF, 1][j % 3] if j < 3 else int(rng.integers(0, 1 << 32))
        ops.append((v, seed, op_id))
    return ops


def check_sign_flip(p: NicParams, ops, *, idle: float, bp: float, seed: int):
    dut = SignFlip(p, WIDTH)
    run = drive_ops(
        dut,
        [(beats_of(v, p.lanes), {"seed": s, "op_id": o}) for v, s, o in ops],
        sum(len(v) for v, _, _ in ops) // p.lanes,
        idle=idle,
        backpressure=bp,
        seed=seed,
        scramble={"seed": 32, "op_id": 32},
    )
    want = np.concatenate([apply_signs(v, s, o) for v, s, o in ops])
    np.testing.assert_equal(flat(run), want)
    firsts = [f for v, _, _ in ops for f in [1] + [0] * (len(v) // p.lanes - 1)]
    assert [f for _, f, _ in run.outputs] == firsts
    assert [la for _, _, la in run.outputs] == [*firsts[1:], 1]
    return run


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sign_flip_matches_model_with_idle_and_backpressure(lanes):
    p = SMALL.replace(lanes=lanes)
    b = p.b
    lengths = [lanes * 50, lanes, b - lanes, b, b + lanes, 3 * 32, p.c]  # ops <= c
    ops = sign_ops(p, np.random.default_rng(lanes), lengths)
    check_sign_flip(p, ops, idle=0.3, bp=0.3, seed=lanes)


def test_sign_flip_default_params_b_plus_one():
    p = NicParams()
    ops = sign_ops(p, np.random.default_rng(9), [p.b + 1, 5])
    check_sign_flip(p, ops, idle=0.1, bp=0.1, seed=9)


def test_sign_flip_is_its_own_inverse():
    p = SMALL.replace(lanes=2)
    v = np.random.default_rng(4).integers(-1000, 1001, 130)

    def flip(payloads: list[dict]) -> list:
        dut = SignFlip(p, WIDTH)

        async def setup(ctx):
            ctx.set(dut.seed, 0xABC)
            ctx.set(dut.op_id, 77)

        return run_stream(dut, payloads, len(payloads), setup=setup).outputs

    once = flip(beats_of(v, 2))
    back = flip([{"data": d, "first": f, "last": la} for d, f, la in once])
    x = np.array([e for o in once for e in o[0]])
    assert np.count_nonzero(x != v) > 30  # about half the signs flipped
    np.testing.assert_equal(np.array([e for o in back for e in o[0]]), v)


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_sign_flip_full_rate_across_op_boundaries(lanes):
    # Back-to-back ops whose lengths are multiples of 32 (all ops after the quantizer's
    # padding): the output never pauses, even at a new op whose key arrives with it.
    p = SMALL.replace(lanes=lanes)
    ops = sign_ops(p, np.random.default_rng(10 + lanes), [64, 32, 96, 64, 128])
    run = check_sign_flip(p, ops, idle=0.0, bp=0.0, seed=0)
    n_out = len(run.outputs)
    dut = SignFlip(p, WIDTH)
    assert run.out_cycles[0] - run.in_cycles[0] == dut.LATENCY == 25
    assert run.out_cycles == list(range(run.out_cycles[0], run.out_cycles[0] + n_out))
    assert run.in_cycles == list(range(n_out))  # the input never stalled either


def test_sign_flip_cocotb_verilator():
    p = SMALL.replace(lanes=4)
    ops = sign_ops(p, np.random.default_rng(44), [4, 60, 64, 68, 96, 256])
    cfg = {
        "width": WIDTH,
        "lanes": 4,
        "ops": [{"v": [int(x) for x in v], "seed": s, "op_id": o} for v, s, o in ops],
    }
    run_bench(AxisWrapper(SignFlip(p, WIDTH)), "sign_flip_top",
              f"{__package__}.benches.tb_sign_flip", cfg)  # fmt: skip
