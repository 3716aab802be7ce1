"""Phase-2 gather tracker (hw/gather_tracker.py) against the NIC model, event by event.

The reference is host/model/nic_model.py: NicModel itself. A scenario is a list of
host-level actions (start an op, deliver a frame) at ticks. The model runs them
with its _end_phase1 / _end_phase2 wrapped, so the test records, in the model's own
order, every event the tracker sees: each frame that passes the parser's checks
(GATHER or SCATTER), each start, and each phase-1 end (PHASE1_END, stamped with its
end tick, with the op's start tick and T1). The RTL then runs the events (random
idle between them, the `time` input walking in random steps) and must give the
model's phase-2 ends (op, reason, tick, T, received, expected) in the model's order,
a verdict per gather frame (accepted, duplicate, late: the model's rx_gather /
duplicate / late counters for that frame), the counters, the phase-2 own t_C and T.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from optireduce import ubt
from optireduce.frame_checks import classify
from optireduce.host.model.nic_model import NicModel
from optireduce.host.model.packetizer import OpContext, gather_order, scatter_order
from optireduce.hw.axis import PlainStreams
from optireduce.hw.gather_tracker import GatherTracker, Kind, Verdict, event_layout
from optireduce.params import NicParams
from tests.hw import phase_owner_bench as bench
from tests.hw.phase_owner_bench import Scenario, deliver

P = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=300, alpha_q8=64)
EXP = -20
VERDICT = {"rx_gather": Verdict.ACCEPT, "duplicate": Verdict.DUPLICATE, "late": Verdict.LATE}


# ---- scenarios ------------------------------------------------------------------------
def _ctx(sc: Scenario, sender: int, op: int, op_len: int) -> OpContext:
    return OpContext(sc.p, sender, sc.world, op, EXP, op_len)


def scatter_to(sc: Scenario, sender: int, op: int, op_len: int, tc=None, rng=None) -> dict:
    """{pkt_index: frame}: what `sender` sends the rank under test in phase 1 of op."""
    p, ctx, out = sc.p, _ctx(sc, sender, op, op_len), {}
    for i, dst, last in scatter_order(p.packets_for(op_len), sc.world, sender, p.last_percent):
        if dst == sc.rank:
            t = p.t_b_us if tc is None else int(tc(rng))
            out[i] = ctx.frame(ctx.header(ubt.MSG_SCATTER, i, 0, last, t), dst, np.zeros(p.p))
    return out


def gather_to(sc: Scenario, sender: int, op: int, op_len: int, tc=None, rng=None) -> dict:
    """{pkt_index: frame}: the reduced packets `sender` (their owner) sends the rank under
    test in phase 2 of op, LAST on the last ones, as the packetizer flags them."""
    p, ctx, out = sc.p, _ctx(sc, sender, op, op_len), {}
    slots = np.arange(sender, p.packets_for(op_len), sc.world)
    for _, i, dst, last in gather_order(slots, sc.world, sender, p.last_percent):
        if dst == sc.rank:
            t = p.t_b_us if tc is None else int(tc(rng))
            cnt = 1 + i % sc.world
            out[i] = ctx.frame(ctx.header(ubt.MSG_GATHER, i, cnt, last, t), dst, np.zeros(p.p))
    return out


def retc(frame: bytes, t_c: int) -> bytes:
    """The same frame with another piggybacked t_C."""
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(t_c_us=t_c)
    dst = int.from_bytes(frame[0:6], "big") & 0xFF
    body = frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :]
    return ubt.build_frame(h, body, src=h.sender, dst=dst, port=P.udp_port)


# ---- the model side -------------------------------------------------------------------
@dataclass
class Expected(bench.Expected):
    """events: (at, kind, fields)."""

    verdicts: list  # (op, index, verdict)


def run_model(sc: Scenario) -> Expected:
    p, world, rank = sc.p, sc.world, sc.rank
    nic = NicModel(p, rank, world)
    events, ends, order, verdicts = [], {}, [], []
    end1, end2 = nic._end_phase1, nic._end_phase2

    def log_end1(op, t, reason):
        f = {"op_id": op.op_id, "op_len": op.n, "at": t, "p1_start": op.p1.start}
        events.append((t, Kind.PHASE1_END, f))
        end1(op, t, reason)
        f["t1"] = op.p1.timeout

    def log_end2(op, t, reason):
        end2(op, t, reason)
        st = op.stats
        order.append(op.op_id)
        ends[op.op_id] = (st.phase2_reason, st.end_us, st.phase2_timeout_us,
                          st.p2_received, st.p2_expected)  # fmt: skip

    nic._end_phase1, nic._end_phase2 = log_end1, log_end2
    cnt = dict.fromkeys(VERDICT, 0)
    rng = np.random.default_rng(0)
    for act in sc.actions:
        t = act[0]
        nic.advance(t)
        if act[1] == "start":
            _, _, op, n = act
            events.append((t, Kind.START, {"op_id": op, "op_len": n, "at": t}))
            nic.start_op(t, op, rng.standard_normal(n).astype(np.float32), EXP)
            continue
        frame = act[2]
        r = classify(frame, p, rank, world, nic.base)
        before = dict(nic.counters)
        nic.receive(t, frame)
        if not isinstance(r, str):
            # after the phase-1 ends the frame caused (the order the top gives them)
            h = r.header
            assert h.op_id not in nic.ops or nic.ops[h.op_id].n == h.op_len
            f = {"op_id": h.op_id, "op_len": h.op_len, "sender": h.sender, "at": t}
            if h.msg_type == ubt.MSG_GATHER:
                f.update(pkt_index=h.pkt_index, last=h.flags & ubt.FLAG_LAST, t_c=h.t_c_us)
                events.append((t, Kind.GATHER, f))
            else:
                events.append((t, Kind.SCATTER, f))
        if not isinstance(r, str) and r.header.msg_type == ubt.MSG_GATHER:
            d = {k: nic.counters[k] - before[k] for k in VERDICT}
            assert sum(d.values()) == 1, d
            (kind,) = [k for k, v in d.items() if v]
            cnt[kind] += 1
            verdicts.append((r.header.op_id, r.header.pkt_index, int(VERDICT[kind])))
    nic.advance(sc.t_end)
    ats = [e[0] for e in events]
    assert ats == sorted(ats), "the model's event order is not in tick order"
    return Expected(events, ends, order, cnt, int(nic.tc[1].tc), nic._timeout(2), verdicts)


# ---- the RTL side ---------------------------------------------------------------------
@dataclass
class Got(bench.Got):
    verdicts: list = field(default_factory=list)


def _payload(f: dict, kind: int) -> dict:
    base = {"op_id": 0, "op_len": 0, "sender": 0, "pkt_index": 0, "last": 0, "t_c": 0,
            "at": 0, "p1_start": 0, "t1": 0}  # fmt: skip
    return {**base, **f, "kind": kind}


def run_rtl(sc: Scenario, exp: Expected, *, idle=0.4, seed=0) -> Got:
    p = sc.p
    dut = GatherTracker(p)
    got = Got()
    rng = random.Random(seed)

    async def monitor(ctx):
        while True:
            bench.record_end(ctx, dut, got)
            if ctx.get(dut.verdict_valid):
                got.verdicts.append(
                    (ctx.get(dut.verdict_op), ctx.get(dut.verdict_index), ctx.get(dut.verdict))
                )
            await ctx.tick()

    async def driver(ctx):
        bench.configure(ctx, dut, sc)
        drv = bench.Driver(ctx, dut)
        time = 0

        async def walk_to(t):  # the fence moves in random steps, as the aggregator's now
            nonlocal time
            while time < t:
                time = min(t, time + rng.choice([1, 1, 3, 50]))
                ctx.set(dut.time, time)
                for _ in range(rng.randint(0, 3)):
                    await drv.step()

        for at, kind, f in exp.events:
            if rng.random() < idle:
                await walk_to(at)
            await drv.send_event(_payload(f, kind), at)
            time = max(time, at)
            ctx.set(dut.time, time)
        await walk_to(sc.t_end)
        ctx.set(dut.ev.payload, _payload({}, 0))
        await drv.finish(got, "rx_gather", sc.t_end, 100_000)

    bench.simulate(dut, driver, monitor)
    return got


def check(sc: Scenario, **kw) -> tuple[Expected, Got]:
    exp, got = bench.check(sc, run_model, run_rtl, **kw)
    assert got.verdicts == exp.verdicts
    return exp, got


# ---- directed scenarios (docs/deadlines.md, phase 2) -----------------------------------
DIRECTED: dict = {}
directed = bench.directed(DIRECTED)


def one_op(world=3, rank=0, op_len=192, p=P):
    """Op 0 started at tick 2; every peer's scatter frames arrive at 5.. (phase 1 ends
    complete); returns the peers' gather frames {(sender, index): frame}."""
    sc = Scenario(p, world, rank)
    sc.actions.append((2, "start", 0, op_len))
    t = 5
    for s in range(world):
        if s != rank:
            for f in scatter_to(sc, s, 0, op_len).values():
                sc.actions.append((t, "frame", f))
                t += 1
    g = {(s, i): f for s in range(world) if s != rank
         for i, f in gather_to(sc, s, 0, op_len).items()}  # fmt: skip
    return sc, g


