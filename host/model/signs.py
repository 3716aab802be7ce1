"""Counter-based random signs: Speck32/64 in counter mode.

sign(i) = bit (i mod 32) of Speck32/64_K(i div 32), K = (seed, op id). One block
cipher call gives 32 signs, so a lane needs one 22-round ARX core (16-bit adds,
xors, rotates: no multipliers) per 32 elements. Any element's sign is computable
on its own, which is what the decoder needs to undo them. The per-element loops are
numba kernels (host/model/kernels.py); the key schedule stays here in plain Python.
"""

from __future__ import annotations

import functools

import numpy as np

from optireduce.host.model.lazy import lazy_module

kernels = lazy_module("optireduce.host.model.kernels")  # numba loads on first use

ROUNDS = 22
MASK = 0xFFFF


def _ror(x: int, r: int) -> int:
    return ((x >> r) | (x << (16 - r))) & MASK


def _rol(x: int, r: int) -> int:
    return ((x << r) | (x >> (16 - r))) & MASK


def round_keys(key: tuple[int, int, int, int]) -> list[int]:
    """Speck32/64 key schedule; key = (l2, l1, l0, k0) as the designers print it."""
    l2, l1, l0, k = key
    ls = [l0, l1, l2]
    ks = [k]
    for i in range(ROUNDS - 1):
        ls.append(((ks[i] + _ror(ls[i], 7)) & MASK) ^ i)
        ks.append(_rol(ks[i], 2) ^ ls[i + 3])
    return ks


def speck_encrypt(x: np.ndarray, y: np.ndarray, rk: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Encrypt word pairs (x, y) elementwise (uint32 arrays holding 16-bit values)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.uint32), np.asarray(y, dtype=np.uint32))
    ox = np.empty(x.shape, dtype=np.uint32)
    oy = np.empty(y.shape, dtype=np.uint32)
    kernels.speck_encrypt_words(x.ravel(), y.ravel(), _keys(rk), ox.reshape(-1), oy.reshape(-1))
    return ox, oy


def _keys(rk: list[int]) -> np.ndarray:
    return np.asarray(rk, dtype=np.int64).reshape(-1)


@functools.lru_cache(maxsize=256)
def _op_keys(seed: int, op_id: int) -> np.ndarray:
    # every worker encodes and decodes the same ops: schedule each key once (read-only)
    rk = _keys(round_keys(op_key(seed, op_id)))
    rk.setflags(write=False)
    return rk


def op_key(seed: int, op_id: int) -> tuple[int, int, int, int]:
    return ((op_id >> 16) & MASK, op_id & MASK, (seed >> 16) & MASK, seed & MASK)


def sign_bits(seed: int, op_id: int, start: int, n: int) -> np.ndarray:
    """1 where element start..start+n-1 of op op_id is negated, else 0 (uint8)."""
    if n <= 0:
        return np.zeros(0, dtype=np.uint8)
    out = np.empty(n, dtype=np.uint8)
    kernels.sign_bits_run(_op_keys(int(seed), int(op_id)), int(start), out)
    return out


def apply_signs(v: np.ndarray, seed: int, op_id: int) -> np.ndarray:
    """v with the op's random signs applied (its own inverse)."""
    if isinstance(v, np.ndarray) and v.dtype == np.int64 and v.ndim == 1:
        out = np.empty(len(v), dtype=np.int64)
        kernels.apply_signs_run(v, _op_keys(int(seed), int(op_id)), out)
        return out
    s = sign_bits(seed, op_id, 0, len(v))  # other dtypes: numpy's negation
    return np.where(s == 1, -v, v)
