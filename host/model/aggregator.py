"""Owner-side aggregation of phase 1: per packet slot a sum, a count and a bitmap.

The owner emits the mean of the contributions received (sum / n, rounded half
away from zero): the unbiased estimate of the full mean, and within the wire
width whatever n is. The gateware divides through a reciprocal table; the
quotient is the same exact integer (docs/numerics.md).
"""

from __future__ import annotations

import numpy as np

from optireduce.host.model.codec import div_round
from optireduce.params import NicParams


class Aggregator:
    """Slots of one op owned by `rank`: packet indices rank, rank + N, rank + 2N, ..."""

    def __init__(self, p: NicParams, rank: int, world: int, n_packets: int) -> None:
        self.rank, self.world = rank, world
        self.slots = np.arange(rank, n_packets, world)
        self.acc = np.zeros((len(self.slots), p.p), dtype=np.int64)
        self.count = np.zeros(len(self.slots), dtype=np.int64)
        self.bitmap = np.zeros((len(self.slots), world), dtype=bool)

    def row(self, pkt_index: int) -> int:
        return pkt_index // self.world

    def add(self, pkt_index: int, sender: int, values: np.ndarray) -> bool:
        """Add one contribution; False (and nothing changed) if it is a duplicate."""
        r = self.row(pkt_index)
        if self.bitmap[r, sender]:
            return False
        self.bitmap[r, sender] = True
        self.count[r] += 1
        self.acc[r] += values
        return True

    def clear(self) -> int:
        """Forget every contribution; returns how many there were."""
        n = int(self.count.sum())
        self.acc[:] = 0
        self.count[:] = 0
        self.bitmap[:] = False
        return n

    def means(self) -> np.ndarray:
        """Mean of the received contributions per slot (a slot with none gives zeros)."""
        return div_round(self.acc, np.maximum(self.count, 1)[:, None])


def reciprocal_shift(p: NicParams) -> int:
    """s for which the reciprocal-table quotient is exact for every sum and count."""
    return p.w_acc + 2 + (2 * p.n_max - 1).bit_length()


def reciprocal_table(p: NicParams) -> list[int]:
    """ceil(2^s / 2n) for n = 0..n_max (entry 0 unused): the gateware's divider ROM."""
    s = reciprocal_shift(p)
    return [0] + [-(-(1 << s) // (2 * n)) for n in range(1, p.n_max + 1)]


def mean_by_reciprocal(total: int, n: int, p: NicParams, table: list[int] | None = None) -> int:
    """The owner's mean as the gateware computes it: multiply and shift, no divider."""
    m = (table or reciprocal_table(p))[n]
    mag = ((2 * abs(total) + n) * m) >> reciprocal_shift(p)
    return -mag if total < 0 else mag
