"""GatherBuffer: placed by index, drained with zeros for missing packets, k per block and the
contributor histogram == host/model/gather_buffer.py GatherBuffer (as codec.decode reads it)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce.host.model.gather_buffer import GatherBuffer as ModelBuffer
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.hw.gather_buffer import GatherBuffer, GatherOp
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, read_element
from tests.hw.test_block_divider import lockstep

SMALL = NicParams(p=16, b=64, c=256, n_max=8)
SMALL2 = NicParams(p=16, b=64, c=256, n_max=8, lanes=2)
W_MIN, W_MAX = -(1 << 31), (1 << 31) - 1


def make_op(p: NicParams, n: int, rng, loss: float, dup: float, extra_bad: int = 0):
    """An op's gather traffic: (model, packets) with loss, duplicates (with other values and
    contributor counts, which must be ignored), shuffled order, and out-of-range indices."""
    n_packets = p.packets_for(n)
    model = ModelBuffer(p, n_packets)
    pkts = []
    for i in range(n_packets):
        if rng.random() < loss:
            continue
        vals = rng.integers(W_MIN, W_MAX + 1, p.p)
        vals[: rng.integers(0, 4)] = rng.choice([W_MIN, W_MAX, 0, -1, 1])  # edge values
        pkts.append((i, vals, int(rng.integers(1, p.n_max + 1))))
        while rng.random() < dup:
            pkts.append((i, rng.integers(W_MIN, W_MAX + 1, p.p), int(rng.integers(1, p.n_max + 1))))
    for _ in range(extra_bad):  # past the slot: dropped as out of range
        j = int(rng.choice([p.c // p.p, p.c // p.p + 1, (1 << 32) - 1]))
        pkts.append((j, rng.integers(W_MIN, W_MAX + 1, p.p), 1))
    rng.shuffle(pkts)
    return model, pkts


def beats_of(dut: GatherBuffer, p: NicParams, slot: int, pkts, model: ModelBuffer | None):
    """Input items for lockstep; placing into the model in the same order counts duplicates."""
    items, dups, bad = [], 0, 0
    nb = p.p // p.lanes
    for i, vals, contrib in pkts:
        if i >= p.c // p.p:
            bad += 1
        elif model is not None and not model.place(i, vals, contrib):
            dups += 1
        for j in range(nb):
            pl = element_payload(vals[j * p.lanes : (j + 1) * p.lanes], j == 0, j == nb - 1)
            side = [(dut.slot, slot), (dut.pkt_index, i), (dut.contributors, contrib)]
            items.append((pl, side if j == 0 else []))
    return items, dups, bad


def cmd(op: GatherOp, slot: int, n: int = 0) -> dict:
    return {"op": op, "slot": slot, "n": n}


class Harness:
    """Runs an async scenario on a GatherBuffer and counts the drop strobes."""

    def __init__(self, p: NicParams, seed: int, idle: float, bp: float | dict) -> None:
        self.p, self.dut = p, GatherBuffer(p)
        self.rng, self.idle, self.bp = random.Random(seed), idle, bp
        self.out: dict = {}
        self.cycle = 0
        self.strobes = {"duplicate": 0, "out_of_range": 0}

    async def run(self, ctx, sources, sinks) -> dict:
        out: dict = {}
        self.cycle = await lockstep(
            ctx, self.dut, sources, sinks, out, self.rng,
            idle=self.idle, backpressure=self.bp, start=self.cycle,
        )  # fmt: skip
        return out

    async def drain(self, ctx, slot: int, n: int, more_inputs=None) -> tuple[np.ndarray, list]:
        p = self.p
        beats = p.padded_len(min(n, p.c) if n else 1) // p.lanes
        blocks = beats * p.lanes // p.b
        sources = {"cmd": [cmd(GatherOp.DRAIN, slot, n)]}
        if more_inputs:
            sources["i"] = more_inputs
        out = await self.run(ctx, sources, {"o": (beats, read_element), "k": (blocks, int)})
        vals = np.array([v for o in out["o"] for v in o[0]])
        nbb = p.b // p.lanes
        assert [o[1] for o in out["o"]] == [int(j % nbb == 0) for j in range(beats)]
        assert [o[2] for o in out["o"]] == [int(j % nbb == nbb - 1) for j in range(beats)]
        return vals, out["k"]

    async def hist(self, ctx, slot: int) -> list[int]:
        res = []
        for a in range(self.p.n_max + 1):
            ctx.set(self.dut.hist_slot, slot)
            ctx.set(self.dut.hist_addr, a)
            await ctx.tick()
            res.append(ctx.get(self.dut.hist_data))
        return res

    def simulate(self, scenario) -> None:
        async def count(ctx):
            async for _, _, dup, bad in ctx.tick().sample(
                self.dut.duplicate, self.dut.out_of_range
            ):
                self.strobes["duplicate"] += dup
                self.strobes["out_of_range"] += bad

        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        sim.add_testbench(scenario)
        sim.add_process(count)
        sim.run()


def check_drain(p, model: ModelBuffer, n: int, vals, ks) -> None:
    """The drained stream is decode's z (missing = 0) and k its received packets per block."""
    z = model.z.ravel()
    np.testing.assert_equal(vals, z[: p.padded_len(n)])
    np.testing.assert_equal(ks, model.have.reshape(-1, p.packets_per_block).sum(axis=1))


