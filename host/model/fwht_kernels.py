"""numba kernels of the blockwise FWHT (host/model/fwht.py has the API and the derivation).

Loaded on the first transform, not at import (host/model/lazy.py).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LANES = 8  # int64 lanes per vector: one zmm register with AVX-512 (LLVM splits it elsewhere)
TILE = LANES * LANES  # elements handled by the tile kernel (strides 1..32)

_I32 = ir.IntType(32)
_V_I64 = ir.VectorType(ir.IntType(64), LANES)
_V_I32 = ir.VectorType(_I32, LANES)


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
    perm = ir.Constant(_V_I32, [j ^ h for j in range(LANES)])
    partner = builder.shuffle_vector(v, ir.Constant(_V_I64, None), perm)
    high = ir.Constant(ir.VectorType(ir.IntType(1), LANES), [bool(j & h) for j in range(LANES)])
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
                idx = builder.add(xoff, ir.Constant(xoff.type, LANES * k))
                v = builder.load(_vec_ptr(context, builder, signature.args[0], xa, idx, load_ty))
                v.align = align
                if load_ty is _V_I32:
                    v = builder.sext(v, _V_I64)
                for h in (1, 2, 4):
                    v = _lane_stage(builder, v, h)
                vs.append(v)
            for k, v in enumerate(_butterflies(builder, vs)):
                idx = builder.add(yoff, ir.Constant(yoff.type, LANES * k))
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
def fwht_small_inplace(y, b):
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
def fwht_tiles(x, b, y):
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
            for j in range(i, i + h, LANES):
                _pass16(y, j, h)
    elif radix == 8:
        for i in range(lo, hi, 8 * h):
            for j in range(i, i + h, LANES):
                _pass8(y, j, h)
    elif radix == 4:
        for i in range(lo, hi, 4 * h):
            for j in range(i, i + h, LANES):
                _pass4(y, j, h)
    else:
        for i in range(lo, hi, 2 * h):
            for j in range(i, i + h, LANES):
                _pass2(y, j, h)


@numba.njit(cache=True, nogil=True)
def fwht_large(x, b, y, radices):
    # b >= 64: 64-element tiles (strides 1..32), then one pass per entry of radices (strides
    # 64, 64*r0, ...). The tiles and the first pass run chunk by chunk (4 KiB of int64 at
    # b=4096) while the chunk is still in L1; the later passes run over the block (L1/L2).
    n = x.shape[0]
    chunk = TILE * radices[0] if radices.shape[0] > 0 else TILE
    for o in range(0, n, b):
        for c in range(o, o + b, chunk):
            for g in range(c, c + chunk, TILE):
                _tile64(x, g, y, g)
            if radices.shape[0] > 0:
                _radix_pass(y, c, c + chunk, TILE, radices[0])
        h = chunk
        for k in range(1, radices.shape[0]):
            _radix_pass(y, o, o + b, h, radices[k])
            h *= radices[k]


def plan(b: int) -> np.ndarray:
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
    if TILE * int(np.prod(radices)) != b:  # the kernels have no bounds checks: never guess
        raise RuntimeError(f"internal error: pass plan {radices} does not cover b = {b}")
    return np.array(radices, dtype=np.int64)
