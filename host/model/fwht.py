"""Blockwise unnormalized fast Walsh–Hadamard transform, exact in int64.

For each consecutive block of ``b`` elements, ``y = H_b @ x_block`` with the Sylvester
(natural-order) Hadamard matrix ``H_1 = [1]``, ``H_2k = [[H_k, H_k], [H_k, -H_k]]``. The
transform is its own inverse up to a factor ``b``: ``T(T(x)) == b * x``. The codec uses it on
the TX side (after the random signs) and on the RX side (before dividing by ``b``).

``fwht_blocks`` is the fast path (numba, one core, target >= 2 GB/s of int32 input at b=4096).
The butterflies are written as explicit 8-lane int64 vector code (LLVM IR through
``numba.extending.intrinsic``) because numba's auto-vectorizer can neither do the small-stride
stages (lane shuffles) nor keep the radix-8 passes in registers:

* a "tile" kernel reads 64 input elements (int32 or int64), does strides 1, 2, 4 inside each
  8-lane vector (permute + add) and strides 8, 16, 32 across the 8 vectors, and writes int64;
* the remaining strides are radix-16/8/4/2 passes over whole vectors (8 consecutive j at once);
* everything runs block by block, so a 4096-element int64 block (32 KiB) stays in L1/L2.

``fwht_numpy`` is the plain numpy version (the baseline in benchmarks, a second implementation
in tests). Values are exact while ``|x| * b < 2^63``; beyond that int64 wraps silently.
"""

from __future__ import annotations

import operator
import time

import numpy as np

from optireduce.host.model.lazy import lazy_module

__all__ = ["MAX_BLOCK", "bench_fwht", "fwht_blocks", "fwht_numpy"]

MAX_BLOCK = 65536  # largest block size accepted (2^16)

fwht_kernels = lazy_module("optireduce.host.model.fwht_kernels")


def _check_args(x, b) -> tuple[np.ndarray, int]:
    """Validate (x, b); return x as a C-contiguous native int32/int64 array and b as int."""
    if isinstance(b, (bool, np.bool_)):
        raise ValueError(f"block size b must be an integer, got {b!r}")
    try:
        b = operator.index(b)
    except TypeError:
        raise ValueError(f"block size b must be an integer, got {b!r}") from None
    if b < 1 or b > MAX_BLOCK or b & (b - 1):
        raise ValueError(f"block size b must be a power of two in 1..{MAX_BLOCK}, got {b}")
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-D array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"x must have an integer dtype, got {x.dtype}")
    if x.shape[0] % b:
        raise ValueError(f"len(x) = {x.shape[0]} is not a multiple of the block size b = {b}")
    if x.dtype == np.int32 or x.dtype == np.int64:  # native byte order only
        return np.ascontiguousarray(x), b
    try:  # small ints and uint32 widen exactly; uint64 does not fit
        return x.astype(np.int64, casting="safe"), b
    except TypeError:
        raise ValueError(f"dtype {x.dtype} does not convert exactly to int64") from None


def fwht_blocks(x: np.ndarray, b: int) -> np.ndarray:
    """Unnormalized natural-order Walsh–Hadamard transform of each block of ``b`` elements.

    x: 1-D integer array (int32 and int64 are used as they are; other integer dtypes that fit
    in int64 are widened first), ``len(x)`` a multiple of ``b``; b: a power of two in 1..65536.
    Returns a new int64 array (x is not modified). Exact while |values| * b < 2^63.
    Raises ValueError for any invalid argument.
    """
    x, b = _check_args(x, b)
    if b == 1 or x.shape[0] == 0:
        return x.astype(np.int64)  # always a copy
    if b < fwht_kernels.LANES:
        y = x.astype(np.int64)
        fwht_kernels.fwht_small_inplace(y, b)
        return y
    y = np.empty(x.shape[0], dtype=np.int64)
    if b < fwht_kernels.TILE:
        fwht_kernels.fwht_tiles(x, b, y)
    else:
        fwht_kernels.fwht_large(x, b, y, fwht_kernels.plan(b))
    return y


def fwht_numpy(x: np.ndarray, b: int) -> np.ndarray:
    """Same result as ``fwht_blocks``, in plain numpy: one reshape + add/sub per stage.

    The benchmark baseline ("naive numpy") and an independent second implementation for tests.
    """
    x, b = _check_args(x, b)
    y = x.astype(np.int64)
    w = np.empty_like(y)  # ping-pong buffer: two ufunc calls per stage, no temporaries
    h = 1
    while h < b:
        # each group of 2h consecutive elements [u | v] becomes [u + v | u - v]
        src, dst = y.reshape(-1, 2, h), w.reshape(-1, 2, h)
        np.add(src[:, 0], src[:, 1], out=dst[:, 0])
        np.subtract(src[:, 0], src[:, 1], out=dst[:, 1])
        y, w = w, y
        h *= 2
    return y


def bench_fwht(b: int = 4096, n: int = 1 << 22, repeats: int = 5) -> dict:
    """Throughput of fwht_blocks and fwht_numpy on n random int32 elements, one core.

    Best of ``repeats`` after one warm-up call each (JIT compile excluded); GB/s counts the
    input bytes (n * 4). fwht_blocks' time includes allocating its new output: at n = 2^22 the
    32 MiB of fresh pages cost the kernel about as long to zero as the transform itself.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    x = np.random.default_rng(0).integers(-(2**31), 2**31, size=n, dtype=np.int32)
    out = {}
    for key, fn in (("fwht_gbps", fwht_blocks), ("numpy_fwht_gbps", fwht_numpy)):
        fn(x, b)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(x, b)
            best = min(best, time.perf_counter() - t0)
        out[key] = x.nbytes / best / 1e9
    return out
