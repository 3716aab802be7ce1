import numpy as np
import pytest

from optireduce.host.model.impairment import Impairment, ImpairmentSpec


def test_delay_distribution_has_the_asked_median_and_tail():
    imp = Impairment(ImpairmentSpec(median_us=100, p99_ratio=3.0), seed=1)
    d = np.array([imp.delay_us() for _ in range(200_000)])
    p50, p99 = np.percentile(d, [50, 99])
    assert abs(p50 - 100) < 1.5
    assert abs(p99 / p50 - 3.0) < 0.08
    assert d.min() > 0


def test_constant_delay_when_ratio_is_one():
    imp = Impairment(ImpairmentSpec(median_us=40), seed=0)
    assert {imp.delay_us() for _ in range(100)} == {40.0}


def test_loss_duplication_and_reordering_rates():
    n = 100_000
    imp = Impairment(ImpairmentSpec(median_us=10, loss=0.05, duplicate=0.02, reorder=0.1), seed=2)
    copies = [len(imp.fates()) for _ in range(n)]
    sent = n + imp.duplicated
    assert abs(imp.duplicated / n - 0.02) < 0.003
    assert abs(imp.lost / sent - 0.05) < 0.004
    assert sum(copies) == sent - imp.lost
    assert abs(imp.reordered / (sent - imp.lost) - 0.1) < 0.006


def test_seeded():
    a = Impairment(ImpairmentSpec(median_us=5, p99_ratio=2, loss=0.1), seed=7)
    b = Impairment(ImpairmentSpec(median_us=5, p99_ratio=2, loss=0.1), seed=7)
    assert [a.fates() for _ in range(500)] == [b.fates() for _ in range(500)]


@pytest.mark.parametrize(
    ("field", "value"), [("median_us", -1), ("p99_ratio", 0.5), ("loss", 1.0), ("duplicate", -0.1)]
)
def test_bad_spec(field, value):
    with pytest.raises(ValueError, match=f"ImpairmentSpec.{field}="):
        ImpairmentSpec(**{field: value})