@pytest.mark.parametrize(("p", "idle", "bp"), [(SMALL, 0.3, 0.3), (SMALL2, 0.5, 0.2)])
def test_two_slots_loss_duplicates_out_of_order(p, idle, bp):
    rng = np.random.default_rng(11)
    h = Harness(p, seed=3, idle=idle, bp=bp)
    dut = h.dut
    ops = [(0, p.c, 0.3, 0.2), (1, 70, 0.5, 0.3)]  # full slot, and a length not a multiple of b
    made = {slot: (n, *make_op(p, n, rng, loss, dup, extra_bad=2)) for slot, n, loss, dup in ops}

    async def scenario(ctx):
        exp_dup = exp_bad = 0
        items = []
        for slot, (_, model, pkts) in made.items():
            its, d, b = beats_of(dut, p, slot, pkts, model)
            items.append(its)
            exp_dup, exp_bad = exp_dup + d, exp_bad + b
        # interleave the two slots' packets (whole packets, in their shuffled order)
        nb = p.p // p.lanes
        pk = [[its[j : j + nb] for j in range(0, len(its), nb)] for its in items]
        mixed = [b for pair in zip(*pk, strict=False) for q in pair for b in q]
        longer = max(pk, key=len)
        mixed += [b for q in longer[min(map(len, pk)) :] for b in q]
        await h.run(ctx, {"i": mixed}, {})
        for slot, (n, model, _) in made.items():
            vals, ks = await h.drain(ctx, slot, n)
            check_drain(p, model, n, vals, ks)
            assert await h.hist(ctx, slot) == model.histogram(p.n_max).tolist()
        await ctx.tick().repeat(3)
        assert h.strobes == {"duplicate": exp_dup, "out_of_range": exp_bad}
        assert exp_dup > 0 and exp_bad > 0

        # a drain changes nothing: drain slot 1 again; then clear slot 0 and reuse it
        n1, model1, _ = made[1]
        vals, ks = await h.drain(ctx, 1, n1)
        check_drain(p, model1, n1, vals, ks)
        await h.run(ctx, {"cmd": [cmd(GatherOp.CLEAR, 0)]}, {})
        model0, pkts0 = make_op(p, 1, rng, 0.5, 0.1)  # a one-element op: one block
        its, _, _ = beats_of(dut, p, 0, pkts0, model0)
        await h.run(ctx, {"i": its}, {})
        vals, ks = await h.drain(ctx, 0, 1)
        check_drain(p, model0, 1, vals, ks)
        assert await h.hist(ctx, 0) == model0.histogram(p.n_max).tolist()
        assert await h.hist(ctx, 1) == model1.histogram(p.n_max).tolist()

    h.simulate(scenario)


def test_drain_while_the_other_slot_fills():
    """Phase 2 of the next op arrives while the last op drains: both come out right."""
    p = SMALL
    rng = np.random.default_rng(12)
    h = Harness(p, seed=5, idle=0.2, bp=0.4)
    m0, pk0 = make_op(p, 200, rng, 0.25, 0.1)
    m1, pk1 = make_op(p, 256, rng, 0.25, 0.1)

    async def scenario(ctx):
        its0, _, _ = beats_of(h.dut, p, 0, pk0, m0)
        await h.run(ctx, {"i": its0}, {})
        its1, _, _ = beats_of(h.dut, p, 1, pk1, m1)
        vals, ks = await h.drain(ctx, 0, 200, more_inputs=its1)
        check_drain(p, m0, 200, vals, ks)
        vals, ks = await h.drain(ctx, 1, 256)
        check_drain(p, m1, 256, vals, ks)
        assert await h.hist(ctx, 1) == m1.histogram(p.n_max).tolist()

    h.simulate(scenario)


