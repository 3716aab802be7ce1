"""Phase-1 aggregator (hw/aggregator.py) against the NIC model, event by event.

The reference is host/model/nic_model.py: NicModel itself. A scenario is a list of
host-level actions (start an op, deliver a frame) at ticks. The model runs them;
every frame that passes the parser's checks becomes an aggregator event at the
same tick, and start_op becomes a START and the op's OWN packets. Then the RTL runs
the events (with random idle on its inputs and backpressure on its output; the OWN
packets held back among the later events, as the core's encode delays them) and must
give the model's phase-1 ends (op, reason, tick, T, received, expected), the
model's gather payloads (index, contributor count, the means) and its scatter
counters (rx_scatter, duplicate, late), bit for bit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from optireduce import ubt
from optireduce.frame_checks import classify
from optireduce.host.model.codec import encode
from optireduce.host.model.nic_model import NicModel
from optireduce.host.model.packetizer import OpContext, scatter_order
from optireduce.hw.aggregator import Aggregator, Kind, event_layout
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.params import NicParams
from tests.hw import phase_owner_bench as bench
from tests.hw.phase_owner_bench import Scenario, deliver

P = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=300, alpha_q8=64)
EXP = -20
WMAX = P.wire_max


# ---- scenarios ----------------------------------------------------------------------
def peer_values(rng: np.random.Generator, p: NicParams) -> np.ndarray:
    """A packet of wire values: random, or an edge pattern (max, min, zero, mixed)."""
    kind = rng.integers(6)
    if kind == 0:
        return np.full(p.p, WMAX)
    if kind == 1:
        return np.full(p.p, -WMAX)
    if kind == 2:
        return np.zeros(p.p, dtype=np.int64)
    if kind == 3:
        return rng.choice([WMAX, -WMAX, 0, 1, -1], p.p)
    return rng.integers(-WMAX, WMAX + 1, p.p)


def scatter_frames_to(sc: Scenario, sender: int, op: int, op_len: int, tc, rng) -> dict:
    """{pkt_index: frame} that `sender` sends the rank under test in phase 1 of op."""
    p = sc.p
    ctx = OpContext(p, sender, sc.world, op, EXP, op_len)
    out = {}
    for i, dst, last in scatter_order(p.packets_for(op_len), sc.world, sender, p.last_percent):
        if dst == sc.rank:
            t = tc if isinstance(tc, int) else int(tc(rng))
            h = ctx.header(ubt.MSG_SCATTER, i, 0, last, t)
            out[i] = ctx.frame(h, dst, peer_values(rng, p))
    return out


def gather_frame(sc: Scenario, sender: int, op: int, op_len: int, i: int, tc: int) -> bytes:
    ctx = OpContext(sc.p, sender, sc.world, op, EXP, op_len)
    h = ctx.header(ubt.MSG_GATHER, i, 1, False, tc)
    return ctx.frame(h, sc.rank, np.zeros(sc.p.p, dtype=np.int64))


def _rebuild(frame: bytes, **fields) -> bytes:
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(**fields)
    dst = int.from_bytes(frame[0:6], "big") & 0xFF
    return ubt.build_frame(
        h, frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :], src=h.sender, dst=dst, port=P.udp_port
    )


# ---- the model side -----------------------------------------------------------------
@dataclass
class Expected(bench.Expected):
    """events: (tick, kind, fields dict, values or None)."""

    slots: dict  # (op, index) -> (count, values)


def run_model(sc: Scenario, data_seed: int = 0) -> Expected:
    p, world, rank = sc.p, sc.world, sc.rank
    rng = np.random.default_rng(data_seed)
    nic = NicModel(p, rank, world)
    events, slots, ops, order = [], {}, {}, []
    end_phase1 = nic._end_phase1

    def log_end(op, t, reason):  # the order phases end in (it feeds the t_C estimator)
        order.append(op.op_id)
        end_phase1(op, t, reason)

    nic._end_phase1 = log_end
    cnt = {"rx_scatter": 0, "duplicate": 0, "late": 0}

    def collect():
        for o in nic.ops.values():
            ops[o.op_id] = o
        for tx in nic.poll_tx():
            if tx.phase == 2 and (tx.op_id, tx.pkt_index) not in slots:
                h = ubt.UbtHeader.unpack(tx.frame, ubt.L2_L4_LEN)
                vals = ubt.payload_values(tx.frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :])
                slots[(tx.op_id, tx.pkt_index)] = (h.contributors, [int(v) for v in vals])

    for act in sc.actions:
        t = act[0]
        nic.advance(t)
        collect()
        if act[1] == "start":
            _, _, op, n = act
            x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
            y = encode(x, EXP, op, p).y.reshape(-1, p.p)
            events.append((t, Kind.START, {"op_id": op, "op_len": n}, None))
            for i in range(rank, p.packets_for(n), world):
                events.append((t, Kind.OWN, {"op_id": op, "op_len": n, "sender": rank,
                                             "pkt_index": i}, y[i]))  # fmt: skip
            nic.start_op(t, op, x, EXP)
        else:
            frame = act[2]
            r = classify(frame, p, rank, world, nic.base)
            before = {k: nic.counters[k] for k in cnt}
            nic.receive(t, frame)
            if isinstance(r, str):
                continue
            h = r.header
            assert h.exponent == EXP and (h.op_id not in nic.ops or nic.ops[h.op_id].n == h.op_len)
            f = {"op_id": h.op_id, "op_len": h.op_len, "sender": h.sender}
            if h.msg_type == ubt.MSG_SCATTER:
                f.update(pkt_index=h.pkt_index, last=h.flags & ubt.FLAG_LAST, t_c=h.t_c_us)
                events.append((t, Kind.SCATTER, f, ubt.payload_values(r.payload)))
                for k in cnt:
                    cnt[k] += nic.counters[k] - before[k]
            else:
                events.append((t, Kind.GATHER, f, None))
        collect()
    nic.advance(sc.t_end)
    collect()
    ends = {}
    for op, o in ops.items():
        st = o.stats
        if st.phase1_reason:
            ends[op] = (st.phase1_reason, st.phase1_end_us, st.phase1_timeout_us,
                        st.p1_received, st.p1_expected)  # fmt: skip
    return Expected(events, ends, order, cnt, int(nic.tc[0].tc), nic._timeout(1), slots)


# ---- the RTL side -------------------------------------------------------------------
@dataclass
class Got(bench.Got):
    slots: dict = field(default_factory=dict)


def run_rtl(
    sc: Scenario, exp: Expected, *, idle=0.3, backpressure=0.3, own_rate=0.3, seed=0
) -> Got:
    """`own_rate`: the chance an OWN packet goes before the next event (else later)."""
    p = sc.p
    dut = Aggregator(p)
    got = Got()
    rng = random.Random(seed)
    beats = p.p // p.lanes
    n_slots = len(exp.slots)

    async def monitor(ctx):
        cur = None
        while True:
            ready = not (backpressure and rng.random() < backpressure)
            ctx.set(dut.o.ready, ready)
            bench.record_end(ctx, dut, got)
            if ready and ctx.get(dut.o.valid):
                pl = ctx.get(dut.o.payload)
                key = (ctx.get(dut.o_op), ctx.get(dut.o_index))
                if pl.first:
                    assert cur is None
                    cur = (key, ctx.get(dut.o_count), [])
                assert cur is not None and cur[0] == key
                cur[2].extend(int(v) for v in pl.data)
                if pl.last:
                    assert len(cur[2]) == p.p and key not in got.slots
                    got.slots[key] = (cur[1], cur[2])
                    cur = None
            await ctx.tick()

    async def driver(ctx):
        bench.configure(ctx, dut, sc)
        drv = bench.Driver(ctx, dut)
        step = drv.step
        ticks = 0

        async def tick_to(t):
            nonlocal ticks
            while ticks < t:
                ctx.set(dut.tick, 1)
                await step()
                ctx.set(dut.tick, 0)
                ticks += 1
                for _ in range(rng.randint(0, 6)):
                    await step()

        async def payload(vals):
            k = 0
            while k < beats:
                if idle and rng.random() < idle:
                    ctx.set(dut.i.valid, 0)
                    await step()
                    continue
                lane = [int(v) for v in vals[k * p.lanes : (k + 1) * p.lanes]]
                ctx.set(dut.i.payload, {"data": lane, "first": k == 0, "last": k == beats - 1})
                ctx.set(dut.i.valid, 1)
                r = ctx.get(dut.i.ready)
                await step()
                if r:
                    k += 1
            ctx.set(dut.i.valid, 0)

        def word(f):
            return {"kind": Kind.SCATTER, "op_id": 0, "op_len": 0, "sender": 0,
                    "pkt_index": 0, "last": 0, "t_c": 0, **f}  # fmt: skip

        own = []  # the started op's OWN packets not yet sent: (fields, values)

        async def send_own():
            f, vals = own.pop(0)
            await drv.send_event(word(f), None)
            await payload(vals)

        async def send(f, t, vals):
            """Offer an event; while a readout waits for the own packets, they go first
            (the core's merge: `own_only`)."""
            ctx.set(dut.ev.payload, word(f))
            while True:
                if ctx.get(dut.own_only):
                    assert own, "a readout waits for own packets that will not come"
                    ctx.set(dut.ev.valid, 0)
                    await send_own()
                    ctx.set(dut.ev.payload, word(f))
                    continue
                ctx.set(dut.ev.valid, 1)
                r = ctx.get(dut.ev.ready)
                await step()
                if r:
                    break
            ctx.set(dut.ev.valid, 0)
            assert ctx.get(dut.now) == t
            if vals is not None:
                await payload(vals)

        for t, kind, f, vals in exp.events:
            if kind == Kind.OWN:
                own.append(({**f, "kind": kind}, vals))
                continue
            while own and (kind == Kind.START or rng.random() < own_rate):
                await send_own()  # all before the next START
            await tick_to(t)
            while own and rng.random() < own_rate:
                await send_own()
            await send({**f, "kind": kind}, t, vals)
        while own:
            await send_own()
        await tick_to(sc.t_end)

        def out():
            return len(got.slots) >= n_slots and len(got.ends) >= len(exp.ends)

        await drv.finish(got, "rx_scatter", sc.t_end, 200_000, out)

    bench.simulate(dut, driver, monitor)
    return got


def check(sc: Scenario, **kw) -> tuple[Expected, Got]:
    exp, got = bench.check(sc, run_model, run_rtl, **kw)
    assert set(got.slots) == set(exp.slots)
    for key in exp.slots:
        assert got.slots[key][0] == exp.slots[key][0], key
        np.testing.assert_equal(got.slots[key][1], exp.slots[key][1], err_msg=str(key))
    return exp, got


# ---- directed scenarios (the rules of docs/deadlines.md) -----------------------------
DIRECTED: dict = {}
directed = bench.directed(DIRECTED)


def one_op(world=3, rank=0, op_len=192, seed=0, p=P):
    """A started op and the frames every peer sends the rank under test."""
    rng = np.random.default_rng(seed)
    sc = Scenario(p, world, rank)
    sc.actions.append((2, "start", 0, op_len))
    frames = {}
    for s in range(world):
        if s != rank:
            for i, f in scatter_frames_to(sc, s, 0, op_len, p.t_b_us, rng).items():
                frames[(s, i)] = f
    return sc, frames


@directed(t_end=100)
def sc_all_arrived() -> Scenario:
    sc, frames = one_op()
    deliver(sc, frames, sorted(frames), dt=3)
    return sc


@directed(t_end=200)
def sc_early() -> Scenario:
    """LAST from every sender, a non-LAST packet lost: early end after the idle gap."""
    sc, frames = one_op(world=4, rank=1)
    lost = next(k for k in sorted(frames) if k[1] < max(i for (_, i) in frames))
    deliver(sc, frames, [k for k in sorted(frames) if k != lost])
    return sc


@directed(t_end=400)
def sc_deadline() -> Scenario:
    sc, frames = one_op(world=3, rank=2)
    last = max(frames)  # highest index of the highest sender: flagged LAST
    deliver(sc, frames, [k for k in sorted(frames) if k != last])
    return sc


@directed(t_end=400)
def sc_duplicate_late() -> Scenario:
    sc, frames = one_op(world=3, rank=0)
    keys = sorted(frames)
    last = max(frames)
    deliver(sc, frames, [k for k in keys if k != last] + keys[:2])  # two duplicates
    sc.actions.append((350, "frame", frames[last]))  # after the deadline: late
    sc.actions.append((351, "frame", frames[keys[0]]))  # late too (not a duplicate)
    return sc


@directed(t_end=400)
def sc_tc_consensus() -> Scenario:
    """Peers' t_C pull T down; the last change moves the deadline into the past."""
    sc, frames = one_op(world=5, rank=3, op_len=256)
    keys = sorted(frames)
    keys.remove(max(frames))
    tcs = [40, 250, 30, 20, 500, 25]
    for k, key in enumerate(keys):
        sc.actions.append((10 + 5 * k, "frame", _rebuild(frames[key], t_c_us=tcs[k % 6])))
    return sc


@directed(t_end=60)
def sc_full_world_single_element() -> Scenario:
    sc, frames = one_op(world=8, rank=2, op_len=1)  # 4 packets: rank 2 owns one
    deliver(sc, frames, sorted(frames))
    return sc


@directed(t_end=80)
def sc_ops_in_flight() -> Scenario:
    """Peers ahead of us: frames of ops 0..2 before and after their starts, and a sender's
    frame of op 2 = 0 + K, which says it is done with op 0: op 0 ends early right then."""
    rng = np.random.default_rng(5)
    sc = Scenario(P, 3, 1)
    fr = {op: {} for op in range(3)}
    for op in range(3):
        for s in (0, 2):
            tcs = scatter_frames_to(sc, s, op, 200, lambda r: r.integers(50, 400), rng)
            for i, f in tcs.items():
                fr[op][(s, i)] = f
    deliver(sc, fr[0], sorted(fr[0])[:3], t0=1)
    sc.actions.append((5, "start", 0, 200))
    deliver(sc, fr[1], sorted(fr[1]), t0=6)  # op 1 complete before its start
    deliver(sc, fr[0], [k for k in sorted(fr[0])[3:] if k != (2, 1)], t0=20)
    sc.actions.append((30, "start", 1, 200))
    deliver(sc, fr[2], [k for k in sorted(fr[2]) if k[0] == 2][:1], t0=40)
    sc.actions.append((41, "frame", gather_frame(sc, 0, 2, 200, 0, 77)))
    return sc


def test_all_arrived_completes_at_the_last_arrival():
    exp, _ = check(sc_all_arrived())
    assert exp.ends[0][:2] == ("complete", 10 + 3 * (2 * 4 - 1))


def test_early_timeout_after_last_flags_and_idle_gap():
    exp, _ = check(sc_early())
    idle = (P.alpha_q8 * P.t_b_us) >> 8
    assert exp.ends[0][0] == "early" and exp.ends[0][1] == 10 + 8 - 1 + idle


def test_hard_deadline_when_a_last_packet_is_lost():
    exp, _ = check(sc_deadline())
    assert exp.ends[0][:2] == ("deadline", 2 + P.t_b_us)


def test_duplicate_and_late_packets_are_counted_and_ignored():
    exp, _ = check(sc_duplicate_late())
    assert exp.counters == {"rx_scatter": 7, "duplicate": 2, "late": 2}


def test_tc_consensus_moves_the_deadline_even_into_the_past():
    exp, _ = check(sc_tc_consensus())
    assert exp.ends[0][0] == "deadline" and exp.ends[0][2] < P.t_b_us


def test_single_element_op_and_edge_sums_with_a_full_world():
    exp, _ = check(sc_full_world_single_element())
    assert {c for c, _ in exp.slots.values()} == {8}


def test_peers_ahead_and_ops_in_flight():
    exp, _ = check(sc_ops_in_flight())
    assert exp.ends[0][:2] == ("early", 40) and exp.ends[1][0] == "complete"


# ---- random scenarios -----------------------------------------------------------------
def random_scenario(seed: int, p: NicParams = P) -> Scenario:
    rng = np.random.default_rng(seed)
    sc, lens = bench.random_ops(rng, p, (1, 6))
    world, rank, n_ops = sc.world, sc.rank, len(lens)
    loss = float(rng.choice([0.0, 0.05, 0.3]))

    def tc(r):
        return int(r.choice([1, 20, 60, 150, 280, 2000]))

    pool = []
    for op in range(n_ops):
        for s in range(world):
            if s == rank:
                continue
            for f in scatter_frames_to(sc, s, op, lens[op], tc, rng).values():
                if rng.random() >= loss:
                    pool.append((op, f))
                if rng.random() < 0.1:
                    pool.append((op, f))  # duplicate
            for i in range(s, p.packets_for(lens[op]), world):
                if rng.random() < 0.5:
                    pool.append((op, gather_frame(sc, s, op, lens[op], i, tc(rng))))
    # peers run ahead up to K ops; start ours as the model's window allows
    t = bench.play(sc, pool, lens, rng, [0, 1, 1, 2, 5, 30], EXP)
    sc.t_end = t + 2 * p.t_b_us + 10
    return sc


@pytest.mark.parametrize("seed", range(6))
def test_random_scenarios_match_the_model(seed):
    sc = random_scenario(seed)
    check(sc, seed=seed)


def test_three_ops_in_flight_random_scenario():
    """K = 3: a receive window of 6 ops in 8 contexts."""
    check(random_scenario(35, P.replace(ops_in_flight=3)), seed=35)


@pytest.mark.parametrize("seed", (36, 37))
def test_one_op_in_flight_random_scenario(seed):
    """K = 1 (the 25F's build): a receive window of 2 ops in 2 contexts."""
    check(random_scenario(seed, P.replace(ops_in_flight=1)), seed=seed)


def test_many_ranks_random_scenario_takes_the_reciprocal_multiply():
    """n_max = 16: too many divisors for the readout's digit tables, so its means come
    from the reciprocal multiply; n_max = 8 (every other test here) takes the tables."""
    from optireduce.hw.mean_readout import MeanReadout

    p = P.replace(n_max=16)
    assert not MeanReadout.uses_digits(p) and MeanReadout.uses_digits(P)
    check(random_scenario(12, p), seed=12)


def test_two_lanes_random_scenario():
    p = P.replace(lanes=2)
    sc = random_scenario(11, p)
    check(sc, seed=11)


def test_rate_and_latency_figures():
    """Payload beats back to back within a packet; the documented LATENCY; readout at about
    one beat per cycle (two cycles between slots for the count lookup)."""
    from optireduce.experiments.figures.fig_aggregator import figures

    f = figures(P)
    assert f["latency_cycles"] == Aggregator.latency(P)
    assert 1.0 < f["cycles_per_element"] <= 1 + 16 / P.p
    assert 1.0 < f["readout_cycles_per_element"] <= (P.p + 2) / P.p


# ---- cocotb + Verilator ------------------------------------------------------------------
def _scenario_json(name: str, sc: Scenario) -> dict:
    exp = run_model(sc)

    def vals(v):
        return None if v is None else [int(x) for x in v]

    events = [
        [t, int(kind), {k: int(v) for k, v in f.items()}, vals(v)] for t, kind, f, v in exp.events
    ]
    slots = {f"{op},{i}": [c, v] for (op, i), (c, v) in exp.slots.items()}
    return bench.scenario_json(name, sc, exp, events, slots=slots)


def test_cocotb_verilator_replays_the_scenarios(tmp_path):
    scenarios = [(name, build()) for name, build in DIRECTED.items()]
    scenarios += [(f"random{s}", random_scenario(s)) for s in (1, 4)]
    top = AxisWrapper(PlainStreams(Aggregator(P), ev="whole"))
    bench.replay_in_cocotb(
        tmp_path, top, "aggregator", event_layout(P),
        [_scenario_json(n, sc) for n, sc in scenarios], lanes=P.lanes,
    )  # fmt: skip
