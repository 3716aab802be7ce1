"""Receiver side of phase 2: reduced packets placed by index, with their contributor counts."""

from __future__ import annotations

import numpy as np

from optireduce.params import NicParams


class GatherBuffer:
    def __init__(self, p: NicParams, n_packets: int) -> None:
        self.z = np.zeros((n_packets, p.p), dtype=np.int64)
        self.have = np.zeros(n_packets, dtype=bool)
        self.contributors = np.zeros(n_packets, dtype=np.int64)

    def place(self, pkt_index: int, values: np.ndarray, contributors: int) -> bool:
        """Store one reduced packet; False (nothing changed) if it is already here."""
        if self.have[pkt_index]:
            return False
        self.z[pkt_index] = values
        self.have[pkt_index] = True
        self.contributors[pkt_index] = contributors
        return True

    def histogram(self, world: int) -> np.ndarray:
        """Packets per contributor count; index 0 counts the missing packets."""
        return np.bincount(np.where(self.have, self.contributors, 0), minlength=world + 1)
