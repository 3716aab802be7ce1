"""float32 <-> fixed point with a shared exponent, as the gateware does it.

Both directions work on the IEEE-754 bit fields with integer shifts (no float
arithmetic), so the gateware converters can copy them step for step. The tests
check them against float64 references. Rounding rules are in docs/numerics.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optireduce.params import NicParams

EXP_MIN, EXP_MAX = -128, 127  # the exponent travels as an int8
FLT_MAX_BITS = 0x7F7FFFFF


def _fields(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    return bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF


def propose_exponent(x: np.ndarray, p: NicParams) -> int:
    """Smallest-step exponent E for which every finite x quantizes without saturating.

    With x_max = 1.f * 2^e: E = e + 2 - w_in, one more if x_max rounds up to
    2^(w_in-1), clamped to int8. Workers agree on the op's exponent as the max
    of their proposals (see agree_exponent).
    """
    _, ef, frac = _fields(np.asarray(x).ravel())
    finite = ef != 0xFF
    mag = ((ef << 23) | frac)[finite]  # ordered like |x| for finite floats
    if mag.size == 0 or mag.max() == 0:
        return 0
    m = int(mag.max())
    e_field, f = m >> 23, m & 0x7FFFFF
    e = e_field - 127 if e_field else f.bit_length() - 1 - 149
    exp = int(np.clip(e + 2 - p.w_in, EXP_MIN, EXP_MAX))
    top = np.array([m], dtype=np.uint32).view(np.float32)
    if exp < EXP_MAX and quantize(top, exp, p).saturated:  # rounding reached 2^(w_in-1)
        exp += 1
    return exp


def agree_exponent(proposals: list[int]) -> int:
    """The op's exponent: the largest proposal, so no worker's max saturates."""
    return max(proposals)


class QuantizeResult(NamedTuple):
    q: np.ndarray  # int64, |q| <= p.q_max
    saturated: int  # elements clamped to +-q_max (inf included)
    nonfinite: int  # NaN (-> 0) and inf (-> +-q_max)


def quantize(x: np.ndarray, exponent: int, p: NicParams) -> QuantizeResult:
    """q = sign(x) * floor(|x| * 2^-E + 1/2), clamped to +-q_max (round half away from zero)."""
    sign, ef, frac = _fields(np.asarray(x).ravel())
    mant = np.where(ef == 0, frac, frac | (1 << 23))  # value = mant * 2^(e2)
    e2 = np.where(ef == 0, 1, ef) - 150
    shift = e2 - exponent
    left = np.minimum(np.maximum(shift, 0), 38)  # mant < 2^24: 2^62 at most
    right = np.minimum(np.maximum(-shift, 0), 40)  # >= 25 already rounds to 0
    half = np.where(right > 0, np.left_shift(1, np.maximum(right - 1, 0)), 0)
    mag = np.where(shift >= 0, mant << left, (mant + half) >> right)
    nan = (ef == 0xFF) & (frac != 0)
    inf = (ef == 0xFF) & (frac == 0)
    mag = np.where(nan, 0, np.where(inf, p.q_max + 1, mag))
    over = mag > p.q_max
    mag = np.minimum(mag, p.q_max)
    q = np.where(sign == 1, -mag, mag)
    return QuantizeResult(q, int(over.sum()), int((nan | inf).sum()))


class DequantizeResult(NamedTuple):
    x: np.ndarray  # float32
    saturated: int  # magnitudes above FLT_MAX, clamped to +-FLT_MAX


def dequantize(v: np.ndarray, exponent: int) -> DequantizeResult:
    """float32 nearest to v * 2^E (ties to even), subnormals exact, overflow clamped."""
    v = np.asarray(v, dtype=np.int64).ravel()
    if v.size and int(np.abs(v).max()) >= 1 << 53:
        raise ValueError("dequantize: |v| must stay below 2^53")
    m = np.abs(v)
    length = np.frexp(m.astype(np.float64))[1].astype(np.int64)  # bit length, 0 for 0
    u = np.maximum(length - 24 + exponent, -149)  # exponent of the result's last kept bit
    k = u - exponent  # > 0: drop k bits with rounding; <= 0: exact left shift
    kr = np.clip(k, 0, 62)
    kl = np.clip(-k, 0, 62)
    q = m >> kr
    rem = m - (q << kr)
    half = np.where(kr > 0, np.left_shift(1, np.maximum(kr - 1, 0)), 0)
    up = (kr > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    kept = np.where(k > 0, q + up, m << kl)
    carry = kept >= 1 << 24  # rounding carried into a new bit
    kept = np.where(carry, kept >> 1, kept)
    u = u + carry
    bits = ((u + 149) << 23) + kept
    bits = np.where(m == 0, 0, bits)
    over = bits > FLT_MAX_BITS
    bits = np.minimum(bits, FLT_MAX_BITS) | np.where(v < 0, 1 << 31, 0)
    return DequantizeResult(bits.astype(np.uint32).view(np.float32), int(over.sum()))
