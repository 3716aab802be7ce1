"""What the tests of the two phase owners share: hw/aggregator.py (phase 1) and
hw/gather_tracker.py (phase 2) run a scenario of host actions, take the model's events
and report phase ends, counters, their own t_C and T in the same way.

A scenario is a list of host-level actions at ticks; the model (NicModel) runs it, the
test turns it into the block's events, the block runs them in amaranth.sim under a
driver of the test's own, and this module records and compares what both blocks report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from amaranth.sim import Simulator

from optireduce.host.model.nic_model import NicModel
from optireduce.hw.deadline import REASON_NAMES, Reason
from optireduce.params import NicParams


@dataclass
class Scenario:
    p: NicParams
    world: int
    rank: int
    actions: list = field(default_factory=list)  # (tick, "start", op, len) | (tick, "frame", b)
    t_end: int = 0


def deliver(sc: Scenario, frames: dict, keys, t0: int = 10, dt: int = 1) -> None:
    """The frames `keys` arrive at t0, t0 + dt, ..."""
    for k, key in enumerate(keys):
        sc.actions.append((t0 + k * dt, "frame", frames[key]))


@dataclass
class Got:
    """What a phase owner reported: its phase ends (op -> reason, end tick, T, received,
    expected) in end order, its counters (by the model's names), own t_C and T."""

    ends: dict = field(default_factory=dict)
    end_order: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    own_tc: int = 0
    timeout: int = 0
    cycles: int = 0


def configure(ctx, dut, sc: Scenario) -> None:
    """The owner's static configuration."""
    ctx.set(dut.rank, sc.rank)
    ctx.set(dut.world, sc.world)
    ctx.set(dut.t_b, sc.p.t_b_us)
    ctx.set(dut.alpha_q8, sc.p.alpha_q8)


def record_end(ctx, dut, got: Got) -> None:
    """In a monitor's cycle: the phase end strobed now, if any (each op ends once)."""
    if ctx.get(dut.end_valid):
        op = ctx.get(dut.end_op)
        assert op not in got.ends, f"op {op} ended twice"
        got.end_order.append(op)
        got.ends[op] = (
            REASON_NAMES[Reason(ctx.get(dut.end_reason))], ctx.get(dut.end_tick),
            ctx.get(dut.end_timeout), ctx.get(dut.end_received), ctx.get(dut.end_expected),
        )  # fmt: skip


def record_status(ctx, dut, got: Got, rx_name: str, cycles: int) -> None:
    """At the end of a run: the counters (cnt_rx under the model's `rx_name`), t_C, T."""
    got.counters = {
        rx_name: ctx.get(dut.cnt_rx),
        "duplicate": ctx.get(dut.cnt_duplicate),
        "late": ctx.get(dut.cnt_late),
    }
    got.own_tc = ctx.get(dut.own_tc)
    got.timeout = ctx.get(dut.timeout)
    got.cycles = cycles


def simulate(dut, driver, monitor) -> None:
    """Run `driver` to its end with `monitor` beside it (10 ns clock)."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(driver)
    sim.add_testbench(monitor, background=True)
    sim.run()


def check_common(got: Got, exp) -> None:
    """The ends, in the model's order, the counters, t_C and T: the model's."""
    assert got.ends == exp.ends
    assert got.end_order == exp.end_order
    assert got.counters == exp.counters
    assert (got.own_tc, got.timeout) == (exp.own_tc, exp.timeout)


def play(sc: Scenario, pool: list, lens: list, rng, gaps: list, exponent: int) -> int:
    """Append to `sc` the starts of ops 0..len(lens)-1, as the model's receive window
    allows, and the frames of `pool` ((op, frame) pairs, taken from it) in mild disorder,
    the peers up to K ops ahead of this rank; ticks advance by draws from `gaps`.
    Returns the last action's tick."""
    p = sc.p
    n_ops = len(lens)
    model = NicModel(p, sc.rank, sc.world)
    t, started, released = 0, 0, 0
    while pool or started < n_ops:
        t += int(rng.choice(gaps))
        model.advance(t)
        model.poll_results()
        if started < n_ops and started < model.base + p.ops_in_flight and rng.random() < 0.3:
            sc.actions.append((t, "start", started, lens[started]))
            model.start_op(t, started, np.zeros(lens[started], np.float32), exponent)
            started += 1
            continue
        released = max(released, min(n_ops, started + p.ops_in_flight))
        ready = [k for k, (op, _) in enumerate(pool) if op < released]
        if not ready:
            continue
        k = ready[int(rng.integers(min(len(ready), 4)))]  # mild reordering
        _, f = pool.pop(k)
        sc.actions.append((t, "frame", f))
        model.receive(t, f)
    return t