@directed(t_end=200)
def sc_complete() -> Scenario:
    sc, g = one_op()
    deliver(sc, g, sorted(g), 40, dt=2)
    return sc


@directed(t_end=300)
def sc_early() -> Scenario:
    """LAST from every owner, a non-LAST reduced packet lost: early after the idle gap."""
    sc, g = one_op(world=4, rank=1, op_len=256)
    last_idx = {s: max(i for (s2, i) in g if s2 == s) for s, _ in g}
    lost = next(k for k in sorted(g) if k[1] != last_idx[k[0]])
    deliver(sc, g, [k for k in sorted(g) if k != lost], 30)
    return sc


@directed(t_end=900)
def sc_deadline_anchor() -> Scenario:
    """A LAST reduced packet lost; phase 1 complete early: the phase-2 deadline runs from
    the anchor start + T1, not from the phase-1 end."""
    sc, g = one_op(world=3, rank=2)
    deliver(sc, g, [k for k in sorted(g) if k != max(g)], 20)
    return sc


@directed(t_end=800)
def sc_gather_first() -> Scenario:
    """Peers are faster: the reduced packets are all in before our phase 1 ends (a lost
    scatter packet: phase 1 ends on its deadline), so phase 2 completes at its begin."""
    sc = Scenario(P, 3, 1)
    g = {i: f for s in (0, 2) for i, f in gather_to(sc, s, 0, 256).items()}
    deliver(sc, g, sorted(g), 1)
    sc.actions.append((20, "start", 0, 256))
    fr = [f for s in (0, 2) for f in scatter_to(sc, s, 0, 256).values()]
    for k, f in enumerate(fr[1:]):
        sc.actions.append((25 + k, "frame", f))
    return sc


