"""numba kernels of the per-element steps: quantize, dequantize, random signs, rounding division.

Each kernel is one scalar loop that does, element by element, exactly the integer steps of
docs/numerics.md (sections 2, 3, 6 and 7), so it reads like the gateware it models and makes
no temporaries. The wrappers in quantize.py, signs.py and codec.py convert the inputs, allocate
the outputs and keep the public signatures. Everything is int64 (the widest value is a mantissa
shifted left by 38 bits, below 2^62); the callers guarantee the documented input ranges.
Single-threaded on purpose: the model runs many workers and tests side by side.
"""

from __future__ import annotations

import math

import numba
import numpy as np

FLT_MAX_BITS = 0x7F7FFFFF
MASK = 0xFFFF


# --------------------------------------------------------------------------- float32 <-> fixed


@numba.njit(cache=True, nogil=True)
def max_finite_magnitude(bits):
    """Largest (e_f << 23 | f) over the finite float32 bit patterns: ordered like |x|."""
    top = 0
    for i in range(bits.shape[0]):
        mag = np.int64(bits[i]) & 0x7FFFFFFF
        if mag < 0x7F800000 and mag > top:  # e_f == 0xFF (inf, NaN) is skipped
            top = mag
    return top


@numba.njit(cache=True, nogil=True)
def quantize_bits(bits, exponent, q_max, q):
    """q[i] = the fixed-point value of float32 bit pattern bits[i] (numerics.md section 2).

    Returns (saturated, nonfinite). Shifts are clamped like the gateware's: a left shift of
    38 already exceeds any q_max, a right shift of 25 or more already rounds to 0.
    """
    saturated = 0
    nonfinite = 0
    for i in range(bits.shape[0]):
        b = np.int64(bits[i])
        ef = (b >> 23) & 0xFF
        frac = b & 0x7FFFFF
        if ef == 0xFF:
            nonfinite += 1
            mag = q_max + 1 if frac == 0 else 0  # inf saturates, NaN -> 0
        else:
            if ef == 0:  # subnormal: no hidden bit, exponent of the smallest normal
                mant = frac
                shift = -149 - exponent
            else:
                mant = frac | (1 << 23)
                shift = ef - 150 - exponent
            if shift >= 0:
                mag = mant << min(shift, 38)
            else:
                right = min(-shift, 40)
                mag = (mant + (1 << (right - 1))) >> right  # round half away from zero
        if mag > q_max:
            saturated += 1
            mag = q_max
        q[i] = -mag if b >> 31 else mag
    return saturated, nonfinite


@numba.njit(cache=True, nogil=True)
def max_abs_at_least(v, limit):
    """True if some |v[i]| >= limit (int64 -2^63 included: its magnitude does not fit)."""
    for i in range(v.shape[0]):
        x = v[i]
        if x >= limit or x <= -limit:
            return True
    return False


@numba.njit(cache=True, nogil=True)
def dequantize_bits(v, exponent, out):
    """out[i] = float32 bits nearest v[i] * 2^exponent, ties to even (numerics.md section 7).

    Needs |v| < 2^53 (checked by the caller). Returns the count clamped to +-FLT_MAX.
    """
    saturated = 0
    for i in range(v.shape[0]):
        x = v[i]
        m = -x if x < 0 else x
        if m == 0:
            out[i] = 0
            continue
        # bit length of |v| (the gateware's priority encoder): exact through float64,
        # since |v| < 2^53
        length = math.frexp(float(m))[1]
        u = max(length - 24 + exponent, -149)  # exponent of the result's last kept bit
        k = u - exponent  # > 0: drop k bits with rounding; <= 0: exact left shift
        if k > 0:
            kr = min(k, 62)
            q = m >> kr
            rem = m - (q << kr)
            half = np.int64(1) << (kr - 1)
            if rem > half or (rem == half and (q & 1) == 1):  # nearest, ties to even
                q += 1
            kept = q
        else:
            kept = m << min(-k, 62)
        if kept >= 1 << 24:  # rounding carried into a new bit
            kept >>= 1
            u += 1
        bits = ((u + 149) << 23) + kept
        if bits > FLT_MAX_BITS:
            saturated += 1
            bits = FLT_MAX_BITS
        if x < 0:
            bits |= 1 << 31
        out[i] = bits
    return saturated


# --------------------------------------------------------------------------- random signs


@numba.njit(cache=True, nogil=True, inline="always")
def _speck(x, y, rk):
    # Speck32/64 rounds on 16-bit words held in int64; the masks keep exactly the bits the
    # uint32 numpy formulation kept, so inputs wider than 16 bits give the same words too
    for j in range(rk.shape[0]):
        x = (((((x >> 7) | (x << 9)) & MASK) + y) & MASK) ^ rk[j]
        y = (((y << 2) | (y >> 14)) & MASK) ^ x
    return x, y


@numba.njit(cache=True, nogil=True)
def speck_encrypt_words(x, y, rk, ox, oy):
    """ox, oy = Speck32/64 encryption of the word pairs (x, y) under round keys rk."""
    for i in range(x.shape[0]):
        ox[i], oy[i] = _speck(np.int64(x[i]), np.int64(y[i]), rk)


@numba.njit(cache=True, nogil=True, inline="always")
def _sign_word(ctr, rk):
    # the 32 signs of counter ctr: Speck32/64_K(ctr), high word first
    x, y = _speck((ctr >> 16) & MASK, ctr & MASK, rk)
    return (x << 16) | y


@numba.njit(cache=True, nogil=True)
def sign_bits_run(rk, start, out):
    """out[j] = sign bit of element start + j: one cipher call per 32 elements."""
    n = out.shape[0]
    j = 0
    while j < n:
        ctr = (start + j) >> 5
        word = _sign_word(ctr, rk)
        end = min(n, ((ctr + 1) << 5) - start)  # the last element this counter covers
        for i in range(j, end):
            out[i] = (word >> ((start + i) & 31)) & 1
        j = end


@numba.njit(cache=True, nogil=True)
def apply_signs_run(v, rk, out):
    """out[i] = -v[i] where element i's sign bit is 1, else v[i] (elements from 0)."""
    n = v.shape[0]
    for j in range(0, n, 32):
        word = _sign_word(j >> 5, rk)
        for i in range(j, min(n, j + 32)):
            s = -((word >> (i & 31)) & 1)  # 0 or -1: negate without a branch on a random bit
            out[i] = (v[i] ^ s) - s


# --------------------------------------------------------------------------- division, clamp


@numba.njit(cache=True, nogil=True)
def div_round_rows(t, d, out):
    """out[r, i] = t[r, i] / d[r] rounded half away from zero: sign(t) floor((2|t| + d) / 2d)."""
    for r in range(t.shape[0]):
        dr = d[r]
        two_d = 2 * dr
        for i in range(t.shape[1]):
            x = t[r, i]
            mag = (2 * (-x if x < 0 else x) + dr) // two_d
            out[r, i] = -mag if x < 0 else mag


@numba.njit(cache=True, nogil=True)
def count_above(v, limit):
    """Elements with |v| > limit (|-2^63| wraps to itself, as numpy's abs does)."""
    over = 0
    for i in range(v.shape[0]):
        x = v[i]
        if (-x if x < 0 else x) > limit:
            over += 1
    return over
