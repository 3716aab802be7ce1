"""Deadlines (hw/deadline.py) and t_C consensus (hw/tc_estimator.py) vs host/model/deadline.py."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.deadline import PhaseTracker, TcEstimator, agreed_timeout
from optireduce.hw.board_colorlight import PARAMS as SLIM
from optireduce.hw.deadline import REASON_NAMES, PhaseTimer, Reason
from optireduce.hw.tc_estimator import TcEstimator as TcEstimatorHw
from optireduce.params import NicParams

WRAP = 1 << 32  # ticks are serial numbers modulo 2^tick_bits (hw/deadline.py, "Ticks")
WIDTHS = (32, SLIM.tick_bits)  # the default clock and the 25F's narrower one


def _run(dut, bench, clock: bool = True) -> None:
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def _random_tracker(rng: np.random.Generator, alpha: int | None = None, t_b_bits: int = 28):
    """A PhaseTracker in a random reachable state, and (now, T, floor, alpha)."""
    world = int(rng.integers(2, 6))
    mine = int(rng.integers(0, 4))
    exp = np.full(world, mine)
    exp[int(rng.integers(world))] = 0
    if alpha is None:
        alpha = int(rng.choice([1, 64, 256, int(rng.integers(1, 257))]))
    ph = PhaseTracker(exp, alpha)
    t = int(rng.integers(0, 50))
    begun = rng.random() < 0.9
    begin_at = t + int(rng.integers(0, 30))
    for s in range(world):
        k = int(rng.integers(0, exp[s] + 1)) if rng.random() < 0.8 else int(exp[s])
        for i in range(k):
            t += int(rng.integers(0, 20))
            ph.arrive(t, s, last=i == exp[s] - 1 or rng.random() < 0.1)
        if rng.random() < 0.25:
            t += int(rng.integers(0, 5))
            ph.sender_gone(t, s)
    if begun:
        ph.begin(begin_at, anchor=None if rng.random() < 0.7 else begin_at + int(rng.integers(9)))
    timeout = int(rng.choice([1, 2, 40, 300, int(rng.integers(1, 500)), (1 << t_b_bits) - 1]))
    floor = int(rng.choice([0, 0, t, int(rng.integers(0, 400))]))
    now = max(t, begin_at) + int(rng.integers(0, 600))
    return ph, now, timeout, floor, alpha


def _offset(rng: np.random.Generator, wrap: int = WRAP) -> int:
    """Where the clock stands: at 0, or anywhere, or just before its wrap."""
    return int(rng.choice([0, int(rng.integers(0, wrap)), wrap - int(rng.integers(1, 2000))]))


def _set_phase(ctx, dut: PhaseTimer, ph: PhaseTracker, off: int = 0) -> None:
    wrap = 1 << dut.tick_bits
    """Drive the timer's per-context inputs from a tracker's state, as PhaseContexts keeps
    it: every tick `off` later on the wrapping clock, and arrival and "gone" ticks taken
    before the begin moved to the start (PhaseContexts.begin)."""
    senders = ph.exp > 0
    start = ph.start or 0
    ctx.set(dut.active, ph.start is not None and ph.end is None)
    ctx.set(dut.start, (start + off) % wrap)
    ctx.set(dut.anchor, (ph.anchor + off) % wrap)
    ctx.set(dut.has_arrival, ph.last_arrival is not None)
    ctx.set(dut.last_arrival, (max(ph.last_arrival or 0, start) + off) % wrap)
    ctx.set(dut.last_gone, (max(ph.last_gone, start) + off) % wrap)
    ctx.set(dut.all_in, bool((ph.rcv >= ph.exp).all()))
    ctx.set(dut.in_or_gone, bool(((ph.rcv >= ph.exp) | ph.gone).all()))
    ctx.set(dut.all_flagged, bool(((ph.flagged & senders) == senders).all()))


def _set_owner(ctx, dut: PhaseTimer, now: int, timeout: int, floor: int, alpha: int,
               off: int = 0, live: bool = True) -> None:  # fmt: skip
    """Drive the inputs every context shares: T, its idle gap, the floor and `now`, `off`
    later. The model's floor 0 (no change yet) is a retired floor (`floor_live` low, its
    value any) unless `live`."""
    ctx.set(dut.timeout, timeout)
    ctx.set(dut.idle, max(1, (alpha * timeout) >> 8))
    live = live or floor != 0
    ctx.set(dut.floor_live, live)
    wrap = 1 << dut.tick_bits
    ctx.set(dut.floor, (floor + off) % wrap if live else (now + off + 7) % wrap)
    ctx.set(dut.now, (now + off) % wrap)


def _got(ctx, dut: PhaseTimer, off: int = 0):
    """(end tick, reason) if due, the end tick `off` earlier (the model's clock)."""
    if not ctx.get(dut.due):
        return None
    wrap = 1 << dut.tick_bits
    return (ctx.get(dut.end_tick) - off) % wrap, REASON_NAMES[Reason(ctx.get(dut.reason))]


@pytest.mark.parametrize("tick_bits", WIDTHS)
def test_phase_timer_matches_phase_tracker_due(tick_bits):
    """Every rule, with the clock anywhere (across its wrap too), and the floor live,
    retired, or 0 and live; at both clock widths."""
    rng = np.random.default_rng(1)
    wrap = 1 << tick_bits
    cases = [(*_random_tracker(rng, t_b_bits=tick_bits - 4), _offset(rng, wrap),
              rng.random() < 0.5) for _ in range(900)]  # fmt: skip
    dut = PhaseTimer(tick_bits)

    async def bench(ctx):
        fired, wrapped = set(), 0
        for ph, now, timeout, floor, alpha, off, live in cases:
            want = ph.due(now, timeout, floor)
            _set_phase(ctx, dut, ph, off)
            _set_owner(ctx, dut, now, timeout, floor, alpha, off, live)
            for _ in range(PhaseTimer.LATENCY):
                await ctx.tick()
            assert _got(ctx, dut, off) == want, (now, timeout, floor, off, vars(ph))
            if want:
                fired.add(want[1])
                wrapped += (ph.start or 0) + off < wrap <= want[0] + off
        assert fired == {"complete", "early", "deadline"}  # every rule was exercised
        assert wrapped >= 5  # phases that began before the wrap and ended after it

    _run(dut, bench)


def test_phase_timer_takes_a_new_context_every_cycle():
    """As PhaseContexts uses it: another context's state in every cycle, the owner's inputs
    (T, idle gap, floor, now) held over a sweep; each result, LATENCY cycles on, is the
    model's for the context that went in then."""
    rng = np.random.default_rng(3)
    lat = PhaseTimer.LATENCY
    sweeps = []
    for _ in range(60):
        alpha = int(rng.choice([1, 64, 256]))
        cases = [_random_tracker(rng, alpha) for _ in range(8)]
        now = max(c[1] for c in cases)
        timeout, floor = cases[0][2], cases[0][3]
        sweeps.append((now, timeout, floor, alpha, [c[0] for c in cases], _offset(rng)))
    dut = PhaseTimer(32)

    async def bench(ctx):
        fired, checked = set(), 0
        for now, timeout, floor, alpha, phases, off in sweeps:
            _set_owner(ctx, dut, now, timeout, floor, alpha, off)
            wants = []
            for ph in [*phases, *phases[: lat - 1]]:  # again, to push the last ones out
                _set_phase(ctx, dut, ph, off)
                wants.append(ph.due(now, timeout, floor))
                await ctx.tick()
                if len(wants) >= lat:  # the output is of the context set lat - 1 ticks ago
                    want = wants[-lat]
                    assert _got(ctx, dut, off) == want, (now, timeout, floor, off)
                    fired.add(want[1] if want else None)
                    checked += 1
        assert checked == 60 * 8
        assert fired == {"complete", "early", "deadline", None}

    _run(dut, bench)


def test_phase_timer_due_only_follows_active_latency_cycles_before():
    """With every input moving every cycle, "due" is high only where `active` was high
    LATENCY cycles before (the formal harness's cut timers assume it); and a START that
    moves start and anchor past an old deadline gives no "due" with the stale end tick."""
    rng = np.random.default_rng(7)
    dut = PhaseTimer(32)
    lat = PhaseTimer.LATENCY
    ticks = [0, 1, 99, 100, 500, 600, (1 << 31) + 5, WRAP - 1]

    async def bench(ctx):
        hist, violations = [], 0
        for _ in range(4000):
            ctx.set(dut.active, int(rng.random() < 0.5))
            for port in (dut.start, dut.anchor, dut.last_arrival, dut.last_gone, dut.floor,
                         dut.now):  # fmt: skip
                ctx.set(port, int(rng.choice(ticks)))
            for port in (dut.has_arrival, dut.all_in, dut.in_or_gone, dut.all_flagged):
                ctx.set(port, int(rng.random() < 0.5))
            ctx.set(dut.timeout, int(rng.choice([1, 100, (1 << 32) - 1])))
            ctx.set(dut.idle, int(rng.choice([1, 25, 1 << 20])))
            hist.append(ctx.get(dut.active))
            await ctx.tick()
            # after the edge: due reads the stages, `active` as set lat + 1 sets ago counts
            if ctx.get(dut.due) and len(hist) > lat and not hist[-lat]:
                violations += 1
        assert violations == 0

        # a context idle with start = anchor = 0 (deadline 100), then START at tick 500
        for port, v in ((dut.active, 0), (dut.start, 0), (dut.anchor, 0), (dut.timeout, 100),
                        (dut.idle, 25), (dut.floor, 0), (dut.now, 500), (dut.has_arrival, 0),
                        (dut.last_arrival, 0), (dut.last_gone, 0), (dut.all_in, 0),
                        (dut.in_or_gone, 0), (dut.all_flagged, 0)):  # fmt: skip
            ctx.set(port, v)
        await ctx.tick().repeat(lat + 1)
        ctx.set(dut.active, 1)
        ctx.set(dut.start, 500)
        ctx.set(dut.anchor, 500)
        seen = []
        for _ in range(lat + 2):
            await ctx.tick()
            seen.append(ctx.get(dut.due))
        assert seen == [0] * (lat + 2)  # due at 600, not at the stale 100
        ctx.set(dut.now, 600)
        await ctx.tick()
        assert ctx.get(dut.due) and ctx.get(dut.end_tick) == 600

    _run(dut, bench)


@pytest.mark.parametrize(
    ("world", "t_c_min", "tick_bits"),
    [(2, 1, 32), (5, 1, 32), (8, 1, 32), (5, 300, 32), (5, 1, 24)],
)
def test_tc_estimator_and_median_match_the_model(world, t_c_min, tick_bits):
    rng = np.random.default_rng(world * 1000 + t_c_min + tick_bits)
    t_b = int(rng.choice([500, 1000]))
    p = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=t_b, t_c_min_us=t_c_min,
                  tick_bits=tick_bits)  # fmt: skip
    wrap = 1 << tick_bits
    rank = int(rng.integers(world))
    est = TcEstimator(p)
    table = np.full(world, p.t_c_init, dtype=np.int64)
    floor = 0
    ops = []
    for k in range(120):
        at = 10 * k + int(rng.integers(0, 10))
        if rng.random() < 0.3:  # own phase end
            s = int(rng.choice([0, 1, t_b, int(rng.integers(0, 3 * t_b)), wrap - 1]))
            ops.append(("sample", s, at))
        else:
            r = int(rng.choice([j for j in range(world) if j != rank]))
            v = int(rng.choice([1, t_b, p.t_c_max_us, int(rng.integers(1, 30)),
                                int(rng.integers(1, 2 * t_b))]))  # fmt: skip
            ops.append(("update", r, v, at))
    if t_c_min > 1:  # small samples first: the floor must hold t_C at t_c_min
        ops = [("sample", s, k) for k, s in enumerate((0, 1, 3, 2, 7))] + [
            (op[0], *op[1:-1], op[-1] + 5) for op in ops
        ]
    dut = TcEstimatorHw(p)

    async def wait_idle(ctx):
        await ctx.tick()
        while ctx.get(dut.busy):
            await ctx.tick()

    seen = set()
    seen_ops: list = []
    back_to_back = rng.random(len(ops)) < 0.3

    restarts = {40: t_b // 3 + 7, 80: t_b // 2 + 1}  # op index: a new t_c_init
    back_to_back[min(restarts) - 1] = True  # the first one comes while an op is in flight
    off = 0 if world == 2 else wrap - 600  # the owner's clock: from 0, or across its wrap

    def hw_floor(ctx) -> int:
        """The floor on the model's clock; a retired one is the model's 0 (below all)."""
        return (ctx.get(dut.floor) - off) % wrap if ctx.get(dut.floor_live) else 0

    async def bench(ctx):
        nonlocal floor, est, table
        ctx.set(dut.now, off)
        ctx.set(dut.world, world)
        ctx.set(dut.rank, rank)
        ctx.set(dut.t_b, t_b)
        await ctx.tick()
        for i, op in enumerate(ops):
            if i in restarts:  # everything as after a reset with t_c_init_us = the new value
                init = restarts[i]
                # the first one lands while the previous op may still be in flight: the
                # restart waits for it and then undoes it too
                if i != min(restarts):
                    await wait_idle(ctx)
                assert ctx.get(dut.busy) == (i == min(restarts))
                ctx.set(dut.t_c_init, init)
                await wait_idle(ctx)
                est = TcEstimator(p.replace(t_c_init_us=init))
                table, floor = np.full(world, init, dtype=np.int64), 0
                assert ctx.get(dut.median) == ctx.get(dut.own_tc) == init
                assert hw_floor(ctx) == 0
            ctx.set(dut.now, (op[-1] + off) % wrap)  # the owner's now: the op's tick
            if op[0] == "sample":
                _, s, at = op
                tc = est.sample(s)
                if table[rank] != tc:
                    table[rank], floor = tc, at
                port, pl = dut.sample, {"value": s, "at": (at + off) % wrap}
            else:
                _, r, v, at = op
                if table[r] != v:
                    table[r], floor = v, at
                port, pl = dut.update, {"rank": r, "value": v, "at": (at + off) % wrap}
            ctx.set(port.valid, 1)
            ctx.set(port.payload, pl)
            while not ctx.get(port.ready):
                await ctx.tick()
            await ctx.tick()
            ctx.set(port.valid, 0)
            if op is not ops[-1] and back_to_back[len(seen_ops)]:
                seen_ops.append(op)  # the next one is offered while this one is in flight
                continue
            seen_ops.append(op)
            await wait_idle(ctx)
            assert ctx.get(dut.own_tc) == est.tc
            assert ctx.get(dut.median) == int(np.sort(table)[(world - 1) // 2])
            assert ctx.get(dut.timeout) == agreed_timeout(table, t_b)
            assert hw_floor(ctx) == floor
            seen.add(ctx.get(dut.timeout))
        assert len(seen) >= 5  # T really moved

    _run(dut, bench)


@pytest.mark.parametrize("world", [3, 8])
def test_two_banks_are_two_estimators(world):
    """TcEstimator(banks=2), the core's one estimator for both phases: each bank, driven
    at its own pace and clock as an owner drives it (a sample offered for one cycle
    once its bank is not busy, an update held until taken), equals its own model's
    estimator and table after each request, while the other bank's requests come at
    random in between and at once."""
    rng = np.random.default_rng(world)
    t_b = 800
    p = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=t_b)
    rank = int(rng.integers(world))
    dut = TcEstimatorHw(p, banks=2)
    waited = [0, 0]  # cycles a bank's request waited for the other's
    asking = [False, False]  # a bank's request is not served yet
    both = [0]  # cycles both banks had one

    def ops_for(k: int) -> list:
        ops = []
        for i in range(60):
            at = 1000 * k + 7 * i + int(rng.integers(0, 5))
            if rng.random() < 0.3:
                smp = int(rng.choice([0, 3, t_b, int(rng.integers(1, 2 * t_b))]))
                ops.append(("sample", smp, at))
            else:
                r = int(rng.choice([j for j in range(world) if j != rank]))
                ops.append(("update", r, int(rng.integers(1, 2 * t_b)), at))
        return ops

    def bank_bench(k: int, ops: list, gaps):
        port = getattr(dut, f"b{k}")

        async def bench(ctx):
            est, table, floor = TcEstimator(p), np.full(world, p.t_c_init, dtype=np.int64), None
            await ctx.tick().repeat(2)
            for op, gap in zip(ops, gaps, strict=True):
                for _ in range(gap):
                    await ctx.tick()
                ctx.set(port.now, op[-1])
                if op[0] == "sample":
                    _, smp, at = op
                    tc = est.sample(smp)
                    if table[rank] != tc:
                        table[rank], floor = tc, at
                    assert not ctx.get(port.busy) and ctx.get(port.sample.ready)
                    ctx.set(port.sample.valid, 1)  # one cycle, as FIRE_END offers it
                    ctx.set(port.sample.payload, {"value": smp, "at": at})
                    await ctx.tick()
                    ctx.set(port.sample.valid, 0)
                else:
                    _, r, v, at = op
                    if table[r] != v:
                        table[r], floor = v, at
                    ctx.set(port.update.valid, 1)
                    ctx.set(port.update.payload, {"rank": r, "value": v, "at": at})
                    asking[k] = True
                    while not ctx.get(port.update.ready):
                        waited[k] += 1
                        await ctx.tick()
                    await ctx.tick()
                    ctx.set(port.update.valid, 0)
                asking[k] = True
                while ctx.get(port.busy):
                    await ctx.tick()
                asking[k] = False
                assert ctx.get(port.own_tc) == est.tc
                assert ctx.get(port.median) == int(np.sort(table)[(world - 1) // 2])
                assert ctx.get(port.timeout) == agreed_timeout(table, t_b)
                if floor is not None:
                    assert ctx.get(port.floor_live) and ctx.get(port.floor) == floor

        return bench

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    ctx_cfg = {"world": world, "rank": rank, "t_b": t_b}

    async def config(ctx):
        for name, v in ctx_cfg.items():
            ctx.set(getattr(dut, name), v)

    async def monitor(ctx):
        while True:
            both[0] += asking[0] and asking[1]
            await ctx.tick()

    sim.add_testbench(config)
    sim.add_testbench(monitor, background=True)
    for k in range(2):
        gaps = [int(g) for g in rng.choice([0, 0, 0, 1, 3, 20], 60)]
        sim.add_testbench(bank_bench(k, ops_for(k), gaps))
    sim.run()
    assert min(waited) > 0 and both[0] > 0  # the banks' requests met


@pytest.mark.parametrize("tick_bits", WIDTHS)
def test_tc_floor_is_retired_a_quarter_wrap_after_it_was_set(tick_bits):
    """A table change across the clock's wrap sets a live floor at its tick; it stays live
    until 2^(tick_bits - 2) ticks later on the wrapped clock (2^30 at 32 bits), then is
    retired; a restart retires it."""
    p = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=500, tick_bits=tick_bits)
    dut = TcEstimatorHw(p)
    wrap, quarter = 1 << tick_bits, 1 << (tick_bits - 2)
    at = wrap - 3

    async def bench(ctx):
        ctx.set(dut.world, 3)
        ctx.set(dut.rank, 0)
        ctx.set(dut.t_b, 500)
        ctx.set(dut.now, at)
        await ctx.tick()
        assert not ctx.get(dut.floor_live)  # after reset: no change yet
        ctx.set(dut.update.valid, 1)
        ctx.set(dut.update.payload, {"rank": 1, "value": 77, "at": at})
        await ctx.tick()
        ctx.set(dut.update.valid, 0)
        ctx.set(dut.now, 5)  # the clock wrapped: 8 ticks later
        await ctx.tick().until(~dut.busy)
        await ctx.tick()
        assert ctx.get(dut.floor_live) and ctx.get(dut.floor) == at
        ctx.set(dut.now, (at + quarter - 1) % wrap)
        await ctx.tick().repeat(2)
        assert ctx.get(dut.floor_live)
        ctx.set(dut.now, (at + quarter) % wrap)
        await ctx.tick().repeat(2)
        assert not ctx.get(dut.floor_live)
        ctx.set(dut.update.valid, 1)  # a new change makes it live again, then a restart
        ctx.set(dut.update.payload, {"rank": 2, "value": 9, "at": (at + quarter) % wrap})
        await ctx.tick()
        ctx.set(dut.update.valid, 0)
        await ctx.tick().until(~dut.busy)
        await ctx.tick()
        assert ctx.get(dut.floor_live) and ctx.get(dut.floor) == (at + quarter) % wrap
        ctx.set(dut.t_c_init, 123)
        await ctx.tick().repeat(3)
        await ctx.tick().until(~dut.busy)
        assert not ctx.get(dut.floor_live)

    _run(dut, bench)


@pytest.mark.parametrize("two_keys", [False, True])
def test_pick_first_is_the_first_strict_minimum_of_a_serial_scan(two_keys):
    """pick_first against a plain scan (keep the first strict minimum), with many ties;
    keys of one term, or of two (a, b) in lexicographic order: the (lt, eq, le) form."""
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from optireduce.hw.deadline import PICK_LATENCY, pick_first

    n = 4

    class Dut(wiring.Component):
        def __init__(self):
            sig = {f"key{k}": In(3) for k in range(n)} | {f"sub{k}": In(2) for k in range(n)}
            sig |= {f"el{k}": In(1) for k in range(n)}
            super().__init__(sig | {"found": Out(1), "index": Out(2)})

        def elaborate(self, platform):
            m = Module()
            keys = [getattr(self, f"key{k}") for k in range(n)]
            subs = [getattr(self, f"sub{k}") for k in range(n)]

            def le(a, b):
                if two_keys:
                    return (keys[a] < keys[b], keys[a] == keys[b], subs[a] <= subs[b])
                return (keys[a] <= keys[b],)

            f, i = pick_first(m, "t", [getattr(self, f"el{k}") for k in range(n)], le)
            m.d.comb += [self.found.eq(f), self.index.eq(i)]
            return m

    dut = Dut()
    rng = np.random.default_rng(5)
    cases = [(rng.integers(0, 3, n), rng.integers(0, 2, n), rng.integers(0, 3, n))
             for _ in range(400)]  # fmt: skip

    async def bench(ctx):
        for keys, el, subs in cases:
            for k in range(n):
                ctx.set(getattr(dut, f"key{k}"), int(keys[k]))
                ctx.set(getattr(dut, f"el{k}"), int(el[k]))
                ctx.set(getattr(dut, f"sub{k}"), int(subs[k]))
            full = [(int(keys[k]), int(subs[k]) if two_keys else 0) for k in range(n)]
            for _ in range(PICK_LATENCY):
                await ctx.tick()
            best = None
            for k in range(n):
                if el[k] and (best is None or full[k] < full[best]):
                    best = k
            assert ctx.get(dut.found) == (best is not None)
            if best is not None:
                assert ctx.get(dut.index) == best, (keys, el)

    _run(dut, bench)


def test_idle_gap_is_the_models_floored_product():
    """idle_gap (DSP partials, then sum and floor) against max(1, alpha * T >> 8) written
    here, across the floor's edge (products near 256) and the widest T and alpha."""
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from optireduce.hw.deadline import IDLE_LATENCY, idle_gap

    class Dut(wiring.Component):
        alpha: In(9)
        t: In(32)
        gap: Out(33)

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.gap.eq(idle_gap(m, self.alpha, self.t))
            return m

    rng = np.random.default_rng(7)
    edges = [(a, t) for a in (0, 1, 255, 256, 511) for t in (0, 1, 255, 256, (1 << 17) - 1,
                                                            1 << 17, (1 << 32) - 1)]  # fmt: skip
    alphas = rng.integers(1, 512, 60)
    near = [(int(a), int(rng.integers(256 // a - 2, 256 // a + 3))) for a in alphas]
    wide = [(int(rng.integers(0, 512)), int(rng.integers(0, 1 << 32))) for _ in range(100)]
    cases = edges + [(a, max(t, 0)) for a, t in near] + wide
    dut = Dut()

    async def bench(ctx):
        for a, t in cases:
            ctx.set(dut.alpha, a)
            ctx.set(dut.t, t)
            await ctx.tick().repeat(IDLE_LATENCY)
            assert ctx.get(dut.gap) == max(1, (a * t) >> 8) % (1 << 33), (a, t)

    _run(dut, bench)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_op_order_matches_integer_order_inside_the_receive_window(k):
    """op_at_most against `<=` on the op ids themselves, for every pair an owner orders:
    a context's op in [base, base + 2K) against another such op or an event's op - K in
    [base - 2K - 1, base + K), with base anywhere, near 0 and across the 32-bit wrap."""
    from amaranth import Module, Signal

    from optireduce.hw.deadline import op_at_most

    n_ctx = 1 << (2 * k - 1).bit_length()
    m = Module()
    a, b, le = Signal(32), Signal(32), Signal()
    m.d.comb += le.eq(op_at_most(a, b, n_ctx))
    rng = np.random.default_rng(k)
    bases = [k, 2 * k, int(rng.integers(0, WRAP)), WRAP - 1, WRAP - 2 * k]
    pairs = []
    for base in bases:
        ctx_ops = range(base, base + 2 * k)
        peer_ops = range(base - 2 * k - 1, base + k)
        pairs += [(x, y) for x in ctx_ops for y in [*ctx_ops, *peer_ops]]
        pairs += [(y, x) for x in ctx_ops for y in ctx_ops]
    got = []

    async def bench(ctx):
        for x, y in pairs:
            ctx.set(a, x % WRAP)
            ctx.set(b, y % WRAP)
            got.append(ctx.get(le))

    _run(m, bench, clock=False)
    assert got == [int(x <= y) for x, y in pairs]
