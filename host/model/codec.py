"""Encode (TX) and decode (RX) of one op's chunk: the datapath order of the gateware.

encode: float32 -> fixed (shared exponent) -> zero pad to whole blocks -> random
        signs -> blockwise FWHT -> saturate to the wire width
decode: reduced packets (missing ones zero) -> blockwise FWHT -> divide by B
        (plain) or by the received elements of the block (unbiased) -> signs ->
        fixed -> float32
Exact integer arithmetic throughout; docs/numerics.md states every step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optireduce.host.model.fwht import fwht_blocks
from optireduce.host.model.lazy import lazy_module
from optireduce.host.model.quantize import dequantize, quantize
from optireduce.host.model.signs import apply_signs
from optireduce.params import NicParams

kernels = lazy_module("optireduce.host.model.kernels")  # numba loads on first use


def div_round(t: np.ndarray, d: np.ndarray | int) -> np.ndarray:
    """t / d rounded half away from zero, exactly (d > 0; |t| < 2^61)."""
    t = np.asarray(t, dtype=np.int64)
    d = np.asarray(d, dtype=np.int64)
    shape = np.broadcast_shapes(t.shape, d.shape)
    if d.size == 1 and t.shape == shape:  # one divisor: a single row
        t2, d1 = t.reshape(1, -1), d.reshape(1)
    elif t.ndim == 2 and d.shape == (t.shape[0], 1):  # a divisor per row (decode, aggregator)
        t2, d1 = t, d.reshape(-1)
    else:  # any other broadcast: one row per element
        t2 = np.broadcast_to(t, shape).reshape(-1, 1)
        d1 = np.broadcast_to(d, shape).reshape(-1)
    out = np.empty(t2.shape, dtype=np.int64)
    kernels.div_round_rows(t2, d1, out)
    return out.reshape(shape)


def saturate(v: np.ndarray, limit: int) -> tuple[np.ndarray, int]:
    """Clamp to +-limit; the count of clamped elements is the saturation counter."""
    if isinstance(v, np.ndarray) and v.dtype == np.int64 and v.ndim == 1:
        over = int(kernels.count_above(v, limit))
    else:
        over = int(np.count_nonzero(np.abs(v) > limit))
    return (np.clip(v, -limit, limit) if over else v), over


class Encoded(NamedTuple):
    y: np.ndarray  # int64, padded length, |y| <= wire_max
    sat_quantize: int
    sat_transform: int
    nonfinite: int


def encode(x: np.ndarray, exponent: int, op_id: int, p: NicParams) -> Encoded:
    n = len(x)
    qr = quantize(x, exponent, p)
    q = np.zeros(p.padded_len(n), dtype=np.int64)
    q[:n] = qr.q
    if p.rht:
        q = fwht_blocks(apply_signs(q, p.seed, op_id), p.b)
    y, sat = saturate(q, p.wire_max)
    return Encoded(y, qr.saturated, sat, qr.nonfinite)


class Decoded(NamedTuple):
    x: np.ndarray  # float32, the op's n elements
    sat_output: int
    empty_blocks: int  # blocks with no reduced packet at all (decoded as zeros)


def decode(
    z: np.ndarray, have: np.ndarray, n: int, exponent: int, op_id: int, p: NicParams
) -> Decoded:
    """z: reduced values (padded length, missing packets already zero); have: per packet."""
    ppb = p.packets_per_block
    kept = have.reshape(-1, ppb).sum(axis=1)  # received packets per block
    empty = int(np.count_nonzero(kept == 0))
    if p.rht:
        t = fwht_blocks(z, p.b).reshape(-1, p.b)
        if p.estimator == "unbiased":
            d = np.maximum(kept, 1)[:, None] * p.p  # received elements of the block
        else:
            d = p.b
        v = apply_signs(div_round(t, d).ravel(), p.seed, op_id)
    else:
        v = z
    out = dequantize(v[:n], exponent)
    return Decoded(out.x, out.saturated, empty)
