"""The C++ impairment (host/native/src/impairment.cpp) through its binding: the delay
distribution, loss, duplication and reordering rates within statistical bounds (as
tests/test_impairment.py checks the Python one), the same distribution as the Python
model's, seeding, and the release-time queue's order."""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.host.model.impairment import Impairment as PyImpairment
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.native import _engine


def test_delay_distribution_has_the_asked_median_and_tail():
    imp = _engine.Impairment(ImpairmentSpec(median_us=100, p99_ratio=3.0), seed=1)
    d = imp.sample_delays(200_000)
    p50, p99 = np.percentile(d, [50, 99])
    assert abs(p50 - 100) < 1.5
    assert abs(p99 / p50 - 3.0) < 0.08
    assert d.min() > 0


def test_delay_distribution_equals_the_models():
    """Quantiles from 10 to 99.9 % of the C++ and Python draws agree (lognormal,
    sigma = ln(r) / z_0.99): each within 3 % at 200 000 draws apiece."""
    spec = ImpairmentSpec(median_us=250, p99_ratio=1.5)
    cpp = _engine.Impairment(spec, seed=3).sample_delays(200_000)
    py = PyImpairment(spec, seed=3)
    ref = np.array([py.delay_us() for _ in range(200_000)])
    q = [10, 25, 50, 75, 90, 99, 99.9]
    np.testing.assert_allclose(np.percentile(cpp, q), np.percentile(ref, q), rtol=0.03)


def test_constant_delay_when_ratio_is_one():
    imp = _engine.Impairment(ImpairmentSpec(median_us=40), seed=0)
    assert set(imp.sample_delays(100).tolist()) == {40.0}
    assert set(_engine.Impairment(ImpairmentSpec(), seed=0).sample_delays(10).tolist()) == {0.0}


def test_loss_duplication_and_reordering_rates():
    n = 100_000
    spec = ImpairmentSpec(median_us=10, loss=0.05, duplicate=0.02, reorder=0.1)
    imp = _engine.Impairment(spec, seed=2)
    copies = imp.sample_copies(n)
    sent = n + imp.duplicated
    assert abs(imp.duplicated / n - 0.02) < 0.003
    assert abs(imp.lost / sent - 0.05) < 0.004
    assert int(copies.sum()) == sent - imp.lost
    assert set(np.unique(copies).tolist()) == {0, 1, 2}
    assert abs(imp.reordered / (sent - imp.lost) - 0.1) < 0.006


def test_reordered_copies_are_held_one_more_median():
    """Without jitter every delay is the median, or twice it when reordered."""
    imp = _engine.Impairment(ImpairmentSpec(median_us=50, reorder=0.3), seed=4)
    d = imp.sample_delays(20_000)
    assert set(np.unique(d).tolist()) == {50.0, 100.0}
    assert int((d == 100.0).sum()) == imp.reordered
    assert abs(imp.reordered / 20_000 - 0.3) < 0.015


def test_seeded():
    spec = ImpairmentSpec(median_us=5, p99_ratio=2, loss=0.1, duplicate=0.05)
    a, b, c = (_engine.Impairment(spec, seed=s) for s in (7, 7, 8))
    fa = [a.fates() for _ in range(500)]
    assert fa == [b.fates() for _ in range(500)]
    assert fa != [c.fates() for _ in range(500)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("median_us", -1.0), ("p99_ratio", 0.5), ("loss", 1.0), ("duplicate", -0.1),
     ("reorder", 1.5), ("extra_us", -2.0)],
)  # fmt: skip
def test_bad_spec(field, value):
    class Spec:  # the Python spec refuses these itself: hand the fields over unchecked
        median_us, p99_ratio, loss, duplicate, reorder, extra_us = 0.0, 1.0, 0.0, 0.0, 0.0, 0.0

    s = Spec()
    setattr(s, field, value)
    with pytest.raises(ValueError, match=f"ImpairmentSpec.{field}="):
        _engine.Impairment(s, seed=0)


def test_release_queue_releases_by_due_tick_then_push_order():
    q = _engine.ReleaseQueue(64)
    assert q.next() is None
    pushes = [(30, 1, b"c"), (10, 2, b"a"), (30, 0, b"d"), (20, 1, b"b"), (10, 0, b"a2")]
    for due, dst, data in pushes:
        q.push(due, dst, data)
    assert len(q) == 5 and q.next() == 10
    assert q.pop_due(5, 10, 0) == []  # nothing due yet
    # two due at 10, but the send buffer took only one: the other stays first in line
    assert q.pop_due(10, 10, 1) == [(2, b"a"), (0, b"a2")]
    assert q.next() == 10 and len(q) == 4
    assert q.pop_due(100, 10, 10) == [(0, b"a2"), (1, b"b"), (1, b"c"), (0, b"d")]
    assert q.next() is None and len(q) == 0
    with pytest.raises(RuntimeError, match="exceeds 64"):
        q.push(0, 0, bytes(65))


@pytest.mark.parametrize("median", [0, 40])
def test_a_late_link_adds_its_extra_delay_to_every_copy_in_both_impairments(median):
    spec = ImpairmentSpec(median_us=median, extra_us=2500, reorder=0.5)
    cpp = _engine.Impairment(spec, seed=4).sample_delays(2000)
    py = PyImpairment(spec, seed=4)
    ref = np.array([py.delay_us() for _ in range(2000)])
    # every copy: extra + median, plus one more median when reordered (half of them)
    want = {2500.0 + median, 2500.0 + 2 * median}
    assert set(cpp.tolist()) == set(ref.tolist()) == want
    with pytest.raises(ValueError, match="extra_us"):
        ImpairmentSpec(extra_us=-1)
