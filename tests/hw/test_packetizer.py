"""Packetizer: frames and own packets bit for bit against host/model/packetizer.py.

amaranth.sim with random idle and backpressure on `i`, `o` and `own`, several ops back to
back (scatter and gather mixed, context changing per op); run_stream for rate and latency;
one cocotb configuration under Verilator (frames byte for byte, IPv4 checksums by scapy).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.packetizer import OpContext, gather_frames, scatter_frames
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.hw.packetizer import Packetizer
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import run_stream
from optireduce.sim.stream_sim import simulate as run_sim

SMALL = NicParams(p=16, b=64, c=256, n_max=8)
WIRE_MAX = (1 << 31) - 1
WIRE_MIN = -(1 << 31)


@dataclass
class Op:
    """One op as the packetizer sees it, and what the model says must come out."""

    ctx: OpContext
    gather: bool
    t_c_us: int
    values: np.ndarray  # scatter: n_packets x P; gather: n_slots x P (the means)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def ports(self, contributors: int = 0) -> dict:
        c = self.ctx
        return {
            "msg_type": ubt.MSG_GATHER if self.gather else ubt.MSG_SCATTER,
            "rank": c.rank, "world": c.world, "job_id": c.p.job_id, "op_id": c.op_id,
            "exponent": c.exponent, "op_len": c.op_len, "t_c_us": self.t_c_us,
            "contributors": contributors, "reserved": c.reserved,
        }  # fmt: skip

    def frames(self) -> list[tuple[int, int, bytes]]:
        if self.gather:
            c = self.ctx
            slots = np.arange(c.rank, c.p.packets_for(c.op_len), c.world)
            return gather_frames(slots, self.values, self.counts, self.ctx, self.t_c_us)
        return scatter_frames(self.values, self.ctx, self.t_c_us)

    def own(self) -> list[tuple[int, list[int]]]:
        if self.gather:
            return []
        w, r = self.ctx.world, self.ctx.rank
        return [(i, list(v)) for i, v in enumerate(self.values) if i % w == r]


def edge_values(rng: np.random.Generator, n: int, p: int, kind: str) -> np.ndarray:
    if kind == "zeros":
        return np.zeros((n, p), dtype=np.int64)
    if kind == "max":
        return np.full((n, p), WIRE_MAX, dtype=np.int64)
    if kind == "min":
        return np.full((n, p), WIRE_MIN, dtype=np.int64)
    v = rng.integers(WIRE_MIN, WIRE_MAX + 1, (n, p), dtype=np.int64)
    v.flat[:4] = [WIRE_MAX, WIRE_MIN, -1, 0]
    return v


def make_op(p: NicParams, rng: np.random.Generator, *, gather: bool, world: int, rank: int,
            op_len: int, kind: str = "random", addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
            ) -> Op:  # fmt: skip
    op_id = int(rng.choice([0, 0xFFFF_FFFF, int(rng.integers(0, 1 << 32))]))
    exponent = int(rng.choice([-128, 127, int(rng.integers(-128, 128))]))
    t_c = int(rng.choice([0, 0xFFFF_FFFF, int(rng.integers(0, 1 << 32))]))
    # the proposal word of in-band exponents: none, the extremes, or any int8
    proposal = rng.choice([None, -128, 127, int(rng.integers(-128, 128))])
    reserved = ubt.proposal_word(None if proposal is None else int(proposal))
    ctx = OpContext(p, rank, world, op_id, exponent, op_len, addressing, reserved)
    n = p.packets_for(op_len)
    if gather:
        rows = len(range(rank, n, world))
        counts = rng.integers(1, world + 1, rows)
        counts[-1:] = world
        return Op(ctx, True, t_c, edge_values(rng, rows, p.p, kind), counts)
    return Op(ctx, False, t_c, edge_values(rng, n, p.p, kind))


@dataclass
class Result:
    frames: list = field(default_factory=list)  # (dst, bytes)
    srcs: list = field(default_factory=list)  # the source of each frame
    own: list = field(default_factory=list)  # (index, values) of source 0
    own_by_source: list = field(default_factory=list)
    in_cycles: list = field(default_factory=list)
    out_cycles: list = field(default_factory=list)


def _feed(dut: Packetizer, ops: list[Op]) -> list:
    """(ports, payload) of every input beat of the ops, in order."""
    L, beats = dut.lanes, dut.beats
    feed = []
    for op in ops:
        for row, vals in enumerate(op.values):
            ports = op.ports(int(op.counts[row]) if op.gather else 0)
            # first/last mark the op (scatter) or each slot (gather); the block counts instead
            first_pk = op.gather or row == 0
            last_pk = op.gather or row == len(op.values) - 1
            for b in range(beats):
                data = [int(v) for v in vals[b * L : (b + 1) * L]]
                pl = {"data": data, "first": int(b == 0 and first_pk),
                      "last": int(b == beats - 1 and last_pk)}  # fmt: skip
                feed.append((ports, pl))
    return feed


def simulate(dut: Packetizer, ops: list[Op], *, idle: float = 0.0, bp: float = 0.0,
             bp_own: float = 0.0, seed: int = 0, by_source: list[list[Op]] | None = None
             ) -> Result:  # fmt: skip
    """Drive the ops' beats into `i` (context ports set with each op), drain `o` and `own`.
    A packetizer of several sources takes `by_source`, each source's ops, instead."""
    srcs = [dut] if dut.n_sources == 1 else list(dut.sources)
    by_source = [ops] if by_source is None else by_source
    feeds = [_feed(dut, o) for o in by_source]
    want_frames = sum(len(op.frames()) for o in by_source for op in o)
    want_own = [sum(len(op.own()) for op in o) for o in by_source]
    res = Result(own_by_source=[[] for _ in srcs])
    res.own = res.own_by_source[0]
    rng = random.Random(seed)
    limit = 200 * (sum(map(len, feeds)) + want_frames * dut.frame_beats) + 1000

    async def bench(ctx):
        ks, ports_set = [0] * len(srcs), [None] * len(srcs)
        frame, frame_dst, frame_src = bytearray(), None, None
        own_pkt, own_idx = [[] for _ in srcs], [None] * len(srcs)
        for cycle in range(limit):
            if (len(res.frames) == want_frames and ks == [len(f) for f in feeds]
                    and [len(x) for x in res.own_by_source] == want_own):  # fmt: skip
                return
            for j, (src, feed) in enumerate(zip(srcs, feeds, strict=True)):
                offer = ks[j] < len(feed) and not (idle and rng.random() < idle)
                ctx.set(src.i.valid, offer)
                if offer:
                    ports, payload = feed[ks[j]]
                    if ports is not ports_set[j]:
                        for name, v in ports.items():
                            ctx.set(getattr(src, name), v)
                        ports_set[j] = ports
                    ctx.set(src.i.payload, payload)
                own_ready = not (bp_own and rng.random() < bp_own)
                ctx.set(src.own.ready, own_ready)
                if offer and ctx.get(src.i.ready):
                    res.in_cycles.append(cycle)
                    ks[j] += 1
                if own_ready and ctx.get(src.own.valid):
                    pl = ctx.get(src.own.payload)
                    idx = ctx.get(src.own_index)
                    assert bool(pl.first) == (len(own_pkt[j]) == 0), "own first flag"
                    assert own_idx[j] in (None, idx), "own_index changed inside a packet"
                    own_idx[j] = idx
                    own_pkt[j] += [int(v) for v in pl.data]
                    assert bool(pl.last) == (len(own_pkt[j]) == dut.p.p), "own last flag"
                    if pl.last:
                        res.own_by_source[j].append((own_idx[j], own_pkt[j]))
                        own_pkt[j], own_idx[j] = [], None
            o_ready = not (bp and rng.random() < bp)
            ctx.set(dut.o.ready, o_ready)
            if o_ready and ctx.get(dut.o.valid):
                res.out_cycles.append(cycle)
                pl = ctx.get(dut.o.payload)
                d, sj = ctx.get(dut.dst), ctx.get(dut.src)
                assert frame_dst in (None, d), "dst changed inside a frame"
                assert frame_src in (None, sj), "src changed inside a frame"
                frame_dst, frame_src = d, sj
                keep = int(pl.keep)
                assert pl.last or keep == (1 << dut.nbytes) - 1, "keep not full before last"
                frame += bytes(int(pl.data[j]) for j in range(dut.nbytes) if keep >> j & 1)
                if pl.last:
                    res.frames.append((frame_dst, bytes(frame)))
                    res.srcs.append(frame_src)
                    frame, frame_dst, frame_src = bytearray(), None, None
            await ctx.tick()
        raise TimeoutError(f"{ks} beats in, {len(res.frames)}/{want_frames} frames")

    run_sim(dut, bench)
    return res


