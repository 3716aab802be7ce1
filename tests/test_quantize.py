"""float <-> fixed against float64 references (the model does it on bit fields)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optireduce.host.model.quantize import dequantize, propose_exponent, quantize
from optireduce.params import NicParams

P = NicParams()
F32MAX = float(np.finfo(np.float32).max)


def ref_quantize(x: np.ndarray, e: int, qmax: int) -> np.ndarray:
    v = np.abs(x.astype(np.float64)) * 2.0**-e  # exact: power-of-two scaling
    return (np.sign(x) * np.minimum(np.floor(v + 0.5), qmax)).astype(np.int64)


def ref_dequantize(v: np.ndarray, e: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        f = (v.astype(np.float64) * 2.0**e).astype(np.float32)  # IEEE RNE
    return np.where(np.isinf(f), np.sign(f) * F32MAX, f).astype(np.float32)


def wide_floats(rng, n):
    return (rng.standard_normal(n) * np.exp(rng.uniform(-40, 10, n))).astype(np.float32)


def test_quantize_matches_float64_reference():
    rng = np.random.default_rng(0)
    x = wide_floats(rng, 200_000)
    e = propose_exponent(x, P)
    r = quantize(x, e, P)
    np.testing.assert_array_equal(r.q, ref_quantize(x, e, P.q_max))
    assert r.saturated == 0 and r.nonfinite == 0
    assert np.abs(r.q).max() > P.q_max // 2  # the exponent uses the range


def test_quantize_rounds_half_away_from_zero_and_saturates():
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.5, 0.49999997, 1e30, -1e30], dtype=np.float32)
    r = quantize(x, 0, P)
    assert r.q.tolist() == [1, -1, 2, -2, 3, 0, P.q_max, -P.q_max]
    assert r.saturated == 2


def test_quantize_nonfinite_are_counted():
    x = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    r = quantize(x, 0, P)
    assert r.q.tolist() == [0, P.q_max, -P.q_max, 1]
    assert r.nonfinite == 3 and r.saturated == 2


def test_subnormals_are_exact():
    x = np.array([1e-45, 3e-45, 1e-39, -2e-40], dtype=np.float32)
    e = -149
    np.testing.assert_array_equal(quantize(x, e, P).q, ref_quantize(x, e, P.q_max))


def test_exponent_rule_keeps_max_below_range():
    rng = np.random.default_rng(1)
    for scale in (1e-30, 1e-5, 1.0, 1e20):
        x = (rng.standard_normal(1000) * scale).astype(np.float32)
        e = propose_exponent(x, P)
        top = np.abs(x.astype(np.float64)).max() * 2.0**-e
        assert 2 ** (P.w_in - 2) <= top < 2 ** (P.w_in - 1)
    assert propose_exponent(np.zeros(10, np.float32), P) == 0
    # the largest mantissa rounds up to 2^(w_in-1) at e + 2 - w_in: one more step
    x = np.array([np.float32(2.0) - np.float32(2.0**-23)], dtype=np.float32)
    e = propose_exponent(x, P)
    assert e == 2 - P.w_in + 1 and quantize(x, e, P).saturated == 0


@pytest.mark.parametrize("e", [-128, -100, -40, -7, 0, 13, 90, 127])
def test_dequantize_matches_float64_reference(e):
    rng = np.random.default_rng(e + 1000)
    v = rng.integers(-(2**46), 2**46, 50_000)
    v[:5000] = rng.integers(-(2**25), 2**25, 5000)
    v[5000:5100] = rng.integers(-3, 4, 100)
    r = dequantize(v, e)
    np.testing.assert_array_equal(r.x.view(np.uint32), ref_dequantize(v, e).view(np.uint32))
    expect_sat = np.count_nonzero(np.abs(v.astype(np.float64) * 2.0**e) > F32MAX)
    assert r.saturated == expect_sat


def test_dequantize_ties_to_even():
    # 2^24 + 1 and 2^24 + 3 are ties at float32 precision
    v = np.array([2**24 + 1, 2**24 + 3, -(2**24 + 1)], dtype=np.int64)
    assert dequantize(v, 0).x.tolist() == [2.0**24, 2.0**24 + 4, -(2.0**24)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1))
def test_roundtrip_error_is_half_a_step(vals):
    x = np.array(vals, dtype=np.float32)
    e = propose_exponent(x, P)
    r = quantize(x, e, P)
    assert r.saturated == 0
    back = dequantize(r.q, e).x.astype(np.float64)
    step = 2.0**e
    # half a quantization step plus float32 rounding of the result
    bound = 0.5 * step + np.abs(x.astype(np.float64)) * 2.0**-23
    assert np.all(np.abs(back - x.astype(np.float64)) <= bound + 2.0**-149)
