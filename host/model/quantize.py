"""float32 <-> fixed point with a shared exponent, as the gateware does it.

Both directions work on the IEEE-754 bit fields with integer shifts (no float
arithmetic), so the gateware converters can copy them step for step: the per-element
steps are the numba kernels in host/model/kernels.py. The tests check them against float64
references. Rounding rules are in docs/numerics.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optireduce.host.model.lazy import lazy_module
from optireduce.params import NicParams

kernels = lazy_module("optireduce.host.model.kernels")  # numba loads on first use

EXP_MIN, EXP_MAX = -128, 127  # the exponent travels as an int8
FLT_MAX_BITS = 0x7F7FFFFF  # largest finite float32 bit pattern (kernels.FLT_MAX_BITS)


def _f32_bits(x: np.ndarray) -> np.ndarray:
    """The IEEE-754 bit patterns of x as float32 (uint32, flat)."""
    return np.ascontiguousarray(np.asarray(x).ravel(), dtype=np.float32).view(np.uint32)


def propose_exponent(x: np.ndarray, p: NicParams) -> int:
    """Smallest-step exponent E for which every finite x quantizes without saturating.

    With x_max = 1.f * 2^e: E = e + 2 - w_in, one more if x_max rounds up to
    2^(w_in-1), clamped to int8. Workers agree on the op's exponent as the max
    of their proposals (see agree_exponent).
    """
    m = int(kernels.max_finite_magnitude(_f32_bits(x)))
    if m == 0:  # no finite value, or all zero
        return 0
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
    bits = _f32_bits(x)
    q = np.empty(bits.shape[0], dtype=np.int64)
    saturated, nonfinite = kernels.quantize_bits(bits, int(exponent), p.q_max, q)
    return QuantizeResult(q, int(saturated), int(nonfinite))


class DequantizeResult(NamedTuple):
    x: np.ndarray  # float32
    saturated: int  # magnitudes above FLT_MAX, clamped to +-FLT_MAX


def dequantize(v: np.ndarray, exponent: int) -> DequantizeResult:
    """float32 nearest to v * 2^E (ties to even), subnormals exact, overflow clamped."""
    v = np.asarray(v, dtype=np.int64).ravel()  # ravel: contiguous
    if kernels.max_abs_at_least(v, 1 << 53):
        raise ValueError("dequantize: |v| must stay below 2^53")
    bits = np.empty(v.shape[0], dtype=np.uint32)
    saturated = kernels.dequantize_bits(v, int(exponent), bits)
    return DequantizeResult(bits.view(np.float32), int(saturated))