def check(res: Result, ops: list[Op]) -> None:
    want = [(dst, f) for op in ops for _, dst, f in op.frames()]
    assert [d for d, _ in res.frames] == [d for d, _ in want]
    for (_, got), (_, exp) in zip(res.frames, want, strict=True):
        np.testing.assert_equal(np.frombuffer(got, np.uint8), np.frombuffer(exp, np.uint8))
    own = [x for op in ops for x in op.own()]
    assert [i for i, _ in res.own] == [i for i, _ in own]
    np.testing.assert_equal(np.array([v for _, v in res.own]).reshape(-1),
                            np.array([v for _, v in own]).reshape(-1))  # fmt: skip


# (world, rank, op lengths): world 2 and n_max, rank 0 / last / middle, short ops (one block),
# lengths not a multiple of B, a full chunk C, fewer packets than ranks.
SCATTER_CASES = [
    (2, 0, [256, 1]),
    (2, 1, [65, 200]),
    (8, 7, [256, 64]),
    (8, 0, [1, 129]),
    (3, 1, [250, 64, 130]),
    (5, 4, [17, 256]),
]


@pytest.mark.parametrize(("world", "rank", "lens"), SCATTER_CASES)
def test_scatter_matches_model(world, rank, lens):
    rng = np.random.default_rng(world * 31 + rank)
    p = SMALL
    kinds = ["random", "max", "min", "zeros"]
    ops = [make_op(p, rng, gather=False, world=world, rank=rank, op_len=n, kind=kinds[k % 4])
           for k, n in enumerate(lens)]  # fmt: skip
    res = simulate(Packetizer(p), ops, idle=0.3, bp=0.3, bp_own=0.3, seed=world + rank)
    check(res, ops)


