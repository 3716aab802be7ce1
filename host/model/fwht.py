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

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["MAX_BLOCK", "bench_fwht", "fwht_blocks", "fwht_numpy"]

MAX_BLOCK = 65536  # largest block size accepted (2^16)

_LANES = 8  # int64 lanes per vector: one zmm register with AVX-512 (LLVM splits it elsewhere)
_TILE = _LANES * _LANES  # elements handled by the tile kernel (strides 1..32)

_I32 = ir.IntType(32)
_V_I64 = ir.VectorType(ir.IntType(64), _LANES)
_V_I32 = ir.VectorType(_I32, _LANES)


# --------------------------------------------------------------------------- LLVM vector helpers


def _vec_ptr(context, builder, aryty, ary, index, vecty):
    """Pointer to the vector of ``vecty`` starting at element ``index`` of a contiguous array."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index], inbounds=True), vecty.as_pointer())


def _lane_stage(builder, v, h: int):
    """Butterfly of stride h (1, 2 or 4) between the lanes of one vector.

    out[j] = v[j] + v[j^h] where bit h of j is 0, v[j^h] - v[j] where it is 1: a lane permute
    plus one add of the conditionally negated vector, which LLVM turns into a permute and a
    masked subtract (cheaper than the add/sub/blend of the textbook form).
    """
    perm = ir.Constant(_V_I32, [j ^ h for j in range(_LANES)])
    partner = builder.shuffle_vector(v, ir.Constant(_V_I64, None), perm)
    high = ir.Constant(ir.VectorType(ir.IntType(1), _LANES), [bool(j & h) for j in range(_LANES)])
    return builder.add(partner, builder.select(high, builder.neg(v), v))


def _butterflies(builder, vs: list) -> list:
    """All radix-2 stages across a power-of-two list of vectors (element-wise, no shuffles)."""
    vs = list(vs)
    h = 1
    while h < len(vs):
        for i in range(0, len(vs), 2 * h):
            for j in range(i, i + h):
                a, c = vs[j], vs[j + h]
                vs[j], vs[j + h] = builder.add(a, c), builder.sub(a, c)
        h *= 2
    return vs


def _is_c_vector(ty, dtypes) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype in dtypes


def _make_tile(nvec: int):
    """Intrinsic tile(x, xo, y, yo): y[yo : yo + 8*nvec] = H_{8*nvec} @ x[xo : xo + 8*nvec].

    x is int32 (sign-extended on load, so the int32 -> int64 conversion costs no extra pass) or
    int64; y is int64. No bounds checks: the callers guarantee the ranges.
    """

    @intrinsic
    def tile(typingctx, x, xo, y, yo):
        if not (
            _is_c_vector(x, (types.int32, types.int64))
            and _is_c_vector(y, (types.int64,))
            and isinstance(xo, types.Integer)
            and isinstance(yo, types.Integer)
        ):
            return None
        sig = types.void(x, xo, y, yo)
        load_ty = _V_I32 if x.dtype == types.int32 else _V_I64
        align = x.dtype.bitwidth // 8

        def codegen(context, builder, signature, args):
            xa, xoff, ya, yoff = args
            vs = []
            for k in range(nvec):
                idx = builder.add(xoff, ir.Constant(xoff.type, _LANES * k))
                v = builder.load(_vec_ptr(context, builder, signature.args[0], xa, idx, load_ty))
                v.align = align
                if load_ty is _V_I32:
                    v = builder.sext(v, _V_I64)
                for h in (1, 2, 4):
                    v = _lane_stage(builder, v, h)
                vs.append(v)
            for k, v in enumerate(_butterflies(builder, vs)):
                idx = builder.add(yoff, ir.Constant(yoff.type, _LANES * k))
                ptr = _vec_ptr(context, builder, signature.args[2], ya, idx, _V_I64)
                builder.store(v, ptr, align=8)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _make_pass(radix: int):
    """Intrinsic step(y, j, h): radix-``radix`` butterflies in place on the 8-lane vectors at
    y[j + k*h], k < radix (log2(radix) stages of strides h .. h*radix/2 for 8 consecutive j).

    Loading all ``radix`` vectors before any store keeps the pass in registers (radix 16 uses
    16 of the 32 zmm registers), which the auto-vectorizer's interleaving does not.
    """

    @intrinsic
    def step(typingctx, y, j, h):
        if not (
            _is_c_vector(y, (types.int64,))
            and isinstance(j, types.Integer)
            and isinstance(h, types.Integer)
        ):
            return None
        sig = types.void(y, j, h)

        def codegen(context, builder, signature, args):
            ya, idx, hh = args
            ptrs = []
            for _ in range(radix):
                ptrs.append(_vec_ptr(context, builder, signature.args[0], ya, idx, _V_I64))
                idx = builder.add(idx, hh)
            vs = [builder.load(p) for p in ptrs]
            for v in vs:
                v.align = 8
            for p, v in zip(ptrs, _butterflies(builder, vs), strict=True):
                builder.store(v, p, align=8)
            return context.get_dummy_value()

        return sig, codegen

    return step


_tile8, _tile16, _tile32, _tile64 = (_make_tile(k) for k in (1, 2, 4, 8))
_pass2, _pass4, _pass8, _pass16 = (_make_pass(r) for r in (2, 4, 8, 16))


# --------------------------------------------------------------------------- numba kernels


@numba.njit(cache=True, nogil=True)
def _fwht_small_inplace(y, b):
    # b in (2, 4): too small for the 8-lane kernels, plain scalar radix-2
    n = y.shape[0]
    h = 1
    while h < b:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a = y[j]
                c = y[j + h]
                y[j] = a + c
                y[j + h] = a - c
        h *= 2


@numba.njit(cache=True, nogil=True)
def _fwht_tiles(x, b, y):
    # b in (8, 16, 32): one tile per block does the whole transform
    n = x.shape[0]
    if b == 8:
        for o in range(0, n, 8):
            _tile8(x, o, y, o)
    elif b == 16:
        for o in range(0, n, 16):
            _tile16(x, o, y, o)
    else:
        for o in range(0, n, 32):
            _tile32(x, o, y, o)


@numba.njit(cache=True, nogil=True)
def _radix_pass(y, lo, hi, h, radix):
    # one pass of radix-`radix` butterflies at stride h over y[lo:hi] (a multiple of radix*h)
    if radix == 16:
        for i in range(lo, hi, 16 * h):
            for j in range(i, i + h, _LANES):
                _pass16(y, j, h)
    elif radix == 8:
        for i in range(lo, hi, 8 * h):
            for j in range(i, i + h, _LANES):
                _pass8(y, j, h)
    elif radix == 4:
        for i in range(lo, hi, 4 * h):
            for j in range(i, i + h, _LANES):
                _pass4(y, j, h)
    else:
        for i in range(lo, hi, 2 * h):
            for j in range(i, i + h, _LANES):
                _pass2(y, j, h)


@numba.njit(cache=True, nogil=True)
def _fwht_large(x, b, y, radices):
    # b >= 64: 64-element tiles (strides 1..32), then one pass per entry of radices (strides
    # 64, 64*r0, ...). The tiles and the first pass run chunk by chunk (4 KiB of int64 at
    # b=4096) while the chunk is still in L1; the later passes run over the block (L1/L2).
    n = x.shape[0]
    chunk = _TILE * radices[0] if radices.shape[0] > 0 else _TILE
    for o in range(0, n, b):
        for c in range(o, o + b, chunk):
            for g in range(c, c + chunk, _TILE):
                _tile64(x, g, y, g)
            if radices.shape[0] > 0:
                _radix_pass(y, c, c + chunk, _TILE, radices[0])
        h = chunk
        for k in range(1, radices.shape[0]):
            _radix_pass(y, o, o + b, h, radices[k])
            h *= radices[k]


def _plan(b: int) -> np.ndarray:
    """Radices of the passes after the 64-element tiles: as few passes as possible, radix 8
    where it divides, radix 16 to absorb a remainder of one stage (b=4096 -> [8, 8])."""
    rest = b.bit_length() - 1 - 6  # stages left after the tiles
    radices = []
    if rest % 3 == 1 and rest >= 4:
        radices.append(16)
        rest -= 4
    radices += [8] * (rest // 3)
    if rest % 3:
        radices.append(1 << (rest % 3))
    if _TILE * int(np.prod(radices)) != b:  # the kernels have no bounds checks: never guess
        raise RuntimeError(f"internal error: pass plan {radices} does not cover b = {b}")
    return np.array(radices, dtype=np.int64)


# --------------------------------------------------------------------------- public API


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
    if b < _LANES:
        y = x.astype(np.int64)
        _fwht_small_inplace(y, b)
        return y
    y = np.empty(x.shape[0], dtype=np.int64)
    if b < _TILE:
        _fwht_tiles(x, b, y)
    else:
        _fwht_large(x, b, y, _plan(b))
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
