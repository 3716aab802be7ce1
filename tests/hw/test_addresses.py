"""A rank's address (hw/addresses.py: plus_base) against Python's integer sum."""

import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from optireduce.hw.addresses import plus_base
from optireduce.ubt import DEFAULT_ADDRESSING

BASES = [
    (DEFAULT_ADDRESSING.mac_base, 48),
    (DEFAULT_ADDRESSING.ip_base + 1, 32),
    (0x02_00_00_00_00_FD, 48),  # the low bits carry into the high ones
    (0xFFFF_FFFF_FFFA, 48),  # the sum wraps past 2^48
    (0x0000_00FF, 32),
    (0x5, 3),  # a base no wider than the rank
]


@pytest.mark.parametrize(("base", "bits"), BASES)
@pytest.mark.parametrize("rank_bits", [1, 3, 4])
def test_every_rank_gets_base_plus_rank(base: int, bits: int, rank_bits: int) -> None:
    m = Module()
    r, out = Signal(rank_bits), Signal(bits)
    m.d.comb += out.eq(plus_base(base, r, bits))
    got = {}

    async def bench(ctx):
        for v in range(1 << rank_bits):
            ctx.set(r, v)
            got[v] = ctx.get(out)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert got == {v: (base + v) % (1 << bits) for v in range(1 << rank_bits)}