@pytest.mark.parametrize(("world", "rank", "lens"), [(2, 0, [256, 33]), (2, 1, [64]),
                                                     (8, 3, [256, 1]), (8, 7, [129])])  # fmt: skip
def test_gather_matches_model(world, rank, lens):
    rng = np.random.default_rng(100 + world * 31 + rank)
    p = SMALL
    ops = [make_op(p, rng, gather=True, world=world, rank=rank, op_len=n, kind=k)
           for n, k in zip(lens, ["random", "min"][: len(lens)], strict=True)]  # fmt: skip
    res = simulate(Packetizer(p), ops, idle=0.3, bp=0.4, seed=world * 7 + rank)
    check(res, ops)


@pytest.mark.parametrize("last_percent", [1, 30, 50, 100])
def test_last_flags_and_mixed_ops(last_percent):
    """Scatter and gather ops back to back; LAST counts from 1 to every packet."""
    p = SMALL.replace(last_percent=last_percent)
    rng = np.random.default_rng(last_percent)
    ops = [
        make_op(p, rng, gather=False, world=2, rank=1, op_len=256),
        make_op(p, rng, gather=True, world=3, rank=0, op_len=256),
        make_op(p, rng, gather=False, world=3, rank=2, op_len=200),
        make_op(p, rng, gather=True, world=2, rank=1, op_len=256),
    ]
    res = simulate(Packetizer(p), ops, idle=0.2, bp=0.2, bp_own=0.5, seed=last_percent)
    check(res, ops)
    # the flags the test rests on are really there: more than one when the percentage says so
    # (8 packets to rank 0 in the first op: ceil(8 * last_percent / 100) of them flagged)
    flagged = [f[ubt.L2_L4_LEN + 2] & ubt.FLAG_LAST for _, f in res.frames[:8]]
    assert flagged == sorted(flagged)
    assert sum(flagged) == {1: 1, 30: 3, 50: 4, 100: 8}[last_percent]


@pytest.mark.parametrize("lanes", [2, 4, 16])
def test_lanes(lanes):
    """Other beat widths: the header/payload seam moves (16 lanes: one beat per packet)."""
    p = SMALL.replace(lanes=lanes, last_percent=25)
    rng = np.random.default_rng(lanes)
    ops = [
        make_op(p, rng, gather=False, world=3, rank=1, op_len=130),
        make_op(p, rng, gather=True, world=3, rank=2, op_len=256),
        make_op(p, rng, gather=False, world=8, rank=0, op_len=1, kind="min"),
    ]
    res = simulate(Packetizer(p), ops, idle=0.3, bp=0.3, bp_own=0.3, seed=lanes)
    check(res, ops)