@directed(t_end=1000)
def sc_peers_gone() -> Scenario:
    """Owner 0 misses a reduced packet of op 0, then sends a frame of op 2 = 0 + K: it is
    done with op 0, what it owes will never come: early right then."""
    sc, g = one_op(world=3, rank=1, op_len=256)
    missing = (0, max(i for (s, i) in g if s == 0))
    deliver(sc, g, [k for k in sorted(g) if k != missing], 30)
    sc.actions.append((45, "start", 1, 100))
    sc.actions.append((60, "frame", next(iter(scatter_to(sc, 0, 2, 64).values()))))
    return sc


@directed(t_end=900)
def sc_duplicate_late() -> Scenario:
    """Op 1 completes while op 0 waits for its deadline (a LAST reduced packet lost): op 1's
    packets sent again are late (op 0 keeps op 1 in the window); op 0's twice: duplicates."""
    sc = Scenario(P, 3, 0)
    sc.actions += [(2, "start", 0, 192), (3, "start", 1, 100)]
    fr = [
        f
        for op, n in ((0, 192), (1, 100))
        for s in (1, 2)
        for f in scatter_to(sc, s, op, n).values()
    ]
    deliver(sc, dict(enumerate(fr)), range(len(fr)), 5)
    g0 = {(s, i): f for s in (1, 2) for i, f in gather_to(sc, s, 0, 192).items()}
    g1 = {(s, i): f for s in (1, 2) for i, f in gather_to(sc, s, 1, 100).items()}
    keys0 = sorted(g0)
    deliver(sc, g0, [k for k in keys0 if k != max(g0)] + keys0[:2], 40)  # two duplicates
    deliver(sc, g1, sorted(g1), 60)
    deliver(sc, g1, sorted(g1)[:2], 100, dt=50)  # late
    return sc