def test_all_missing_and_edge_lengths():
    """Nothing received (all zeros, k = 0, histogram 0 = every packet); n = 0 and n > c drain
    one block and the whole slot (the guard never reads another slot)."""
    p = SMALL
    h = Harness(p, seed=1, idle=0.0, bp=0.0)
    rng = np.random.default_rng(3)
    m1, pk1 = make_op(p, p.c, rng, 0.0, 0.0)

    async def scenario(ctx):
        vals, ks = await h.drain(ctx, 0, 130)
        np.testing.assert_equal(vals, np.zeros(192, dtype=np.int64))
        assert ks == [0, 0, 0]
        assert await h.hist(ctx, 0) == ModelBuffer(p, 12).histogram(p.n_max).tolist()
        its, _, _ = beats_of(h.dut, p, 1, pk1, m1)
        await h.run(ctx, {"i": its}, {})
        vals, ks = await h.drain(ctx, 1, (1 << p.op_count_bits) - 1)  # above c: clamped
        check_drain(p, m1, p.c, vals, ks)
        vals, ks = await h.drain(ctx, 0, 0)  # one block, as padded_len(0)
        np.testing.assert_equal(vals, np.zeros(p.b, dtype=np.int64))

    h.simulate(scenario)


def test_one_beat_packets_back_to_back():
    """A packet per cycle (p = lanes): histogram increments back to back on the same entry;
    two-beat blocks with a k sink that rarely takes: the drain waits for k, never drops one."""
    p = NicParams(p=4, b=8, c=64, n_max=4, lanes=4)
    rng = np.random.default_rng(8)
    h = Harness(p, seed=4, idle=0.0, bp={"o": 0.2, "k": 0.9})
    m0, pk0 = make_op(p, 64, rng, 0.2, 0.3)
    m1, pk1 = make_op(p, 50, rng, 0.2, 0.3)
    for j, (i, v, _) in enumerate(pk0[:10]):  # a run with equal counts: same-entry increments
        pk0[j] = (i, v, 2)

    async def scenario(ctx):
        its0, _, _ = beats_of(h.dut, p, 0, pk0, m0)
        its1, _, _ = beats_of(h.dut, p, 1, pk1, m1)
        await h.run(ctx, {"i": its0 + its1}, {})
        for slot, model, n in ((0, m0, 64), (1, m1, 50)):
            vals, ks = await h.drain(ctx, slot, n)
            check_drain(p, model, n, vals, ks)
            assert await h.hist(ctx, slot) == model.histogram(p.n_max).tolist()

    h.simulate(scenario)


def test_default_size_rate_and_latency():
    """Default NicParams: one op of 5000 elements (2 blocks of 4096), 40% loss; the drain runs
    at one beat per cycle with k for every block and LATENCY cycles after the command."""
    p = NicParams()
    rng = np.random.default_rng(21)
    h = Harness(p, seed=2, idle=0.0, bp=0.0)
    m, pk = make_op(p, 5000, rng, 0.4, 0.05)

    async def scenario(ctx):
        its, _, _ = beats_of(h.dut, p, 1, pk, m)
        await h.run(ctx, {"i": its}, {})
        out = await h.run(
            ctx, {"cmd": [cmd(GatherOp.DRAIN, 1, 5000)]},
            {"o": (8192, read_element), "k": (2, int)},
        )  # fmt: skip
        vals = np.array([v for o in out["o"] for v in o[0]])
        check_drain(p, m, 5000, vals, out["k"])
        oc = out["o_cycles"]
        assert oc[0] - out["cmd_cycles"][0] == GatherBuffer.LATENCY
        assert oc[-1] - oc[0] == len(oc) - 1
        assert await h.hist(ctx, 1) == m.histogram(p.n_max).tolist()

    h.simulate(scenario)


# ---- cocotb + Verilator --------------------------------------------------------------------
def test_cocotb_verilator():
    p = SMALL2
    cfg = {"p": p.p, "b": p.b, "c": p.c, "lanes": p.lanes, "n_max": p.n_max, "k": 2}
    top = AxisWrapper(PlainStreams(GatherBuffer(p), cmd="fields", k="axis"))
    run_bench(top, "gather_buffer_top", f"{__package__}.benches.tb_gather_buffer", cfg)