@pytest.mark.parametrize(("world", "rank", "mixed"), [(8, 3, False), (3, 0, False), (5, 4, True),
                                                   (2, 1, True)])  # fmt: skip
def test_two_sources_share_one_output_side(world, rank, mixed):
    """A packetizer of two sources (the core's: scatter on 0, gather on 1; or both kinds
    on each): each source's frames and own packets are its model's, in order, tagged with
    its `src`; and the other source's frames come between the N - 1 frames of a gather
    slot (its replay keeps its place while they go out)."""
    rng = np.random.default_rng(world * 13 + rank)
    p = SMALL

    def ops(gather: bool) -> list[Op]:
        kinds = [gather, not gather, gather] if mixed else [gather] * 3
        return [make_op(p, rng, gather=g, world=world, rank=rank,
                        op_len=int(rng.integers(1, p.c + 1))) for g in kinds]  # fmt: skip

    by_source = [ops(False), ops(True)]
    dut = Packetizer(p, sources=2)
    res = simulate(dut, [], idle=0.3, bp=0.3, bp_own=0.3, seed=world + 2 * rank,
                   by_source=by_source)  # fmt: skip
    for j, src_ops in enumerate(by_source):
        mine = [f for f, s in zip(res.frames, res.srcs, strict=True) if s == j]
        check(Result(frames=mine, own=res.own_by_source[j]), src_ops)
    payload = ubt.L2_L4_LEN + ubt.HEADER_LEN
    between, last = 0, {}  # the other source's frames inside one slot's replay
    for k, ((_, f), j) in enumerate(zip(res.frames, res.srcs, strict=True)):
        if k and res.srcs[k - 1] != j and j in last:
            between += res.frames[last[j]][1][payload:] == f[payload:]  # the same slot
        last[j] = k
    assert between > 0 or world == 2  # at N = 2 a slot goes out once


def test_other_addressing():
    """MAC and IP bases whose low bytes carry when a rank is added (checksum shortcut)."""
    ad = ubt.Addressing(mac_base=0x02_00_00_FF_FF_FE, ip_base=(10 << 24) | 0xFFFF - 2)
    p = SMALL.replace(udp_port=4791, job_id=0xBEEF)
    rng = np.random.default_rng(5)
    ops = [
        make_op(p, rng, gather=False, world=8, rank=5, op_len=256, addressing=ad),
        make_op(p, rng, gather=True, world=8, rank=1, op_len=256, addressing=ad),
    ]
    res = simulate(Packetizer(p, ad), ops, idle=0.1, bp=0.1, seed=9)
    check(res, ops)


def test_rate_and_latency():
    """No backpressure: input at one beat per cycle, frames without bubbles, LATENCY exact."""
    p = NicParams(p=64, b=256, c=1024, n_max=8)  # frame (74 + 256 B) < packet (64 cycles)
    rng = np.random.default_rng(1)
    op = make_op(p, rng, gather=False, world=4, rank=0, op_len=1024)
    dut = Packetizer(p)
    payloads = [{"data": [int(v)], "first": 0, "last": 0} for v in op.values.reshape(-1)]

    async def setup(ctx):
        for name, v in op.ports().items():
            ctx.set(getattr(dut, name), v)
        ctx.set(dut.own.ready, 1)

    n_frames = len(op.frames())
    run = run_stream(dut, payloads, n_frames * dut.frame_beats, setup=setup,
                     read=lambda pl: pl)  # fmt: skip
    # one idle cycle at the op's start (context latch), then a beat every cycle
    assert run.in_cycles == list(range(run.in_cycles[0], run.in_cycles[0] + len(payloads)))
    # rank 0 owns packet 0; the first frame is packet 1 (to rank 1)
    assert run.out_cycles[0] - run.in_cycles[dut.beats] == dut.LATENCY
    nb = dut.frame_beats
    for f in range(n_frames):
        cyc = run.out_cycles[f * nb : (f + 1) * nb]
        assert cyc == list(range(cyc[0], cyc[0] + nb)), "bubble inside a frame"


def test_cocotb_verilator():
    p = SMALL.replace(lanes=2, last_percent=20)
    run_bench(AxisWrapper(PlainStreams(Packetizer(p), own="fields")), "packetizer_top",
              f"{__package__}.benches.tb_packetizer",
              {"p": p.p, "b": p.b, "c": p.c, "n_max": p.n_max, "lanes": p.lanes,
               "last_percent": p.last_percent})  # fmt: skip
