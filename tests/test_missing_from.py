"""OpStats.p1_missing_from / p2_missing_from: per sender, what never arrived, as the
dropped packets say (the training runs split their losses by sender with these)."""

from __future__ import annotations

import numpy as np

from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.params import NicParams


def test_missing_packets_are_charged_to_their_sender():
    world, p = 4, NicParams(t_b_us=2_000)
    n = 3 * p.b  # 48 packets of 256: 12 slots per owner
    xs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(world)]
    # phase 1: packets 1, 5, 9 go to owner 1; from sender 2 lose two of them, from 3 one
    # phase 2: owner 2's reduced packets 2 and 6 to rank 0, owner 3's packet 3 to rank 1
    lost = [(1, 2, 1, 1), (1, 2, 1, 5), (1, 3, 1, 9), (2, 2, 0, 2), (2, 2, 0, 6), (2, 3, 1, 3)]
    _, stats = simulate_allreduce(xs, params=p, lost=lost, calibrate=False)
    want_p1 = {r: [0] * world for r in range(world)}
    want_p2 = {r: [0] * world for r in range(world)}
    want_p1[1][2], want_p1[1][3] = 2, 1
    want_p2[0][2], want_p2[1][3] = 2, 1
    for r in range(world):
        (op,) = stats.per_worker[r]
        assert op.p1_missing_from == want_p1[r]
        assert op.p2_missing_from == want_p2[r]
        assert sum(op.p1_missing_from) == op.lost_phase1
        assert sum(op.p2_missing_from) == op.lost_phase2
