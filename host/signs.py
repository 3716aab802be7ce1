"""Counter-based random signs: Speck32/64 in counter mode.

sign(i) = bit (i mod 32) of Speck32/64_K(i div 32), K = (seed, op id). One block
cipher call gives 32 signs, so a lane needs one 22-round ARX core (16-bit adds,
xors, rotates: no multipliers) per 32 elements. Any element's sign is computable
on its own, which is what the decoder needs to undo them.
"""

from __future__ import annotations

import numpy as np

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
    """Encrypt word pairs (x, y), vectorized (uint32 arrays holding 16-bit values)."""
    x = np.asarray(x, dtype=np.uint32).copy()
    y = np.asarray(y, dtype=np.uint32).copy()
    for k in rk:
        x = (((((x >> 7) | (x << 9)) & MASK) + y) & MASK) ^ k
        y = (((y << 2) | (y >> 14)) & MASK) ^ x
    return x, y


def op_key(seed: int, op_id: int) -> tuple[int, int, int, int]:
    return ((op_id >> 16) & MASK, op_id & MASK, (seed >> 16) & MASK, seed & MASK)


def sign_bits(seed: int, op_id: int, start: int, n: int) -> np.ndarray:
    """1 where element start..start+n-1 of op op_id is negated, else 0 (uint8)."""
    if n <= 0:
        return np.zeros(0, dtype=np.uint8)
    rk = round_keys(op_key(seed, op_id))
    first, last = start >> 5, (start + n - 1) >> 5
    ctr = np.arange(first, last + 1, dtype=np.uint64)
    cx, cy = speck_encrypt((ctr >> 16) & MASK, ctr & MASK, rk)
    words = (cx.astype(np.uint64) << 16) | cy.astype(np.uint64)
    idx = np.arange(start, start + n, dtype=np.uint64)
    w = words[(idx >> 5) - first]
    return ((w >> (idx & 31)) & 1).astype(np.uint8)


def apply_signs(v: np.ndarray, seed: int, op_id: int) -> np.ndarray:
    """v with the op's random signs applied (its own inverse)."""
    s = sign_bits(seed, op_id, 0, len(v))
    return np.where(s == 1, -v, v)