@directed(t_end=700)
def sc_tc_consensus() -> Scenario:
    """Peers' phase-2 t_C pull T down; the last change moves the deadline into the past:
    the phase ends at the tick T changed."""
    sc, g = one_op(world=5, rank=3, op_len=256)
    keys = sorted(g)
    keys.remove(max(g))
    tcs = [40, 250, 30, 20, 500, 25]
    for k, key in enumerate(keys):
        sc.actions.append((30 + 7 * k, "frame", retc(g[key], tcs[k % 6])))
    return sc


@directed(t_end=400)
def sc_single_element_full_world() -> Scenario:
    sc, g = one_op(world=8, rank=6, op_len=1)  # 4 packets: rank 6 owns none
    deliver(sc, g, sorted(g), 30)
    return sc


def test_complete_at_the_last_reduced_packet():
    exp, _ = check(sc_complete())
    assert exp.ends[0][:2] == ("complete", 40 + 2 * 7)  # 4 + 4 reduced packets


def test_early_after_last_flags_and_idle_gap():
    exp, _ = check(sc_early())
    assert exp.ends[0][0] == "early"


def test_deadline_from_the_phase2_anchor():
    exp, _ = check(sc_deadline_anchor())
    assert exp.ends[0][:2] == ("deadline", 2 + 2 * P.t_b_us)


def test_reduced_packets_before_phase2_begins():
    exp, _ = check(sc_gather_first())
    (p1_end,) = [at for at, kind, _ in exp.events if kind == Kind.PHASE1_END]
    assert exp.ends[0][:2] == ("complete", p1_end) and p1_end > 25


def test_peers_gone_ends_phase2_early():
    exp, _ = check(sc_peers_gone())
    assert exp.ends[0][:2] == ("early", 60)


def test_duplicate_and_late_reduced_packets():
    exp, _ = check(sc_duplicate_late())
    assert exp.counters == {"rx_gather": 7 + 5, "duplicate": 2, "late": 2}
    assert exp.ends[1][0] == "complete" and exp.ends[0][0] == "deadline"


def test_tc_consensus_moves_the_deadline_into_the_past():
    exp, _ = check(sc_tc_consensus())
    assert exp.ends[0][0] == "deadline" and exp.ends[0][2] < P.t_b_us


def test_single_element_op_full_world():
    exp, _ = check(sc_single_element_full_world())
    assert exp.ends[0][0] == "complete"


