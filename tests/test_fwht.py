"""Blockwise FWHT (host/model/fwht.py) against independent references.

References: an explicit Sylvester matrix from np.kron, the closed form
H[k, j] = (-1)^popcount(k & j) for single rows of large blocks, and fwht_numpy as a second
implementation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optireduce.host.model.fwht import MAX_BLOCK, bench_fwht, fwht_blocks, fwht_numpy

ALL_B = [1 << k for k in range(17)]  # 1 .. 65536


def sylvester(b: int) -> np.ndarray:
    """H_b built as repeated Kronecker products of H_2 = [[1, 1], [1, -1]]."""
    h2 = np.array([[1, 1], [1, -1]], dtype=np.int64)
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < b:
        h = np.kron(h2, h)
    return h


def reference(x: np.ndarray, b: int) -> np.ndarray:
    blocks = np.asarray(x, dtype=np.int64).reshape(-1, b)
    return (blocks @ sylvester(b).T).reshape(-1)


def hadamard_row(k: int, b: int) -> np.ndarray:
    """Row k of H_b from the closed form (-1)^popcount(k & j)."""
    parity = np.bitwise_count(np.arange(b, dtype=np.int64) & k) & 1
    return 1 - 2 * parity.astype(np.int64)


def random_data(rng: np.random.Generator, n: int, bits: int = 34) -> np.ndarray:
    x = rng.integers(-(2**bits), 2**bits, size=n, dtype=np.int64)
    # force values at the edges of the range into the data
    x[: min(n, 4)] = [2**bits - 1, -(2**bits), 2**bits - 2, -(2**bits) + 1][: min(n, 4)]
    return rng.permutation(x)


def test_sylvester_reference_is_the_textbook_matrix():
    # H_4 written out, so the reference itself is pinned down
    h4 = [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]
    np.testing.assert_array_equal(sylvester(4), h4)
    np.testing.assert_array_equal(sylvester(64)[37], hadamard_row(37, 64))


@pytest.mark.parametrize("b", [1 << k for k in range(11)])
def test_matches_explicit_hadamard_matrix(b):
    rng = np.random.default_rng(b)
    x = random_data(rng, 5 * b)
    np.testing.assert_array_equal(fwht_blocks(x, b), reference(x, b))


@pytest.mark.parametrize("b", [1 << k for k in range(11)])
def test_int32_input_matches_explicit_matrix(b):
    rng = np.random.default_rng(100 + b)
    x = rng.integers(-(2**31), 2**31, size=3 * b, dtype=np.int32)
    x[0], x[-1] = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    y = fwht_blocks(x, b)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, reference(x, b))


def test_matches_numpy_implementation_at_4096():
    rng = np.random.default_rng(7)
    x32 = rng.integers(-(2**31), 2**31, size=6 * 4096, dtype=np.int32)
    np.testing.assert_array_equal(fwht_blocks(x32, 4096), fwht_numpy(x32, 4096))
    x64 = random_data(rng, 6 * 4096, bits=35)
    np.testing.assert_array_equal(fwht_blocks(x64, 4096), fwht_numpy(x64, 4096))


@pytest.mark.parametrize("b", ALL_B)
def test_every_block_size_matches_numpy_and_closed_form(b):
    # covers every pass plan of the fast path (radix 16/8/4/2 after the 64-element tiles)
    rng = np.random.default_rng(1000 + b)
    nblocks = 3 if b <= 4096 else 2
    x = random_data(rng, nblocks * b, bits=35)
    y = fwht_blocks(x, b)
    np.testing.assert_array_equal(y, fwht_numpy(x, b))
    blocks, out = x.reshape(-1, b), y.reshape(-1, b)
    for k in {0, 1 % b, b // 2, b - 1, int(rng.integers(b))}:
        np.testing.assert_array_equal(out[:, k], blocks @ hadamard_row(k, b))


def test_fwht_numpy_matches_explicit_matrix():
    rng = np.random.default_rng(3)
    for b in (1, 2, 8, 256):
        x = random_data(rng, 4 * b)
        np.testing.assert_array_equal(fwht_numpy(x, b), reference(x, b))


@pytest.mark.parametrize("b", [1, 2, 4, 8, 16, 32, 64, 128, 4096, MAX_BLOCK])
def test_involution_is_exact(b):
    rng = np.random.default_rng(b + 5)
    x = random_data(rng, 2 * b, bits=32)
    np.testing.assert_array_equal(fwht_blocks(fwht_blocks(x, b), b), b * x)


@pytest.mark.parametrize("b", [4, 64, 4096])
def test_linearity_is_exact(b):
    rng = np.random.default_rng(b + 11)
    u, v = random_data(rng, 3 * b), random_data(rng, 3 * b)
    np.testing.assert_array_equal(fwht_blocks(u + v, b), fwht_blocks(u, b) + fwht_blocks(v, b))
    np.testing.assert_array_equal(fwht_blocks(-3 * u, b), -3 * fwht_blocks(u, b))


@pytest.mark.parametrize("b", [8, 64, 4096])
def test_zero_block_stays_zero_and_isolated(b):
    rng = np.random.default_rng(b + 13)
    a, c = random_data(rng, b), random_data(rng, b)
    y = fwht_blocks(np.concatenate([a, np.zeros(b, dtype=np.int64), c]), b)
    np.testing.assert_array_equal(y[b : 2 * b], 0)
    np.testing.assert_array_equal(y[:b], reference(a, b))
    np.testing.assert_array_equal(y[2 * b :], reference(c, b))


@pytest.mark.parametrize("b", [16, 4096])
def test_delta_and_constant_blocks(b):
    k = 5 % b
    x = np.zeros(2 * b, dtype=np.int32)
    x[k] = 1  # first block: delta at k -> column k of H (= row k, H is symmetric)
    x[b:] = -7  # second block: constant -> all energy in output 0
    y = fwht_blocks(x, b)
    np.testing.assert_array_equal(y[:b], hadamard_row(k, b))
    expected = np.zeros(b, dtype=np.int64)
    expected[0] = -7 * b
    np.testing.assert_array_equal(y[b:], expected)


@pytest.mark.parametrize("b", [1, 4, 64])
def test_input_untouched_and_output_new(b):
    x = np.arange(4 * b, dtype=np.int64) - 3
    before = x.copy()
    y = fwht_blocks(x, b)
    np.testing.assert_array_equal(x, before)
    assert not np.shares_memory(x, y)
    y[:] = 0
    np.testing.assert_array_equal(x, before)


def test_non_contiguous_and_other_integer_dtypes():
    rng = np.random.default_rng(17)
    base = rng.integers(-(2**31), 2**31, size=2 * 3 * 128, dtype=np.int64)
    strided = base[::2]  # the vector kernels must not assume the caller's layout
    np.testing.assert_array_equal(fwht_blocks(strided, 128), reference(strided, 128))
    for dtype in (np.int8, np.int16, np.uint16, np.uint32, np.dtype(">i4"), np.dtype(">i8")):
        x = rng.integers(0, 100, size=2 * 64).astype(dtype)
        np.testing.assert_array_equal(fwht_blocks(x, 64), reference(x.astype(np.int64), 64))


def test_empty_input():
    y = fwht_blocks(np.zeros(0, dtype=np.int32), 64)
    assert y.dtype == np.int64 and y.shape == (0,)


@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(0, 8),
    nblocks=st.integers(1, 4),
    use_int32=st.booleans(),
    data=st.data(),
)
def test_property_inverse_and_dc(k, nblocks, use_int32, data):
    b = 1 << k
    lim = 2**31 if use_int32 else 2**35
    values = data.draw(
        st.lists(st.integers(-lim, lim - 1), min_size=b * nblocks, max_size=b * nblocks)
    )
    x = np.array(values, dtype=np.int32 if use_int32 else np.int64)
    y = fwht_blocks(x, b)
    # output 0 of each block is the block sum (row 0 of H is all ones)
    np.testing.assert_array_equal(y[::b], x.astype(np.int64).reshape(-1, b).sum(axis=1))
    np.testing.assert_array_equal(fwht_blocks(y, b), b * x.astype(np.int64))


@pytest.mark.parametrize("fn", [fwht_blocks, fwht_numpy])
@pytest.mark.parametrize(
    ("x", "b", "match"),
    [
        (np.zeros(12, np.int64), 3, "power of two"),
        (np.zeros(12, np.int64), 6, "power of two"),
        (np.zeros(12, np.int64), 0, "power of two"),
        (np.zeros(12, np.int64), -4, "power of two"),
        (np.zeros(2 * MAX_BLOCK, np.int64), 2 * MAX_BLOCK, "power of two"),
        (np.zeros(12, np.int64), 2.0, "integer"),
        (np.zeros(12, np.int64), True, "integer"),
        (np.zeros(12, np.int64), 8, "multiple"),
        (np.zeros(10, np.int32), 4, "multiple"),
        (np.zeros(16, np.float64), 4, "integer dtype"),
        (np.zeros(16, np.float32), 4, "integer dtype"),
        (np.zeros(16, np.bool_), 4, "integer dtype"),
        (np.zeros((4, 4), np.int64), 4, "1-D"),
        (np.zeros((), np.int64), 1, "1-D"),
        (np.zeros(16, np.uint64), 4, "int64"),
    ],
)
def test_invalid_arguments_raise_value_error(fn, x, b, match):
    with pytest.raises(ValueError, match=match):
        fn(x, b)


def test_bench_reports_both_rates():
    r = bench_fwht(b=256, n=1 << 12, repeats=1)
    assert set(r) == {"fwht_gbps", "numpy_fwht_gbps"}
    assert all(np.isfinite(v) and v > 0 for v in r.values())
