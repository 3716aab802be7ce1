"""The native codec's fast paths at their edges, against the Python model, bit for bit.

host/native/src/codec.cpp computes the model's integers through shortcuts that are exact only
inside stated limits, with the model's integer loops as the fallback outside them:

- quantize in float32 (scale 2^-E a normal float, q_max < 2^30, no denormals-are-zero);
- the encoder's transform split at its headroom (int32 sub-blocks of 2^h in L1, the last
  log2(b) - h stages in one widening, saturating pass), for blocks up to 65536;
- the decoder's transform in sub-blocks of 4096, and its division by a power of two.

Each test puts values on the limits: exponents at the ends of the float32 path, rounding ties
and their neighbours, products that overflow float32, subnormals, saturation on both sides of
q_max and of the wire limit, FTZ/DAZ mode, blocks of 2^14..2^16 elements.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optireduce.host.native as native
from optireduce.host.model import codec, quantize, signs
from optireduce.host.model.fwht import fwht_blocks
from optireduce.params import NicParams
from tests.native.codec_checks import assert_codec_with_flush_to_zero, assert_same_floats

E = native._engine
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def f32(bits: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def assert_quantize_equal(x: np.ndarray, e: int, p: NicParams) -> None:
    ref = quantize.quantize(x, e, p)
    q, saturated, nonfinite = E.quantize(x, e, p.q_max)
    np.testing.assert_array_equal(q, ref.q)
    assert (saturated, nonfinite) == (ref.saturated, ref.nonfinite)


def headroom(h: int) -> NicParams:  # q_max = 2^(31-h) - 1
    return NicParams(p=256, b=65536, c=65536, headroom_bits=h)


def ties_and_neighbours(e: int, q_max: int) -> np.ndarray:
    """(k + 1/2) 2^e for k around 0, 1, 2^23 and q_max, each with its float32 neighbours."""
    ks = [0, 1, 2, 3, 2**22, 2**23 - 1, 2**23, 2**24, q_max - 1, q_max, q_max + 1, 2**30]
    v = np.array([np.ldexp(k + 0.5, e) for k in ks] + [np.ldexp(0.5 - 2.0**-25, e)])
    v = v[v < 2.0**128].astype(np.float32)  # the ties float32 holds; others round to a neighbour
    out = np.concatenate([v, np.nextafter(v, np.float32(0)), np.nextafter(v, np.float32(np.inf))])
    return np.concatenate([out, -out])


# --------------------------------------------------------------------------- quantize

# the float32 path holds for -127 <= E <= 126; beyond, the double path; -149: subnormal steps
QUANTIZE_EXPONENTS = [-149, -129, -128, -127, -126, -30, -1, 0, 1, 100, 125, 126, 127, 128]


@pytest.mark.parametrize("h", [1, 2, 9, 10, 16])
@pytest.mark.parametrize("e", QUANTIZE_EXPONENTS)
def test_quantize_ties_and_limits(e, h):
    p = headroom(h)
    x = ties_and_neighbours(e, p.q_max)
    specials = f32([0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
                    0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001])  # fmt: skip
    assert_quantize_equal(np.concatenate([x, specials]), e, p)


def test_quantize_ties_round_half_away_from_zero():
    # the model's rule, spelled out: the float32 path must not round ties to even
    p = headroom(9)
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.5 - 2.0**-25, 4194302.5], np.float32)
    q, _, _ = E.quantize(x, 0, p.q_max)
    np.testing.assert_array_equal(q, [1, 2, 3, -1, -3, 0, 4194303])


def test_quantize_products_that_overflow_float32():
    # finite inputs whose |x| 2^-E is above FLT_MAX: saturated, not counted as nonfinite
    p = headroom(9)
    x = f32([0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000, 0x3F800000, 0x00000001])
    for e in (-128, -127, -126, -100):
        assert_quantize_equal(x, e, p)
    _, saturated, nonfinite = E.quantize(x[:3], -127, p.q_max)
    assert (saturated, nonfinite) == (3, 0)


def test_quantize_subnormal_inputs_and_outputs():
    rng = np.random.default_rng(1)
    sub = f32(rng.integers(1, 0x800000, size=500, dtype=np.uint32))
    tiny = f32(rng.integers(0x00800000, 0x0C000000, size=500, dtype=np.uint32))
    x = np.concatenate([sub, -sub, tiny, -tiny])
    for e in (-149, -140, -127, -126, -110, 0):
        assert_quantize_equal(x, e, headroom(9))
        assert_quantize_equal(x, e, headroom(1))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    e=st.integers(-160, 160),
    h=st.sampled_from([1, 2, 8, 9, 10, 11, 16]),
)
def test_quantize_random_bits_every_exponent(seed, e, h):
    x = f32(np.random.default_rng(seed).integers(0, 2**32, size=2000, dtype=np.uint64))
    assert_quantize_equal(x, e, headroom(h))


def test_quantize_with_denormals_are_zero_takes_the_exact_path():
    import torch  # a dependency of the test extras: missing means a broken install

    x = np.concatenate([ties_and_neighbours(-140, 2**22), f32([1, 0x807FFFFF, 0x00400000])])
    p = headroom(9)
    ref = quantize.quantize(x, -149, p)
    ref2 = quantize.quantize(x, -127, p)
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        q, sat, nonfinite = E.quantize(x, -149, p.q_max)
        q2, _, _ = E.quantize(x, -127, p.q_max)
    finally:
        torch.set_flush_denormal(False)
    np.testing.assert_array_equal(q, ref.q)
    np.testing.assert_array_equal(q2, ref2.q)
    assert (sat, nonfinite) == (ref.saturated, ref.nonfinite)


# --------------------------------------------------------------------------- transforms


@SETTINGS
@given(
    log2_b=st.integers(14, 16),
    width=st.integers(1, 32),
    seed=st.integers(0, 2**32 - 1),
)
def test_large_block_fwht_equals_the_model(log2_b, width, seed):
    b = 1 << log2_b
    rng = np.random.default_rng(seed)
    lim = 2 ** (width - 1)
    x = rng.integers(-lim, lim, size=b, dtype=np.int64).astype(np.int32)
    x[0], x[-1] = lim - 1, -lim
    ref = fwht_blocks(x, b)
    np.testing.assert_array_equal(E.fwht_blocks(x, b), ref)
    x64 = x.astype(np.int64) << int(rng.integers(0, 16))
    np.testing.assert_array_equal(E.fwht_blocks(x64, b), fwht_blocks(x64, b))
    limit = 2**31 - 1
    y, over = E.fwht_saturate(x, b, limit)
    np.testing.assert_array_equal(y, np.clip(ref, -limit, limit))
    assert over == np.count_nonzero(np.abs(ref) > limit)


# Geometries of the encoder's split transform: (b, headroom) with int32 sub-blocks of 2^h and
# log2(b) - h = 1..4 stages across them; and two where it does not apply (h = log2 b, and 5).
SPLIT_PARAMS = [
    NicParams(p=4096, b=16384, c=65536),  # h = 10: 4 stages across
    NicParams(p=2048, b=32768, c=65536),  # h = 11: 4
    NicParams(p=256, b=8192, c=16384),  # h = 10: 3
    NicParams(p=256, b=4096, c=16384),  # h = 9: 3
    NicParams(p=16, b=256, c=1024),  # h = 7: 1
    NicParams(p=64, b=1024, c=2048, headroom_bits=6),  # 4, saturates at full scale
    NicParams(p=64, b=2048, c=4096, headroom_bits=7),  # 4
    NicParams(p=64, b=512, c=1024, headroom_bits=7),  # 2
    NicParams(p=256, b=65536, c=65536),  # h = 11: 5 stages, not split
    NicParams(p=64, b=1024, c=2048, headroom_bits=10),  # h = log2 b: not split
]


def aligned(n: int, p: NicParams, op_id: int, rng: np.random.Generator) -> np.ndarray:
    """Full scale with the op's random signs: after them every value of a block is about
    +q_max, so the transform puts the block's sum into its first coefficient and saturates."""
    d = 1.0 - 2.0 * signs.sign_bits(p.seed, op_id, 0, n)
    return (d * (1 - rng.random(n) * 1e-3)).astype(np.float32)