# ---- random scenarios -------------------------------------------------------------------
def random_scenario(seed: int, p: NicParams = P) -> Scenario:
    rng = np.random.default_rng(seed)
    sc, lens = bench.random_ops(rng, p, (2, 7))
    world, rank, n_ops = sc.world, sc.rank, len(lens)
    loss = float(rng.choice([0.0, 0.0, 0.05, 0.3]))
    dup = float(rng.choice([0.0, 0.15, 0.3]))
    tcs = [1, 20, 60, 150, 280, 2000] if rng.random() < 0.5 else [p.t_b_us]

    def tc(r):
        return int(r.choice(tcs))

    pool, later = [], []
    for op in range(n_ops):
        pool += later  # duplicates sent again an op later: late (or stale) by then
        later = []
        for s in range(world):
            if s == rank:
                continue
            fr = list(scatter_to(sc, s, op, lens[op], tc, rng).values())
            fr += list(gather_to(sc, s, op, lens[op], tc, rng).values())
            for f in fr:
                if rng.random() >= loss:
                    pool.append((op, f))
                if rng.random() < dup:
                    (pool if rng.random() < 0.5 else later).append((op, f))
    # peers run ahead up to K ops; start ours as the model's window allows
    t = bench.play(sc, pool, lens, rng, [0, 1, 1, 2, 5, 30, 0, 1, 120], EXP)
    sc.t_end = t + 3 * p.t_b_us + 10
    return sc


@pytest.mark.parametrize("seed", range(8))
def test_random_scenarios_match_the_model(seed):
    exp, _ = check(random_scenario(seed), seed=seed)
    assert exp.ends


def test_three_ops_in_flight_random_scenario():
    """K = 3: a receive window of 6 ops in 8 contexts."""
    check(random_scenario(35, P.replace(ops_in_flight=3)), seed=35)


@pytest.mark.parametrize("seed", (36, 37))
def test_one_op_in_flight_random_scenario(seed):
    """K = 1 (the 25F's build): a receive window of 2 ops in 2 contexts."""
    check(random_scenario(seed, P.replace(ops_in_flight=1)), seed=seed)


def test_random_scenarios_cover_every_rule():
    """The random scenarios, together, end phases for every reason and see accepted and
    duplicate packets (late ones need an older op still open: sc_duplicate_late)."""
    reasons, verdicts = set(), set()
    for seed in range(8):
        exp = run_model(random_scenario(seed))
        reasons |= {e[0] for e in exp.ends.values()}
        verdicts |= {v for *_, v in exp.verdicts}
    assert reasons == {"complete", "early", "deadline"}
    assert verdicts >= {0, 1}


def test_figures():
    """Back to back, an event takes 2 n_ctx + 18 cycles (the end evaluation settles, then
    its picks; the docstring's figure), exactly, at K = 2 and 3;
    at the default P = 256 that is far inside the GATHER's own payload beats."""
    from optireduce.experiments.figures.fig_gather_tracker import figures

    for k, n_ctx in ((2, 4), (3, 8)):
        f = figures(P.replace(ops_in_flight=k))
        assert f["latency_cycles"] == n_ctx + 9  # the docstring's LATENCY
        assert f["cycles_per_event"] == 2 * n_ctx + 18


# ---- cocotb + Verilator -------------------------------------------------------------------
def _scenario_json(name: str, sc: Scenario) -> dict:
    exp = run_model(sc)
    events = [[at, int(kind), {k: int(v) for k, v in f.items()}] for at, kind, f in exp.events]
    verdicts = [list(v) for v in exp.verdicts]
    return bench.scenario_json(name, sc, exp, events, verdicts=verdicts)


def test_cocotb_verilator_replays_the_scenarios(tmp_path):
    scenarios = [(name, build()) for name, build in DIRECTED.items()]
    scenarios += [(f"random{s}", random_scenario(s)) for s in (1, 4)]
    top = PlainStreams(GatherTracker(P), ev="whole")
    bench.replay_in_cocotb(
        tmp_path, top, "gather_tracker", event_layout(P),
        [_scenario_json(n, sc) for n, sc in scenarios],
    )  # fmt: skip
