"""hw/digit_divider.py: the block-RAM digit divider against Python's floor division,
with its pipeline stalled at random; which divisor sets take it."""

import random

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from optireduce.hw import digit_divider as dd


def _run(width: int, divisors: list[int], cases: list[tuple[int, int]], seed: int) -> list:
    """The quotient of each (num, sel) case, the pipeline advancing on random cycles."""
    m = Module()
    num, sel, en = Signal(width), Signal(range(len(divisors))), Signal()
    q = dd.digit_divide(m, num, sel, divisors, en)
    lat = dd.latency(width, divisors)
    rng = random.Random(seed)
    got: list = []

    async def bench(ctx):
        k, taken = 0, 0  # cases given, enabled cycles so far
        while len(got) < len(cases):
            on = rng.random() < 0.7
            if on and k < len(cases):
                ctx.set(num, cases[k][0])
                ctx.set(sel, cases[k][1])
            ctx.set(en, on)
            await ctx.tick()
            if on:
                k += 1
                taken += 1
                if taken >= lat:  # the case given `lat` enabled cycles ago is out
                    got.append(ctx.get(q))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


@pytest.mark.parametrize(
    ("width", "divisors"),
    [
        (37, [2 * n for n in range(1, 9)]),  # the mean readout at n_max = 8 (w_acc = 35)
        (38, [2, 4, 6, 8]),  # 2k for k = 1..4 packets a block
        (20, [3, 5, 7]),  # odd divisors, a width that is not a whole number of digits
        (9, [1]),
        (38, [0, 2, 4, 6, 8]),  # the block divider's: divisor 0, an empty block, gives 0
    ],
)
def test_quotients_are_floor_division(width, divisors):
    rng = random.Random(width)
    top = (1 << width) - 1
    cases = [(rng.randrange(top + 1), rng.randrange(len(divisors))) for _ in range(150)]
    cases += [(top, s) for s in range(len(divisors))] + [(0, 0), (divisors[-1] - 1, 0)]
    cases += [(d * rng.randrange(top // d + 1), s) for s, d in enumerate(divisors) if d]
    got = _run(width, divisors, cases, seed=width)
    assert got == [n // divisors[s] if divisors[s] else 0 for n, s in cases]


def test_which_divisor_sets_fit():
    """2n for n_max = 8 fits in 10 digits of 4 bits; n_max = 16 or more takes too many
    stages (or no table fits), and the owner keeps its multiplier."""
    assert dd.digit_bits([2 * n for n in range(1, 9)]) == 4
    assert dd.latency(37, [2 * n for n in range(1, 9)]) == 10
    assert dd.fits(37, [2 * n for n in range(1, 9)])
    assert not dd.fits(37, [2 * n for n in range(1, 17)])
    assert dd.digit_bits([2 * n for n in range(1, 65)]) == 0
    with pytest.raises(ValueError, match="do not fit"):
        dd.digit_divide(Module(), Signal(8), Signal(7), [2 * n for n in range(1, 65)], 1)