def inputs(kind: str, n: int, p: NicParams, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "aligned":
        return aligned(n, p, 7, rng)
    if kind == "spiky":  # a few large values: the widening pass without saturation
        x = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        x[rng.integers(0, n, size=max(1, n // 500))] = 1.0
        return x
    x = f32(rng.integers(0, 2**32, size=n, dtype=np.uint64))  # any bits
    return x


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.sampled_from(SPLIT_PARAMS),
    kind=st.sampled_from(["normal", "aligned", "spiky", "bits"]),
    frac=st.sampled_from([0.0, 0.3, 1.0, 1.7, 2.0]),
    de=st.sampled_from([0, 0, 1, -1, -3]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_split_transform_equals_the_model(p, kind, frac, de, seed):
    rng = np.random.default_rng(seed)
    n = max(1, int(frac * p.b) + int(rng.integers(0, p.p)))
    x = inputs(kind, n, p, rng)
    e = max(-128, min(127, quantize.propose_exponent(x, p) + de))  # de < 0: saturates
    ref = codec.encode(x, e, 7, p)
    y, sat_q, sat_t, nonfinite = E.encode(x, e, 7, p)
    np.testing.assert_array_equal(y, ref.y)
    assert (sat_q, sat_t, nonfinite) == (ref.sat_quantize, ref.sat_transform, ref.nonfinite)


def test_encode_split_transform_saturates_and_stays_in_int32():
    # the ends of the pass across sub-blocks: clamped, widened without a clamp, int32
    rng = np.random.default_rng(2)
    for p in SPLIT_PARAMS[:2]:
        spike = aligned(p.b, p, 1, rng)
        spike[100:] = 0  # up to 100 q_max > limit / 16 per coefficient: widened, not clamped
        one = np.zeros(p.b, np.float32)
        one[5] = 1.0  # q_max per coefficient: int32 all the way
        sats = []
        for x in (aligned(p.b, p, 1, rng), spike, one):
            e = quantize.propose_exponent(x, p)
            ref = codec.encode(x, e, 1, p)
            y, _, sat_t, _ = E.encode(x, e, 1, p)
            np.testing.assert_array_equal(y, ref.y)
            assert sat_t == ref.sat_transform
            sats.append(sat_t)
        assert sats[0] > 0 and sats[1:] == [0, 0]


# --------------------------------------------------------------------------- decode


def decode_both(z: np.ndarray, have: np.ndarray, n: int, e: int, p: NicParams) -> None:
    ref = codec.decode(z.astype(np.int64), have, n, e, 3, p)
    out, sat_out, empty = E.decode(z.astype(np.int32), have, n, e, 3, p)
    assert_same_floats(out, ref.x)
    assert (sat_out, empty) == (ref.sat_output, ref.empty_blocks)


@pytest.mark.parametrize("est", ["unbiased", "plain"])
@pytest.mark.parametrize("e", [-149, -140, -30, 0, 90, 127])
def test_decode_power_of_two_divisor_ties(est, e):
    # z = c at index 0 makes every t = H z equal c; c = (2k + 1) B / 2 puts t / B on a tie
    p = NicParams(p=4096, b=16384, c=65536, estimator=est)
    b = p.b
    cs = [b // 2, -b // 2, 3 * b // 2, -(2**31 // b - 1) * b - b // 2, b // 2 - 1, b // 2 + 1]
    z = np.zeros(len(cs) * b, np.int64)
    z[::b] = cs
    z[1::b] = [0, 1, -1, 0, 2**31 - 1, -(2**31 - 1)]  # t = c +- that: ties and not
    have = np.ones(p.packets_for(len(z)), bool)
    decode_both(z, have, len(z) - 5, e, p)


@pytest.mark.parametrize("est", ["unbiased", "plain"])
@pytest.mark.parametrize("kept", [4, 3, 2, 1, 0])
def test_decode_large_blocks_with_losses(est, kept):
    # b = 16384, P = 4096: kept packets 4, 2, 1 give a power-of-two divisor, 3 does not
    p = NicParams(p=4096, b=16384, c=65536, estimator=est)
    rng = np.random.default_rng(kept)
    n = 2 * p.b + 100
    z = rng.integers(-p.wire_max, p.wire_max + 1, size=p.padded_len(n))
    z[: p.b] = p.wire_max  # |t| up to 2^45
    have = np.zeros(p.packets_for(n), bool)
    for blk in range(len(have) // 4):
        have[4 * blk + rng.permutation(4)[:kept]] = True
    z = np.where(np.repeat(have, p.p), z, 0)
    for e in (-100, -40, 0, 97, 127):
        decode_both(z, have, n, e, p)


def test_decode_power_of_two_with_flush_to_zero():
    import torch  # a dependency of the test extras: missing means a broken install

    p = NicParams(p=4096, b=16384, c=65536)
    rng = np.random.default_rng(9)
    z = rng.integers(-(2**20), 2**20, size=p.b)
    have = np.ones(p.packets_for(p.b), bool)
    ref = codec.decode(z, have, p.b, -149, 3, p)  # subnormal outputs
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        out, sat_out, _ = E.decode(z.astype(np.int32), have, p.b, -149, 3, p)
    finally:
        torch.set_flush_denormal(False)
    assert_same_floats(out, ref.x)
    assert sat_out == ref.sat_output


@pytest.mark.parametrize("est", ["unbiased", "plain"])
def test_split_encoder_and_large_block_decoder_with_flush_to_zero_and_far_exponents(est):
    # FTZ/DAZ and exponents outside the float32 / double ranges take the fallbacks inside the
    # split encoder and the large-block decoder: the same bits
    p = NicParams(p=4096, b=16384, c=65536, estimator=est)
    rng = np.random.default_rng(11)
    n = p.b + 3000
    x = (rng.standard_normal(n) * 1e-38).astype(np.float32)  # subnormals among them
    x[:4] = [np.inf, np.nan, -np.inf, 1e-45]
    have = rng.random(p.packets_for(n)) < 0.8
    have[:4] = True  # one whole block: a power-of-two divisor
    for e in (quantize.propose_exponent(x, p), -140, 130, -600, 600):
        ref = assert_codec_with_flush_to_zero(x, have, n, e, 4, p)
        y2, *_ = E.encode(x, e, 4, p)  # and without FTZ/DAZ: the fast paths, same bits
        np.testing.assert_array_equal(y2, ref.y)
