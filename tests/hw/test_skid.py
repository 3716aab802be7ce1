"""Skid (hw/skid.py): every beat once and in order under random valid and ready; `i.ready`
never follows `o.ready` within a cycle; with nothing held a beat passes in the same cycle."""

import numpy as np

from optireduce.hw.skid import Skid
from optireduce.sim.stream_sim import run_registered_ready


def test_skid_keeps_order_and_registers_ready():
    dut = Skid(16)
    rng = np.random.default_rng(3)
    beats = [int(v) for v in rng.integers(0, 1 << 16, 400)]

    def passes_through(ctx, k, offered, ready, took):
        if offered and ready and took:  # nothing held: the offered beat is on `o` now
            assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == beats[k]

    got, stalls = run_registered_ready(
        dut, beats, len(beats), read=int, seed=3, take=0.6, on_cycle=passes_through
    )
    assert got == beats
    assert stalls > 50  # the spare register was used, and held its beat
