"""Deadlines of one phase, in microsecond ticks: t_B, t_C and the early timeout.

A phase ends at the first of:
  complete  every expected packet is in;
  early     a LAST-flagged packet from every expected sender is in, and no packet
            arrived for alpha * T (T below); or every sender still owing packets
            is known to have finished the op (it sent a packet of op j >= this
            op + K, which its NIC only does once this op is complete), so what
            is missing will never come;
  deadline  T after the phase's anchor, T = min(median of the peers' t_C, t_B).
            Phase 1 is anchored at the op's start. Phase 2 is anchored at
            max(own phase-1 end, op start + T1): until then a slower owner may
            still be in its phase 1 and its reduced packets are not late.
t_C is each node's running estimate of a phase's completion time, one per phase
(scatter and gather take different times; a packet carries the t_C of its
phase, and T is the median over the world for that phase): a mean and a
mean deviation kept with shift-only EWMAs (as TCP's RTO estimator), t_C = mean +
mult * deviation, clamped to [t_c_min, t_B]. Integer arithmetic, floor shifts.

t_B itself is configured, or calibrated from reliable warm-up ops (calibrate_t_b).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from optireduce.op_stats import COMPLETE, DEADLINE, EARLY, OpStats
from optireduce.params import NicParams


def phase_times(stats: Iterable[OpStats]) -> list[int]:
    """Both phase durations of every op, in ticks: the samples calibrate_t_b takes."""
    return [v for s in stats for v in (s.phase1_end_us - s.start_us, s.end_us - s.phase1_end_us)]


def calibrate_t_b(phase_times_us: Sequence[int]) -> int:
    """t_B from one rank's warm-up: 2 x the P95 of its phase durations, rounded up, >= 1.

    The samples are phase_times() of ops run over the reliable path (the first op,
    which pays for set-up, left out). P95 is numpy's default (linear interpolation
    between order statistics); the factor 2 keeps a merely busy phase from being
    cut. The world then runs with the max over the ranks (each caller's exchange),
    capped by the configured t_B where there is one.
    """
    if len(phase_times_us) == 0:
        raise ValueError("calibrate_t_b: no warm-up phase times")
    return max(1, math.ceil(2 * float(np.percentile(phase_times_us, 95))))


class TcEstimator:
    """The node's own t_C."""

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.tc = p.t_c_init
        self.mean: int | None = None
        self.dev = 0

    def sample(self, duration_us: int) -> int:
        p = self.p
        s = int(duration_us)
        if self.mean is None:
            self.mean, self.dev = s, s >> 1
        else:
            err = s - self.mean
            self.mean += err >> p.tc_gain_shift
            self.dev += (abs(err) - self.dev) >> p.tc_dev_shift
        self.tc = min(max(self.mean + p.tc_dev_mult * self.dev, p.t_c_min_us), p.t_b_us)
        return self.tc


def agreed_timeout(tc_table: np.ndarray, t_b: int) -> int:
    """min(lower median of the world's t_C values, t_B)."""
    srt = np.sort(np.asarray(tc_table, dtype=np.int64))
    return int(min(int(srt[(len(srt) - 1) // 2]), t_b))


def flagged_count(n_packets: int, last_percent: int) -> int:
    """How many of a sender's last packets to one destination carry the LAST flag."""
    return max(1, -(-n_packets * last_percent // 100)) if n_packets else 0


class PhaseTracker:
    """Arrivals and timers of one phase of one op at one receiver.

    Arrivals may come before the phase begins (a peer ahead of us); they count.
    T is not latched: every check uses the current agreed timeout, as the
    gateware compares the phase's elapsed ticks with the live T register. A phase
    whose deadline moved into the past ends at `floor`, the tick T last changed.
    """

    def __init__(self, expected: np.ndarray, alpha_q8: int) -> None:
        self.exp = np.asarray(expected, dtype=np.int64)  # packets expected per sender
        self.rcv = np.zeros_like(self.exp)
        self.senders = self.exp > 0
        self.alpha_q8 = alpha_q8
        self.flagged = np.zeros(len(self.exp), dtype=bool)
        self.gone = np.zeros(len(self.exp), dtype=bool)  # sender has moved past this op
        self.last_arrival: int | None = None
        self.last_gone = 0
        self.start: int | None = None
        self.anchor = 0  # the deadline is anchor + T
        self.timeout = 0  # T when the phase ended
        self.end: int | None = None
        self.reason: str | None = None
        # running totals, so the per-packet checks need no array scans
        self.expected = int(self.exp.sum())
        self.received = 0
        self.unflagged = int(self.senders.sum())  # expected senders with no LAST seen yet
        self.any_gone = False

    def arrive(self, now: int, sender: int, last: bool) -> None:
        self.rcv[sender] += 1
        self.received += 1
        self.last_arrival = now
        if last and not self.flagged[sender]:
            self.flagged[sender] = True
            self.unflagged -= int(self.senders[sender])

    def sender_gone(self, now: int, sender: int) -> None:
        """The sender has finished this op: what it has not sent will never come."""
        if self.senders[sender] and not self.gone[sender] and self.end is None:
            self.gone[sender] = True
            self.any_gone = True
            self.last_gone = now

    def begin(self, now: int, anchor: int | None = None) -> None:
        self.start = now
        self.anchor = now if anchor is None else max(now, anchor)

    def _times(self, timeout: int, floor: int) -> tuple[int | None, int]:
        """(early-timeout tick or None, deadline tick) under the current T."""
        deadline = max(self.anchor + timeout, floor)
        if self.unflagged:
            return None, deadline
        idle = max(1, (self.alpha_q8 * timeout) >> 8)
        return max(max(self.start, self.last_arrival or self.start) + idle, floor), deadline

    def due(self, now: int, timeout: int, floor: int) -> tuple[int, str] | None:
        """(end tick, reason) if the phase is over at `now`, else None."""
        if self.start is None or self.end is not None:
            return None
        if self.received >= self.expected:
            return max(self.start, self.last_arrival or self.start), COMPLETE
        if self.any_gone and ((self.rcv >= self.exp) | self.gone).all():  # the rest is lost
            return max(self.start, self.last_arrival or self.start, self.last_gone), EARLY
        early, deadline = self._times(timeout, floor)
        if early is not None and early <= now and early < deadline:
            return early, EARLY
        if deadline <= now:
            return deadline, DEADLINE
        return None

    def next_timer(self, timeout: int, floor: int) -> int | None:
        if self.start is None or self.end is not None:
            return None
        early, deadline = self._times(timeout, floor)
        return deadline if early is None else min(early, deadline)

    def finish(self, t: int, reason: str, timeout: int, tc_sample: str = "duration") -> int | None:
        """Record the end; returns the completion-time sample for t_C, or None.

        No sample when the phase expected nothing or everything was in before it
        began: its length says nothing about the network (and a 0 would drag t_C,
        and with it everyone's T, to 1). A deadline-ended phase samples its whole
        duration under tc_sample "duration"; under "last_arrival" it samples as any
        other phase, the last accepted arrival, so a sender that never makes the
        deadline does not pin every sample to T (docs/deadlines.md).
        """
        self.end, self.reason, self.timeout = t, reason, timeout
        if reason == DEADLINE and tc_sample == "duration":
            return t - self.start
        if self.last_arrival is None or self.last_arrival <= self.start:
            return None
        return self.last_arrival - self.start
