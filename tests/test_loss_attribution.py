"""loss_attribution: each missing packet charged to the straggler, the per-packet delay or our
processing, on hand-made worlds of 2 ranks and one op of 4 packets (rank 0 owns packets 0
and 2, rank 1 packets 1 and 3), T1 = T2 = 100 us, every clock's origin at 0."""

from __future__ import annotations

import numpy as np

from optireduce.experiments.loss_attribution import attribute, split_by_step
from optireduce.ubt import DROP_REASONS

LATE, FUTURE = DROP_REASONS.index("late"), DROP_REASONS.index("future_op")
OK = -1  # an arrival the engine accepted


def _rank(start, p1_end, end, p1_miss, p2_miss, sent, arrived):
    return {
        "op_id": np.array([7]), "op_step": np.array([0]), "n_packets": np.array([4]),
        "p1_expected": np.array([2]), "start_us": np.array([start]),
        "phase1_end_us": np.array([p1_end]), "end_us": np.array([end]),
        "phase1_timeout_us": np.array([100]), "phase2_timeout_us": np.array([100]),
        "p1_missing_from": np.array([p1_miss]), "p2_missing_from": np.array([p2_miss]),
        "trace_origin_us": np.array(0),
        "trace_sent": np.array(sent, dtype=np.int64).reshape(-1, 7),
        "trace_arrived": np.array(arrived, dtype=np.int64).reshape(-1, 7),
    }  # fmt: skip


def _causes(got: dict) -> dict:
    return {(int(r[0]), int(r[1]), int(r[4])): int(r[5]) for r in got["missing"]}


def test_straggler_and_delay():
    # Rank 1 sleeps 300 us, then starts (tick 300), sends its contributions 0 (delay 10) and
    # 2 (delay 150) to rank 0, has rank 0's already (phase 1 complete at 300) and sends its
    # reduced packets 1 and 3 (delay 10) at 300. Rank 0 starts at 0, ends phase 1 at its
    # deadline 100 and phase 2 at its deadline 200 (anchor max(100, 0 + T1)), missing all
    # four. Without processing: the same. Without the sleep: rank 1 would start at 0,
    # contribution 0 would come at 10 (in time), 2 at 150 (late: the delay alone), and the
    # reduced packets at 10 + 10 (in time): 0, 1 and 3 are the straggler's, 2 the delay's.
    r0 = _rank(
        0, 100, 200, [0, 2], [0, 2],
        sent=[(7, 1, 1, 1, 0, 10, 0), (7, 1, 1, 3, 0, 10, 0),
              (7, 2, 1, 0, 100, 10, 0), (7, 2, 1, 2, 100, 50, 0)],
        arrived=[(7, 1, 1, 0, 310, LATE, 0), (7, 1, 1, 2, 450, LATE, 0),
                 (7, 2, 1, 1, 310, LATE, 0), (7, 2, 1, 3, 310, LATE, 0)],
    )  # fmt: skip
    r1 = _rank(
        300, 300, 300, [0, 0], [0, 0],
        sent=[(7, 1, 0, 0, 300, 10, 0), (7, 1, 0, 2, 300, 150, 0),
              (7, 2, 0, 1, 300, 10, 0), (7, 2, 0, 3, 300, 10, 0)],
        arrived=[(7, 1, 0, 1, 300, OK, 0), (7, 1, 0, 3, 300, OK, 0),
                 (7, 2, 0, 0, 300, OK, 0), (7, 2, 0, 2, 300, OK, 0)],
    )  # fmt: skip
    sleep = np.array([[0], [300]])
    got = attribute([r0, r1], 2, sleep)
    assert _causes(got) == {(1, 0, 0): 0, (1, 0, 2): 1, (2, 0, 1): 0, (2, 0, 3): 0}
    row = next(r for r in got["missing"] if r[0] == 1 and r[4] == 2)
    # (phase, receiver, op index, sender, pkt, cause, late, delay, skew, window, verdict)
    assert row.tolist() == [1, 0, 0, 1, 2, 1, 450 - 100, 150, 300, 100, LATE]
    out = split_by_step([r0, r1], 2, 1, sleep)
    assert out["entries_lost_straggler"] == 2 / 8 and out["entries_lost_processing"] == 0.0
    assert out["contributions_lost_straggler"] == 1 / 4
    assert out["contributions_lost_delay"] == 1 / 4
    # Without the sleep in the account, rank 1's late start is ours.
    assert set(_causes(attribute([r0, r1], 2)).values()) == {1, 2}


