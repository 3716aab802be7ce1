"""Encode/decode chains and the integer division, against independent references."""

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from optireduce.host.model.codec import decode, div_round, encode
from optireduce.host.model.quantize import dequantize, propose_exponent, quantize
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=1024)


def frac_round(t: int, d: int) -> int:
    q = Fraction(abs(t), d)
    mag = int(q + Fraction(1, 2))  # floor(|t|/d + 1/2)
    return -mag if t < 0 else mag


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**60), 2**60), st.integers(1, 5000))
def test_div_round_is_exact(t, d):
    assert int(div_round(np.array([t]), d)[0]) == frac_round(t, d)


def test_div_round_ties_go_away_from_zero():
    assert div_round(np.array([5, -5, 3, -3, 4]), 2).tolist() == [3, -3, 2, -2, 2]


def test_lossless_chain_returns_the_quantized_input_exactly():
    rng = np.random.default_rng(0)
    for n in (1, 63, 64, 65, 1000):
        x = rng.standard_normal(n).astype(np.float32)
        e = propose_exponent(x, P)
        enc = encode(x, e, 5, P)
        assert len(enc.y) % P.b == 0 and enc.sat_transform == 0
        have = np.ones(len(enc.y) // P.p, dtype=bool)
        for est in ("unbiased", "plain"):
            dec = decode(enc.y, have, n, e, 5, P.replace(estimator=est))
            expect = dequantize(quantize(x, e, P).q, e).x
            np.testing.assert_array_equal(dec.x, expect)


def test_transform_is_random_signed_hadamard():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(64).astype(np.float32)
    e = propose_exponent(x, P)
    q = quantize(x, e, P).q
    from optireduce.host.model.signs import sign_bits

    d = 1 - 2 * sign_bits(P.seed, 3, 0, 64).astype(np.int64)
    h = np.array([[1]])
    while len(h) < 64:
        h = np.block([[h, h], [h, -h]])
    np.testing.assert_array_equal(encode(x, e, 3, P).y, h @ (d * q))


def test_forward_saturation_is_counted():
    # a block of equal full-scale values with no transform headroom must clip
    p = P.replace(headroom_bits=1)
    x = np.full(64, 1.0, dtype=np.float32)
    e = propose_exponent(x, p)
    enc = encode(x, e, 0, p)
    assert enc.sat_transform == np.count_nonzero(np.abs(enc.y) == p.wire_max) > 0
    assert np.abs(enc.y).max() == p.wire_max


def test_no_transform_mode_sends_the_quantized_values():
    p = P.replace(rht=False)
    x = np.arange(-50, 50, dtype=np.float32)
    enc = encode(x, 0, 0, p)
    np.testing.assert_array_equal(enc.y[:100], np.arange(-50, 50))
    assert not enc.y[100:].any()  # zero padding


def test_missing_packet_estimators():
    """Plain decode shrinks a block by the kept fraction; unbiased rescales by B/kept."""
    rng = np.random.default_rng(2)
    n = 256
    x = rng.standard_normal(n).astype(np.float32)
    e = propose_exponent(x, P)
    enc = encode(x, e, 9, P)
    have = np.ones(n // P.p, dtype=bool)
    have[5] = False  # block 1 (packets 4..7) keeps 3 of 4
    z = enc.y.copy().reshape(-1, P.p)
    z[~have] = 0
    q_true = quantize(x, e, P).q.astype(np.float64)
    trials = {}
    for est in ("plain", "unbiased"):
        dec = decode(z.ravel(), have, n, e, 9, P.replace(estimator=est))
        got = dec.x.astype(np.float64) * 2.0**-e
        trials[est] = got
        # untouched blocks decode exactly
        np.testing.assert_array_equal(got[:64], q_true[:64])
        np.testing.assert_array_equal(got[128:], q_true[128:])
    # block 1 against an independent reference: Sylvester matrix, Fraction division, signs
    from optireduce.host.model.signs import sign_bits

    h = np.array([[1]])
    while len(h) < 64:
        h = np.block([[h, h], [h, -h]])
    t = h @ z[4:8].ravel()
    d = 1 - 2 * sign_bits(P.seed, 9, 64, 64).astype(np.int64)
    for est, den in (("plain", 64), ("unbiased", 48)):
        want = [int(di) * frac_round(int(ti), den) for ti, di in zip(t, d, strict=True)]
        # the output is float32: round the exact reference the same way (IEEE cast)
        want32 = (np.array(want, dtype=np.float64) * 2.0**e).astype(np.float32)
        np.testing.assert_array_equal(trials[est][64:128] * 2.0**e, want32.astype(np.float64))


def test_reciprocal_table_divider_equals_exact_mean():
    """The gateware's multiply-and-shift mean is the exact rounded quotient, for every n."""
    from optireduce.host.model.aggregator import mean_by_reciprocal, reciprocal_table

    p = NicParams()
    table = reciprocal_table(p)
    rng = np.random.default_rng(3)
    top = (1 << (p.w_acc - 1)) - 1
    for n in range(1, p.n_max + 1):
        edge = [0, 1, -1, n, -n, n // 2, top, -top, top - 1, (n * p.wire_max), -(n * p.wire_max)]
        sums = [*edge, *rng.integers(-top, top, 200).tolist()]
        for s in sums:
            assert mean_by_reciprocal(s, n, p, table) == frac_round(s, n), (s, n)
