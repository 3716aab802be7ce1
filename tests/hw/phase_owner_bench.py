"""What the tests of the two phase owners share: hw/aggregator.py (phase 1) and
hw/gather_tracker.py (phase 2) run a scenario of host actions, take the model's events
and report phase ends, counters, their own t_C and T in the same way.

A scenario is a list of host-level actions at ticks; the model (NicModel) runs it, the
test turns it into the block's events, the block runs them in amaranth.sim under a
driver of the test's own, and this module records and compares what both blocks report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from amaranth.lib import wiring

from optireduce.host.model.nic_model import NicModel
from optireduce.hw.deadline import REASON_NAMES, Reason
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import field_places, run_bench
from optireduce.sim.stream_sim import simulate as run_sim


@dataclass
class Scenario:
    p: NicParams
    world: int
    rank: int
    actions: list = field(default_factory=list)  # (tick, "start", op, len) | (tick, "frame", b)
    t_end: int = 0


def directed(registry: dict) -> Callable:
    """`@directed(t_end=...)`: files a directed scenario under its name without the
    `sc_`; the scenario runs to t_end."""

    def with_end(t_end: int) -> Callable:
        def add(build: Callable[[], Scenario]) -> Callable[[], Scenario]:
            def scenario() -> Scenario:
                sc = build()
                sc.t_end = t_end
                return sc

            scenario.__doc__ = build.__doc__
            registry[build.__name__.removeprefix("sc_")] = scenario
            return scenario

        return add

    return with_end


def random_ops(rng: np.random.Generator, p: NicParams, n_ops: tuple) -> tuple:
    """A random world, the rank under test and the lengths of n_ops (lo, hi) ops, drawn
    in that order: (Scenario, lens)."""
    world = int(rng.choice([2, 3, 3, 4, p.n_max]))
    rank = int(rng.integers(world))
    n = int(rng.integers(*n_ops))
    lens = [int(rng.choice([1, p.b, p.c, p.c, int(rng.integers(1, p.c + 1))])) for _ in range(n)]
    return Scenario(p, world, rank), lens


def deliver(sc: Scenario, frames: dict, keys, t0: int = 10, dt: int = 1) -> None:
    """The frames `keys` arrive at t0, t0 + dt, ..."""
    for k, key in enumerate(keys):
        sc.actions.append((t0 + k * dt, "frame", frames[key]))


@dataclass
class Expected:
    """What the model did: the block's events, its phase ends (op -> reason, end tick, T,
    received, expected) and their order, its counters, own t_C and T."""

    events: list
    ends: dict
    end_order: list
    counters: dict
    own_tc: int
    timeout: int


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


class Driver:
    """A driver's clock: it counts the cycles it steps, hands events to `ev` and
    winds a run down."""

    def __init__(self, ctx, dut) -> None:
        self.ctx, self.dut, self.cycles = ctx, dut, 0

    async def step(self) -> None:
        await self.ctx.tick()
        self.cycles += 1

    async def send_event(self, payload: dict, at: int | None) -> None:
        """Offer `payload` on `ev` until taken; the block's clock then reads `at` (None:
        any tick, as an OWN event's)."""
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.ev.payload, payload)
        ctx.set(dut.ev.valid, 1)
        while True:
            r = ctx.get(dut.ev.ready)
            await self.step()
            if r:
                break
        ctx.set(dut.ev.valid, 0)
        assert at is None or ctx.get(dut.now) == at

    async def finish(self, got: Got, rx_name: str, t_end: int, limit: int, out=None) -> None:
        """Step until the block's clock reads t_end, `ev` is ready and `out()` (all
        output seen) holds, at most `limit` cycles; 40 more in which nothing may come
        out; then record the status."""
        ctx, dut = self.ctx, self.dut
        for _ in range(limit):
            settled = ctx.get(dut.now) == t_end and ctx.get(dut.ev.ready)
            if settled and (out is None or out()):
                break
            await self.step()
        for _ in range(40):
            await self.step()
        record_status(ctx, dut, got, rx_name, self.cycles)


def simulate(dut, driver, monitor) -> None:
    """Run `driver` to its end with `monitor` beside it (10 ns clock)."""
    finished = []

    async def run(ctx):
        await driver(ctx)
        finished.append(True)

    run_sim(dut, run, monitor)
    assert finished


def check(sc: Scenario, run_model: Callable, run_rtl: Callable, **kw) -> tuple:
    """The model runs `sc`, the RTL its events; their ends, in the model's order, the
    counters, t_C and T must agree. Returns (expected, got)."""
    exp = run_model(sc)
    got = run_rtl(sc, exp, **kw)
    check_common(got, exp)
    return exp, got


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


# ---- cocotb + Verilator ---------------------------------------------------------------
def scenario_json(name: str, sc: Scenario, exp: Expected, events: list, **more) -> dict:
    """A scenario and what the model did, as the cocotb bench reads it."""
    return {
        "name": name,
        "rank": sc.rank,
        "world": sc.world,
        "t_b": sc.p.t_b_us,
        "t_c_min": sc.p.t_c_min_us,
        "t_c_init": sc.p.t_c_init,
        "alpha_q8": sc.p.alpha_q8,
        "t_end": sc.t_end,
        "events": events,
        "ends": {str(op): list(e) for op, e in exp.ends.items()},
        "end_order": exp.end_order,
        "counters": exp.counters,
        "own_tc": exp.own_tc,
        "timeout": exp.timeout,
        **more,
    }


def replay_in_cocotb(
    tmp_path,
    top: wiring.Component,
    name: str,
    layout,
    scenarios: list,
    *,
    top_name: str | None = None,
    sources: tuple = (),
    **config,
) -> None:
    """The bench tests/hw/benches/tb_<name>.py replays `scenarios` (scenario_json
    dicts) on `top` (Verilog module `top_name`, <name>_top unless given; `sources`:
    Verilog it instantiates) under Verilator."""
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps(scenarios))
    layout = field_places(layout)
    run_bench(
        top, top_name or f"{name}_top", f"tests.hw.benches.tb_{name}",
        {"scenarios": str(path), "layout": layout, **config}, sources=sources,
    )  # fmt: skip