def test_processing_and_unattributed():
    # Nobody sleeps. Rank 1 ends phase 1 complete at 10 but its engine sends reduced packet
    # 3 at 195 (delay 10: it comes at 205, after rank 0's phase-2 end at 200): ours. Packet 1
    # (sent at 10) is in. Without processing it would have been sent at 10.
    r0 = _rank(
        0, 100, 200, [0, 0], [0, 1],
        sent=[(7, 1, 1, 1, 0, 10, 0), (7, 1, 1, 3, 0, 10, 0),
              (7, 2, 1, 0, 100, 10, 0), (7, 2, 1, 2, 100, 10, 0)],
        arrived=[(7, 1, 1, 0, 10, OK, 0), (7, 1, 1, 2, 10, OK, 0),
                 (7, 2, 1, 1, 20, OK, 0), (7, 2, 1, 3, 205, LATE, 0)],
    )  # fmt: skip
    r1 = _rank(
        0, 10, 110, [0, 0], [0, 0],
        sent=[(7, 1, 0, 0, 0, 10, 0), (7, 1, 0, 2, 0, 10, 0),
              (7, 2, 0, 1, 10, 10, 0), (7, 2, 0, 3, 195, 10, 0)],
        arrived=[(7, 1, 0, 1, 10, OK, 0), (7, 1, 0, 3, 10, OK, 0),
                 (7, 2, 0, 0, 110, OK, 0), (7, 2, 0, 2, 110, OK, 0)],
    )  # fmt: skip
    assert _causes(attribute([r0, r1], 2)) == {(2, 0, 3): 2}
    # The stats say 2 missing from rank 1 where the trace shows 1: unattributed.
    r0["p2_missing_from"] = np.array([[0, 2]])
    assert _causes(attribute([r0, r1], 2)) == {(2, 0, 3): 3}
    # A send missing from the trace: unattributed too.
    r0["p2_missing_from"] = np.array([[0, 1]])
    r1["trace_sent"] = r1["trace_sent"][:3]
    assert _causes(attribute([r0, r1], 2)) == {(2, 0, 3): 3}


def test_a_receiver_behind_by_its_window_drops_a_future_op():
    # Rank 0 has not completed op k - rx_window when rank 1's contribution arrives: with
    # rx_window 1 and op 6 ending at 500, a contribution to op 7 arriving at 50 is a future
    # op, dropped. Rank 0's op 6 took that long by design (a sleep): the straggler's.
    r0 = _rank(
        600, 700, 800, [0, 1], [0, 0],
        sent=[(7, 1, 1, 1, 600, 10, 0), (7, 1, 1, 3, 600, 10, 0),
              (7, 2, 1, 0, 700, 10, 0), (7, 2, 1, 2, 700, 10, 0)],
        arrived=[(7, 1, 1, 0, 50, FUTURE, 0), (7, 1, 1, 2, 50, OK, 0),
                 (7, 2, 1, 1, 100, OK, 0), (7, 2, 1, 3, 100, OK, 0)],
    )  # fmt: skip
    r1 = _rank(
        40, 90, 190, [0, 0], [0, 0],
        sent=[(7, 1, 0, 0, 40, 10, 0), (7, 1, 0, 2, 40, 10, 0),
              (7, 2, 0, 1, 90, 10, 0), (7, 2, 0, 3, 90, 10, 0)],
        arrived=[(7, 1, 0, 1, 610, OK, 0), (7, 1, 0, 3, 610, OK, 0),
                 (7, 2, 0, 0, 710, OK, 0), (7, 2, 0, 2, 710, OK, 0)],
    )  # fmt: skip
    # Two ops: op 6 (no traffic traced, nothing missing) then op 7 above.
    two = []
    for d, t6 in ((r0, (0, 500, 500)), (r1, (0, 0, 0))):
        e = dict(d)
        e["op_id"], e["op_step"], e["n_packets"] = (
            np.array([6, 7]),
            np.array([0, 1]),
            np.array([0, 4]),
        )
        e["p1_expected"] = np.array([0, 2])
        for f, v6 in zip(("start_us", "phase1_end_us", "end_us"), t6, strict=True):
            e[f] = np.array([v6, int(d[f][0])])
        for f in ("phase1_timeout_us", "phase2_timeout_us"):
            e[f] = np.array([500, 100])
        for f in ("p1_missing_from", "p2_missing_from"):
            e[f] = np.vstack([[0, 0], d[f]])
        two.append(e)
    sleep = np.array([[500, 0], [0, 0]])  # rank 0 slept through op 6
    got = attribute(two, 2, sleep, rx_window=1)
    assert _causes(got) == {(1, 0, 0): 0}
    assert got["missing"][0, 10] == FUTURE
