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


def test_registered_skid_registers_both_directions_and_keeps_full_rate():
    dut = Skid(16, registered=True)
    rng = np.random.default_rng(5)
    beats = [int(v) for v in rng.integers(0, 1 << 16, 400)]

    def outputs_are_registers(ctx, k, offered, ready, took):
        # o does not follow i within the cycle: flip the offer, o must not move
        before = (ctx.get(dut.o.valid), ctx.get(dut.o.payload))
        ctx.set(dut.i.valid, not offered)
        ctx.set(dut.i.payload, 0xFFFF ^ (beats[k] if k < len(beats) else 0))
        assert (ctx.get(dut.o.valid), ctx.get(dut.o.payload)) == before, "o follows i"
        ctx.set(dut.i.valid, offered)
        if offered:
            ctx.set(dut.i.payload, beats[k])

    got, stalls = run_registered_ready(
        dut, beats, len(beats), read=int, seed=5, take=0.6, on_cycle=outputs_are_registers
    )
    assert got == beats and stalls > 50
    # offered and taken every cycle: a beat per cycle, never refused
    got, stalls = run_registered_ready(dut, beats, len(beats), read=int, offer=1.0, take=1.0)
    assert got == beats and stalls == 0
