"""The native codec (host/native/src/codec.cpp) against the Python model, bit for bit.

Every function of the codec is compared with its model twin (host/model/quantize.py,
signs.py, fwht.py, codec.py) on random and edge inputs: sizes that are not multiples of P or
B, exponents at the int8 edges and beyond, inf/NaN, saturating values, every block size.
The model itself is checked against float64 and exact references in tests/test_quantize.py,
test_signs.py, test_fwht.py and test_codec.py; here the model is the reference.
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


def test_extension_is_built():
    # no skip: a missing extension is a broken install, not an optional feature
    assert native.available, (
        f"{native.why}. Fix: `make install` builds it (scikit-build-core runs CMake on "
        "host/native); see the CMake output for the compiler error."
    )


E = native._engine
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Geometries: (p, b) with p dividing b, small and default; widths through headroom_bits.
PARAMS = [
    NicParams(p=8, b=32, c=128),
    NicParams(p=4, b=64, c=128, headroom_bits=1),
    NicParams(p=16, b=128, c=256, headroom_bits=7),
    NicParams(p=256, b=4096, c=16384),
    NicParams(p=128, b=1024, c=2048, headroom_bits=10),
    NicParams(p=8, b=8, c=64),
    NicParams(p=1, b=2, c=64),
]
EXPONENT_EDGES = [-128, -127, -1, 0, 1, 126, 127]


def bits_as_f32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


# float32 inputs drawn as bit patterns, mixed with the values that hit every branch
SPECIAL_BITS = [
    0x00000000, 0x80000000,  # +-0
    0x00000001, 0x807FFFFF, 0x00400000,  # subnormals
    0x00800000, 0x3F800000, 0xBF800000, 0x3EFFFFFF, 0x3F000000,  # normals, 1/2
    0x7F7FFFFF, 0xFF7FFFFF,  # +-FLT_MAX
    0x7F800000, 0xFF800000,  # +-inf
    0x7FC00000, 0xFFFFFFFF, 0x7F800001,  # NaNs
]  # fmt: skip


@st.composite
def float_arrays(draw, max_len: int = 9000) -> np.ndarray:
    n = draw(st.integers(0, max_len))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "bits", "scaled", "mixed"]))
    if kind == "normal":
        x = rng.standard_normal(n).astype(np.float32)
    elif kind == "bits":
        x = bits_as_f32(rng.integers(0, 2**32, size=n, dtype=np.uint64))
    elif kind == "scaled":  # heavy tails over many octaves
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, size=n)).astype(np.float32)
    else:
        x = rng.standard_normal(n).astype(np.float32)
        k = draw(st.integers(0, min(n, 40)))
        if k:
            idx = rng.integers(0, n, size=k)
            x[idx] = bits_as_f32(rng.choice(SPECIAL_BITS, size=k))
    return x


def exponents_for(x: np.ndarray, p: NicParams) -> st.SearchStrategy[int]:
    e = quantize.propose_exponent(x, p)
    near = [max(-128, min(127, e + d)) for d in (-12, -1, 0, 1)]  # below: saturates
    return st.sampled_from(near + EXPONENT_EDGES)


# --------------------------------------------------------------------------- quantize


@SETTINGS
@given(x=float_arrays(), p=st.sampled_from(PARAMS), data=st.data())
def test_quantize_and_propose_exponent_equal_the_model(x, p, data):
    assert E.propose_exponent(x, p) == quantize.propose_exponent(x, p)
    e = data.draw(exponents_for(x, p))
    ref = quantize.quantize(x, e, p)
    q, saturated, nonfinite = E.quantize(x, e, p.q_max)
    np.testing.assert_array_equal(q, ref.q)
    assert (saturated, nonfinite) == (ref.saturated, ref.nonfinite)


@pytest.mark.parametrize("e", [-1000, -300, -150, 150, 300, 1000])
def test_quantize_far_exponents(e):
    x = bits_as_f32(np.array(SPECIAL_BITS + [0x3F800000 + k for k in range(64)], np.uint32))
    p = NicParams()
    ref = quantize.quantize(x, e, p)
    q, saturated, nonfinite = E.quantize(x, e, p.q_max)
    np.testing.assert_array_equal(q, ref.q)
    assert (saturated, nonfinite) == (ref.saturated, ref.nonfinite)


def test_propose_exponent_edges():
    p = NicParams()
    for bits in ([], [0x7F800000, 0x7FC00000], [0, 0x80000000], [0x00000001], [0x7F7FFFFF]):
        x = bits_as_f32(np.array(bits, dtype=np.uint32))
        assert E.propose_exponent(x, p) == quantize.propose_exponent(x, p)
    # the round-up rule: the largest value just below 2^(w_in-1) steps
    top = np.float32(2 ** (p.w_in - 1) - 0.5)
    for x in (np.array([top], np.float32), np.array([np.nextafter(top, 0)], np.float32)):
        assert E.propose_exponent(x, p) == quantize.propose_exponent(x, p)


# --------------------------------------------------------------------------- dequantize


@st.composite
def wide_ints(draw) -> np.ndarray:
    n = draw(st.integers(0, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    width = rng.integers(0, 54, size=n)
    v = rng.integers(0, 2**62, size=n) >> (62 - width)  # |v| < 2^53, every bit length
    v = np.where(rng.random(n) < 0.5, -v, v).astype(np.int64)
    edges = [0, 1, -1, 2**24 - 1, 2**24 + 1, 2**25 - 1, -(2**53) + 1, 2**53 - 1, 3 << 50]
    return np.concatenate([v, np.array(edges, dtype=np.int64)])


@SETTINGS
@given(v=wide_ints(), e=st.sampled_from([*EXPONENT_EDGES, -149, -200, 80, 100, 600, -700]))
def test_dequantize_equals_the_model(v, e):
    ref = quantize.dequantize(v, e)
    x, saturated = E.dequantize(v, e)
    assert_same_floats(x, ref.x)
    assert saturated == ref.saturated


def test_dequantize_rejects_53_bit_values():
    for bad in (2**53, -(2**53), -(2**63)):
        with pytest.raises(ValueError, match="2\\^53"):
            E.dequantize(np.array([1, bad], dtype=np.int64), 0)


def test_dequantize_with_flush_to_zero_still_exact():
    # torch.set_flush_denormal sets FTZ/DAZ in this thread; the codec must not change
    import torch  # a dependency of the test extras: missing means a broken install

    v = np.array([1, -1, 3, 2**23 + 1, 5 << 20], dtype=np.int64)
    e = -149  # subnormal outputs
    p = NicParams()
    ref = quantize.dequantize(v, e)
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        x, _ = E.dequantize(v, e)
        q, _, _ = E.quantize(ref.x, -149, p.q_max)
    finally:
        torch.set_flush_denormal(False)
    assert_same_floats(x, ref.x)
    np.testing.assert_array_equal(q, quantize.quantize(ref.x, -149, p).q)


# --------------------------------------------------------------------------- signs


def test_speck_published_vector():
    # Beaulieu et al., "The SIMON and SPECK Families of Lightweight Block Ciphers", App. C
    assert E.speck_encrypt((0x1918, 0x1110, 0x0908, 0x0100), 0x6574, 0x694C) == (0xA868, 0x42F2)


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    op_id=st.integers(0, 2**32 - 1),
    start=st.one_of(st.integers(0, 5000), st.integers(2**37 - 100, 2**37 + 100)),
    n=st.integers(0, 3000),
)
def test_signs_equal_the_model(seed, op_id, start, n):
    np.testing.assert_array_equal(
        E.sign_bits(seed, op_id, start, n), signs.sign_bits(seed, op_id, start, n)
    )
    v = np.random.default_rng(n).integers(-(2**40), 2**40, size=n)
    full = signs.apply_signs(np.concatenate([np.zeros(start % 4096, np.int64), v]), seed, op_id)
    np.testing.assert_array_equal(E.apply_signs(v, seed, op_id, start % 4096), full[start % 4096 :])


def test_apply_signs_in_place():
    v = np.arange(-3000, 3000, dtype=np.int64)
    ref = signs.apply_signs(v, 7, 9)
    out = E.apply_signs(v, 7, 9, 0, v)
    assert out is v
    np.testing.assert_array_equal(v, ref)


# --------------------------------------------------------------------------- transform


@SETTINGS
@given(
    log2_b=st.integers(0, 13),
    blocks=st.integers(0, 3),
    width=st.integers(1, 32),
    seed=st.integers(0, 2**32 - 1),
)
def test_fwht_equals_the_model(log2_b, blocks, width, seed):
    b = 1 << log2_b
    rng = np.random.default_rng(seed)
    lim = 2 ** (width - 1)
    x = rng.integers(-lim, lim, size=b * blocks, dtype=np.int64).astype(np.int32)
    if len(x):  # the bound itself, both signs: the int32 path's edge
        x[0], x[-1] = lim - 1, -lim
    ref = fwht_blocks(x, b)
    np.testing.assert_array_equal(E.fwht_blocks(x, b), ref)
    x64 = x.astype(np.int64) << rng.integers(0, 20)
    np.testing.assert_array_equal(E.fwht_blocks(x64, b), fwht_blocks(x64, b))
    for limit in (2**31 - 1, min(lim, 2**31 - 1), 2 ** min(30, width + log2_b // 2)):
        y, over = E.fwht_saturate(x, b, limit)
        np.testing.assert_array_equal(y, np.clip(ref, -limit, limit))
        assert over == np.count_nonzero(np.abs(ref) > limit)


def test_fwht_largest_block_and_in_place():
    x = np.random.default_rng(3).integers(-(2**31), 2**31, size=2 * 65536, dtype=np.int64)
    ref = fwht_blocks(x, 65536)
    np.testing.assert_array_equal(E.fwht_blocks(x, 65536, x), ref)  # out = x: in place
    np.testing.assert_array_equal(x, ref)


@pytest.mark.parametrize("b", [0, 3, 131072, -4])
def test_fwht_rejects_bad_blocks(b):
    with pytest.raises(ValueError, match="block size"):
        E.fwht_blocks(np.zeros(12, np.int32), b)


def test_fwht_rejects_ragged_length():
    with pytest.raises(ValueError, match="multiple"):
        E.fwht_blocks(np.zeros(12, np.int32), 8)


# --------------------------------------------------------------------------- the mean


@SETTINGS
@given(
    t=st.lists(st.integers(-(2**60), 2**60), max_size=300),
    d=st.one_of(st.integers(1, 5000), st.sampled_from([1, 2, 256, 4096, 3 * 256, 63 * 256])),
    small=st.booleans(),
)
def test_div_round_equals_the_model(t, d, small):
    t = np.array(t, dtype=np.int64)
    if small:  # the sums an aggregator sees: the vectorised path
        t >>= 20
    np.testing.assert_array_equal(E.div_round(t, d), codec.div_round(t, d))


def test_div_round_rejects_what_the_model_cannot_divide():
    with pytest.raises(ValueError, match="d must be"):
        E.div_round(np.array([1], np.int64), 0)
    with pytest.raises(ValueError, match="2\\^61"):
        E.div_round(np.array([1, 2**62], np.int64), 3)


# --------------------------------------------------------------------------- encode / decode


@st.composite
def ops(draw):
    p = draw(st.sampled_from(PARAMS))
    p = p.replace(
        rht=draw(st.booleans()) or p.b == 4096,
        estimator=draw(st.sampled_from(["unbiased", "plain"])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    x = draw(float_arrays(max_len=3 * p.b + p.p + 1))
    e = draw(exponents_for(x, p))
    op_id = draw(st.integers(0, 2**32 - 1))
    return p, x, e, op_id


@SETTINGS
@given(op=ops(), data=st.data())
def test_encode_decode_equal_the_model(op, data):
    p, x, e, op_id = op
    n = len(x)
    ref = codec.encode(x, e, op_id, p)
    y, sat_q, sat_t, nonfinite = E.encode(x, e, op_id, p)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref.y)
    assert (sat_q, sat_t, nonfinite) == (ref.sat_quantize, ref.sat_transform, ref.nonfinite)

    # the reduced values: the encoded ones, or anything the wire can carry, minus lost packets
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    packets = p.packets_for(n)
    if data.draw(st.booleans()):
        z = y.astype(np.int64)
    else:
        z = rng.integers(-p.wire_max, p.wire_max + 1, size=p.padded_len(n))
    have = rng.random(packets) < data.draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
    z = np.where(np.repeat(have, p.p), z, 0)
    ref_d = codec.decode(z, have, n, e, op_id, p)
    out, sat_out, empty = E.decode(z.astype(np.int32), have, n, e, op_id, p)
    assert_same_floats(out, ref_d.x)
    assert (sat_out, empty) == (ref_d.sat_output, ref_d.empty_blocks)


@pytest.mark.parametrize("est", ["unbiased", "plain"])
def test_encode_decode_with_flush_to_zero_and_far_exponents(est):
    # FTZ/DAZ (torch.set_flush_denormal) and |E| > 512 take the integer loops: same bits
    p = NicParams(p=16, b=512, c=1024, estimator=est)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(3000) * 1e-38).astype(np.float32)  # subnormals among them
    x[:4] = [np.inf, np.nan, -np.inf, 1e-45]
    have = rng.random(p.packets_for(3000)) < 0.8
    for e in (quantize.propose_exponent(x, p), -600, 600):
        assert_codec_with_flush_to_zero(x, have, 3000, e, 4, p)


def test_encode_saturates_the_transform_like_the_model():
    p = NicParams(p=4, b=64, c=128, headroom_bits=1)
    x = np.full(64, 1.0, dtype=np.float32)
    e = quantize.propose_exponent(x, p)
    ref = codec.encode(x, e, 0, p)
    y, _, sat_t, _ = E.encode(x, e, 0, p)
    assert sat_t == ref.sat_transform > 0
    np.testing.assert_array_equal(y, ref.y)


def test_encode_decode_write_torch_tensors_in_place():
    import torch  # a dependency of the test extras: missing means a broken install

    p = NicParams()
    x = torch.randn(5000)
    e = quantize.propose_exponent(x.numpy(), p)
    y = torch.empty(p.padded_len(5000), dtype=torch.int32)
    out = E.encode(x, e, 3, p, y)[0]
    assert out is y  # the tensor itself, written in place
    np.testing.assert_array_equal(y.numpy(), codec.encode(x.numpy(), e, 3, p).y)
    have = torch.ones(p.packets_for(5000), dtype=torch.bool)
    r = torch.empty(5000, dtype=torch.float32)
    assert E.decode(y, have, 5000, e, 3, p, r)[0] is r
    ref = codec.decode(y.numpy().astype(np.int64), have.numpy(), 5000, e, 3, p)
    assert_same_floats(r.numpy(), ref.x)


def test_native_params_object_equals_nicparams():
    p = NicParams(p=128, b=1024, c=2048, headroom_bits=10, estimator="plain", seed=12345)
    pn = E.Params.from_nicparams(p)
    assert (pn.p, pn.b, pn.headroom_bits, pn.seed, pn.q_max, pn.wire_max, pn.w_in) == (
        p.p, p.b, p.headroom_bits_eff, p.seed, p.q_max, p.wire_max, p.w_in,
    )  # fmt: skip
    assert pn.padded_len(0) == p.padded_len(0) and pn.padded_len(1025) == p.padded_len(1025)
    x = np.random.default_rng(0).standard_normal(3000).astype(np.float32)
    np.testing.assert_array_equal(E.encode(x, -20, 1, pn)[0], E.encode(x, -20, 1, p)[0])


def test_bad_arguments_are_clear_errors():
    p = NicParams(p=8, b=32, c=128)
    x = np.zeros(40, np.float32)
    with pytest.raises(ValueError, match="out has 40 elements, needs 64"):
        E.encode(x, 0, 0, p, np.zeros(40, np.int32))
    with pytest.raises(ValueError, match="dtype"):
        E.encode(x, 0, 0, p, np.zeros(64, np.int64))  # never a silent converted copy
    with pytest.raises(ValueError, match="padded_len"):
        E.decode(np.zeros(32, np.int32), np.ones(8, bool), 40, 0, 0, p)
    with pytest.raises(ValueError, match="packets_for"):
        E.decode(np.zeros(64, np.int32), np.ones(4, bool), 40, 0, 0, p)
    with pytest.raises(ValueError, match="n must be"):
        E.decode(np.zeros(64, np.int32), np.ones(8, bool), -1, 0, 0, p)
