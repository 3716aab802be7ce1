# amaranth: UnusedElaboratable=no
"""SharedFwht (hw/shared_fwht.py): two streams through one Fwht, each equal to
host/model/fwht.py's fwht_blocks of its own input, bit for bit, with their flags."""

from __future__ import annotations

import random

import numpy as np
import pytest

from optireduce.host.model.fwht import fwht_blocks
from optireduce.hw.shared_fwht import SharedFwht
from optireduce.params import NicParams
from optireduce.sim.stream_sim import element_payload, read_element, simulate

P = NicParams(p=16, b=64, c=256, n_max=8)
W_A, W_B = P.w_in, P.w_wire  # the encoder's and the decoder's input widths


def _beats(x: np.ndarray, op_blocks: list[int]) -> list[dict]:
    """One element a beat, first/last on each op's ends (ops are whole blocks)."""
    out, start = [], 0
    for nb in op_blocks:
        n = nb * P.b
        out += [element_payload([x[start + j]], j == 0, j == n - 1) for j in range(n)]
        start += n
    return out


def _run(streams: dict, *, idle: float, bp: float, seed: int, hold=None,
         pause=None) -> tuple[dict, dict]:  # fmt: skip
    """Feed a_i and b_i, drain a_o and b_o in lockstep; `hold(name, cycle)` stalls an
    output, `pause(name, k, cycle)` holds back input beat k. Returns (outputs by
    stream, the cycle each output beat left)."""
    dut = SharedFwht(P, W_A, W_B)
    rng = random.Random(seed)
    got = {k: [] for k in streams}
    when = {k: [] for k in streams}
    limit = 40 * sum(len(v) for v in streams.values()) + 20_000

    async def bench(ctx):
        nxt = dict.fromkeys(streams, 0)
        for cycle in range(limit):
            if all(len(got[k]) == len(streams[k]) for k in streams):
                return
            for k, beats in streams.items():
                port_i, port_o = getattr(dut, f"{k}_i"), getattr(dut, f"{k}_o")
                offer = nxt[k] < len(beats) and rng.random() >= idle
                offer = offer and not (pause and pause(k, nxt[k], cycle))
                ctx.set(port_i.valid, offer)
                if offer:
                    ctx.set(port_i.payload, beats[nxt[k]])
                ready = rng.random() >= bp and not (hold and hold(k, cycle))
                ctx.set(port_o.ready, ready)
            for k in streams:
                port_i, port_o = getattr(dut, f"{k}_i"), getattr(dut, f"{k}_o")
                if ctx.get(port_i.valid) and ctx.get(port_i.ready):
                    nxt[k] += 1
                if ctx.get(port_o.ready) and ctx.get(port_o.valid):
                    got[k].append(read_element(ctx.get(port_o.payload)))
                    when[k].append(cycle)
            await ctx.tick()
        raise TimeoutError({k: (len(got[k]), len(streams[k])) for k in streams})

    simulate(dut, bench)
    return got, when


def _check(streams: dict, inputs: dict, got: dict) -> None:
    for k, beats in streams.items():
        y = np.array([o[0][0] for o in got[k]], dtype=np.int64)
        np.testing.assert_array_equal(y, fwht_blocks(inputs[k], P.b), err_msg=k)
        assert [o[1] for o in got[k]] == [b["first"] for b in beats], k
        assert [o[2] for o in got[k]] == [b["last"] for b in beats], k


def _inputs(seed: int, blocks_a: list[int], blocks_b: list[int]):
    rng = np.random.default_rng(seed)
    # full-scale values of each width: a narrower stream's results must be cut right
    x_a = rng.integers(-((1 << (W_A - 1)) - 1), 1 << (W_A - 1), sum(blocks_a) * P.b)
    x_b = rng.integers(-((1 << (W_B - 1)) - 1), 1 << (W_B - 1), sum(blocks_b) * P.b)
    x_a[: P.b] = (1 << (W_A - 1)) - 1  # the largest sum the narrower width holds
    return {"a": x_a, "b": x_b}, {"a": _beats(x_a, blocks_a), "b": _beats(x_b, blocks_b)}


@pytest.mark.parametrize(("idle", "bp", "seed"), [(0.0, 0.0, 0), (0.3, 0.3, 1), (0.1, 0.6, 2)])
def test_both_streams_equal_the_model_under_stalls(idle, bp, seed):
    inputs, streams = _inputs(seed, [1, 3, 2], [2, 1, 1, 2])
    got, when = _run(streams, idle=idle, bp=bp, seed=seed)
    _check(streams, inputs, got)
    # the blocks took turns: some block of a left between two blocks of b
    ends_a = when["a"][P.b - 1 :: P.b]
    ends_b = when["b"][P.b - 1 :: P.b]
    assert any(ends_b[0] < t < ends_b[-1] for t in ends_a), (ends_a, ends_b)


def test_one_stream_alone_keeps_one_element_a_cycle():
    """With b silent, a's blocks go back to back (one beat a cycle, no gap between them)."""
    inputs, streams = _inputs(3, [4], [])
    got, when = _run({"a": streams["a"]}, idle=0.0, bp=0.0, seed=3)
    _check({"a": streams["a"]}, {"a": inputs["a"]}, got)
    assert when["a"][-1] - when["a"][0] == len(streams["a"]) - 1


def test_a_stalled_decode_output_holds_neither_stream():
    """b's consumer (host_o) stops for 3000 cycles: b's blocks go in only while the
    buffer after the Fwht has room for all of them, so a's blocks keep coming out; then
    every beat of both comes out, each equal to the model."""
    inputs, streams = _inputs(4, [3, 3], [2, 2])

    def hold(name, cycle):
        return name == "b" and 100 <= cycle < 3100

    got, when = _run(streams, idle=0.0, bp=0.0, seed=4, hold=hold)
    _check(streams, inputs, got)
    assert when["a"][-1] < 3100 <= when["b"][-1]  # a finished while b's output was held


def test_a_half_fed_encode_block_holds_nothing():
    """a's input stops in the middle of a block for 3000 cycles (a host word late, or
    lost until the next START pads the op): b's blocks pass the Fwht meanwhile, and a's
    block goes in whole once its last beat is there."""
    inputs, streams = _inputs(5, [2], [3])

    def pause(name, k, cycle):
        return name == "a" and k >= P.b + P.b // 2 and cycle < 3000

    got, when = _run(streams, idle=0.0, bp=0.0, seed=5, pause=pause)
    _check(streams, inputs, got)
    assert when["b"][-1] < 3000 <= when["a"][-1]
