"""Which exponent each op of an allreduce call runs with, and what each op carries ahead.

With `NicParams.exp_inband` off every op's exponent is agreed by a reliable exchange (the
`agree` callable: the max of every rank's proposals) before the call's first op starts: a
straggler delays every rank by its lateness. With it on (docs/numerics.md, "In-band
agreement"), op j carries its sender's proposal for op j + L and the NIC agrees op j + L's
exponent from what arrived, so only the first L ops, and the L ops after a `resync`, need the
exchange. The proposal for an op past the end of this call is a prediction, plus
`PREDICTION_MARGIN` (one more bit of range): of what the call that followed a call of
this size last time proposed for its first ops (DDP hands its buckets over in the same
order every step, and each bucket's gradient scale moves slowly from step to step), or,
before there is one, this call's largest proposal. A prediction too small shows as
`exp_saturated` on the rank that saturated; whoever holds a collective decision (the DDP
hook) calls `resync` on every rank at the same op.

Every rank computes the same plan from the same op ids, so the ranks call `agree` together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from optireduce.params import NicParams

ExponentAgreement = Callable[[list[int]], list[int]]

EXP_MAX = 127  # the exponent travels as an int8
PREDICTION_MARGIN = 1


class ExponentPlan:
    """One rank's plan; `lead` is 0 with in-band agreement off."""

    def __init__(self, p: NicParams, first_op: int) -> None:
        self.lead = p.exp_lead_eff if p.exp_inband else 0
        self.given_until = first_op + self.lead  # ops below this id run with given exponents
        self.exchanges = 0  # calls that needed the reliable exchange
        # call size -> the first `lead` proposals of the call that followed one of that size
        self._follows: dict[int, list[int]] = {}
        self._prev_size: int | None = None

    def resync(self, next_op: int) -> None:
        """Give the next L ops exponents from the exchange again (every rank, same op)."""
        self.given_until = next_op + self.lead

    def plan(
        self, proposals: Sequence[int], first: int, agree: ExponentAgreement, size: int = 0
    ) -> tuple[list[int | None], list[int | None]]:
        """(exponent of each op, None = in-band; proposal each op carries for op + L, None
        with in-band off) for the call's ops first, first + 1, ...; `size`: the call's
        elements (the key of the history its predictions come from)."""
        m = len(proposals)
        if not self.lead:
            self.exchanges += 1
            return list(agree(list(proposals))), [None] * m
        if self._prev_size is not None:
            self._follows[self._prev_size] = [int(v) for v in proposals[: self.lead]]
        self._prev_size = size
        given = [k for k in range(m) if first + k < self.given_until]
        exps: list[int | None] = [None] * m
        if given:
            self.exchanges += 1
            for k, e in zip(given, agree([int(proposals[k]) for k in given]), strict=True):
                exps[k] = int(e)
        lead, seen = self.lead, self._follows.get(size, [])
        fallback = max(proposals)

        def predicted(j: int) -> int:  # the j-th op of the next call
            return min(EXP_MAX, (seen[j] if j < len(seen) else fallback) + PREDICTION_MARGIN)

        ahead = [int(proposals[k + lead]) if k + lead < m else predicted(k + lead - m)
                 for k in range(m)]  # fmt: skip
        return exps, ahead
