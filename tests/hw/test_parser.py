"""Parser (hw/parser.py) against optireduce/frame_checks.py: classify, frame by frame."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from optireduce import ubt
from optireduce.frame_checks import ADMISSION_REASONS, classify, default_peers
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.parser import PARSER_CODES, PARSER_REASONS, Parser
from optireduce.hw.ubt_layout import HEADER_LAYOUT, header_to_wire, header_value, wire_to_header
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import run_stream
from tests.test_nic_rules import bad_frames

SMALL = NicParams(p=16, b=64, c=256, n_max=8)  # 4 packets a block, 16 packets an op at most
I32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Cfg:
    rank: int = 0
    world: int = 3
    base: int = 0
    addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING
    peers: tuple[tuple[int, int], ...] | None = None  # the admission table (None: off)


@dataclass
class Expect:
    verdicts: list[int] = field(default_factory=list)  # -1 accept, else DROP_CODE
    packets: list[tuple[ubt.UbtHeader, np.ndarray]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def expect(frames: list[bytes], p: NicParams, cfg: Cfg) -> Expect:
    e = Expect()
    for f in frames:
        peers = None if cfg.peers is None else list(cfg.peers[: cfg.world])
        r = classify(f, p, cfg.rank, cfg.world, cfg.base, cfg.addressing, peers)
        if isinstance(r, str):
            e.verdicts.append(PARSER_CODES[r])
            e.counts[r] += 1
        else:
            e.verdicts.append(-1)
            e.packets.append((r.header, ubt.payload_values(r.payload)))
    return e


def frame_beats(frame: bytes, nbytes: int, rng: random.Random) -> list[dict]:
    """Beats of one frame; lanes past the end hold junk the parser must ignore."""
    out = []
    for off in range(0, max(1, len(frame)), nbytes):
        chunk = list(frame[off : off + nbytes])
        out.append(
            {
                "data": chunk + [rng.randrange(256) for _ in range(nbytes - len(chunk))],
                "keep": (1 << len(chunk)) - 1,
                "last": int(off + nbytes >= len(frame)),
            }
        )
    return out


@dataclass
class Run:
    verdicts: list[int]
    packets: list[tuple[list[ubt.UbtHeader], list[int], list[int], list[int]]]
    counters: list[int]
    in_cycles: list[int]
    out_cycles: list[int]
    latency_const: int = 0
    notes: list[tuple[int, int, int]] = field(default_factory=list)  # (op_id, sender, word)


def simulate(
    p: NicParams,
    frames: list[bytes],
    cfg: Cfg,
    n_out_beats: int,
    *,
    idle: float = 0.0,
    backpressure: float = 0.0,
    seed: int = 0,
) -> Run:
    """Feed frames back to back; collect verdict strobes, output beats and the counters."""
    dut = Parser(p)
    rng = random.Random(seed)
    beats = [b for f in frames for b in frame_beats(f, dut.nbytes, rng)]
    run = Run([], [], [], [], [], dut.LATENCY)
    cur: list = []

    async def bench(ctx):
        ctx.set(dut.rank, cfg.rank)
        ctx.set(dut.world, cfg.world)
        ctx.set(dut.base, cfg.base)
        ctx.set(dut.mac, int.from_bytes(cfg.addressing.mac(cfg.rank), "big"))
        ctx.set(dut.ip, int.from_bytes(cfg.addressing.ip(cfg.rank), "big"))
        table = cfg.peers or ()
        ctx.set(dut.admit, cfg.peers is not None)
        ctx.set(dut.peer_ip, sum(ip << (32 * r) for r, (ip, _) in enumerate(table)))
        ctx.set(dut.peer_port, sum(pt << (16 * r) for r, (_, pt) in enumerate(table)))
        k, tail = 0, 0
        limit = 40 * (len(beats) + n_out_beats) + 1000
        for cycle in range(limit):
            offer = k < len(beats) and not (idle and rng.random() < idle)
            ctx.set(dut.i.valid, offer)
            if offer:
                ctx.set(dut.i.payload, beats[k])
            ready = not (backpressure and rng.random() < backpressure)
            ctx.set(dut.o.ready, ready)
            if offer and ctx.get(dut.i.ready):
                run.in_cycles.append(cycle)
                k += 1
            if ready and ctx.get(dut.o.valid):
                pl = ctx.get(dut.o.payload)
                cur.append(
                    (header_value(ctx.get(dut.header)), [int(v) for v in pl.data],
                     int(pl.first), int(pl.last))
                )  # fmt: skip
                run.out_cycles.append(cycle)
                if pl.last:
                    hdrs, vals, firsts, lasts = zip(*cur, strict=True)
                    run.packets.append(
                        (list(hdrs), [v for vs in vals for v in vs], list(firsts), list(lasts))
                    )
                    cur.clear()
            assert not (ctx.get(dut.accept) and ctx.get(dut.drop))
            if ctx.get(dut.accept):
                run.verdicts.append(-1)
            if ctx.get(dut.drop):
                run.verdicts.append(ctx.get(dut.reason))
            if ctx.get(dut.note):
                run.notes.append(
                    (ctx.get(dut.note_op), ctx.get(dut.note_sender), ctx.get(dut.note_word))
                )
            finished = k == len(beats) and len(run.verdicts) >= len(frames)
            if finished and len(run.out_cycles) >= n_out_beats:
                tail += 1
                if tail > 3 * dut.n_words + 20:  # long enough to see any extra beat
                    break
            await ctx.tick()
        else:
            raise TimeoutError(f"{k}/{len(beats)} beats in, {len(run.verdicts)} verdicts")
        counters = ctx.get(dut.drop_count)
        run.counters[:] = [int(getattr(counters, r)) for r in PARSER_REASONS]

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return run


def check(p: NicParams, frames: list[bytes], cfg: Cfg, **kw) -> tuple[Expect, Run]:
    e = expect(frames, p, cfg)
    run = simulate(p, frames, cfg, len(e.packets) * (p.p // p.lanes), **kw)
    assert run.verdicts == e.verdicts
    assert len(run.packets) == len(e.packets)
    n_words = p.p // p.lanes
    for (hdrs, vals, firsts, lasts), (h, v) in zip(run.packets, e.packets, strict=True):
        assert hdrs == [h] * n_words  # stable from the first to the last beat
        np.testing.assert_equal(np.array(vals, dtype=np.int64), v)
        assert firsts == [1] + [0] * (n_words - 1)
        assert lasts == [0] * (n_words - 1) + [1]
    np.testing.assert_equal(run.counters, [e.counts[r] for r in PARSER_REASONS])
    return e, run


# --- frames ---------------------------------------------------------------------------------


def payload(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.integers(I32[0], I32[1] + 1, n, dtype=np.int64)
    edges = np.array([I32[0], I32[1], 0, -1, 1], dtype=np.int64)
    v[: min(n, 5)] = edges[: min(n, 5)]
    rng.shuffle(v)
    return v


def good_frame(
    p: NicParams, cfg: Cfg, rng: np.random.Generator, *, values: np.ndarray | None = None,
    **fields: int,
) -> bytes:  # fmt: skip
    """A frame classify accepts (unless a field given breaks it): scatter to us by default."""
    world = cfg.world
    sender = fields.pop("sender", (cfg.rank + 1) % world)
    msg = fields.pop("msg_type", ubt.MSG_SCATTER)
    op_len = fields.pop("op_len", p.c)
    owner = cfg.rank if msg == ubt.MSG_SCATTER else sender
    n_pk = p.packets_for(op_len)
    owned = [i for i in range(n_pk) if i % world == owner] or [0]
    h = ubt.UbtHeader(
        version=ubt.VERSION, msg_type=msg, flags=int(rng.integers(0, 2)),
        exponent=int(rng.integers(-128, 128)), job_id=p.job_id, sender=sender,
        op_id=min(cfg.base + int(rng.integers(0, p.rx_window)), 2**32 - 1),
        pkt_index=int(rng.choice(owned)), count=p.p,
        contributors=0 if msg == ubt.MSG_SCATTER else int(rng.integers(1, world + 1)),
        t_c_us=int(rng.integers(0, 2**32)), op_len=op_len, world=world, reserved=0,
    )._replace(**fields)  # fmt: skip
    v = payload(rng, h.count) if values is None else values
    return ubt.build_frame(
        h, ubt.payload_bytes(v), src=sender % 65536, dst=cfg.rank, port=p.udp_port,
        addressing=cfg.addressing,
    )  # fmt: skip


patch = ubt.patch_frame  # a field changed, the IP checksum fixed or not


def with_header(frame: bytes, cfg: Cfg, p: NicParams, **fields: int) -> bytes:
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(**fields)
    src = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN).sender
    return ubt.build_frame(
        h, frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :], src=src, dst=cfg.rank, port=p.udp_port,
        addressing=cfg.addressing,
    )  # fmt: skip


def l2_l4_cases(good: bytes, cfg: Cfg, p: NicParams) -> list[bytes]:
    """tests/test_protocol.py L2_L4_CASES on this frame, plus the boundaries around them."""
    n = len(good)
    ip_len = n - ubt.ETH_LEN
    return [
        good[:41], b"", good[:-1],
        patch(good, 16, "H", 27), patch(good, 16, "H", 28), patch(good, 16, "H", ip_len + 1),
        patch(good, 12, "H", 0x86DD), patch(good, 12, "H", 0x0806), patch(good, 13, "B", 1),
        patch(good, 14, "B", 0x46), patch(good, 14, "B", 0x65), patch(good, 14, "B", 0x44),
        patch(good, 24, "H", 0x1234, fix_ip=False), patch(good, 22, "B", 63, fix_ip=False),
        patch(good, 20, "H", 0x6000), patch(good, 20, "H", 0x0001), patch(good, 20, "H", 0x2000),
        patch(good, 20, "H", 0x8000), patch(good, 20, "H", 0x1FFF),
        patch(good, 23, "B", 6),
        patch(good, 0, "6s", int.to_bytes(1, 6, "big")), patch(good, 5, "B", good[5] ^ 1),
        patch(good, 30, "4s", cfg.addressing.ip(cfg.rank + 1)),
        patch(good, 33, "B", good[33] ^ 0x80),
        patch(good, 36, "H", p.udp_port + 1), patch(good, 34, "H", 40000),
        patch(good, 38, "H", n - 34 - 4), patch(good, 38, "H", n - 34 + 4),
        patch(good, 16, "H", 59) , patch(good, 16, "H", 60),
    ] + [  # IP and UDP lengths that agree, around the UBT header's end and the payload's
        patch(patch(good, 38, "H", ln - 20), 16, "H", ln)
        for ln in (28, 29, 59, 60, 61, ip_len - 4, ip_len - 1, ip_len + 1)
    ]  # fmt: skip


def ubt_cases(good: bytes, cfg: Cfg, p: NicParams) -> list[bytes]:
    """tests/test_protocol.py UBT_CASES and the op checks, each at and past its boundary."""
    w, c = cfg.world, p.c
    g = ubt.MSG_GATHER
    hw = (cfg.rank + 1) % w  # a gather sender whose packet 'hw' it owns
    cases = [
        dict(version=0), dict(version=2), dict(msg_type=0), dict(msg_type=3), dict(msg_type=7),
        dict(flags=0x02), dict(flags=0xFF), dict(flags=ubt.FLAG_LAST, exponent=-128),
        dict(reserved=1), dict(reserved=0x8000), dict(contributors=1),
        dict(msg_type=g, contributors=0, sender=hw, pkt_index=hw),
        dict(msg_type=g, contributors=w + 1, sender=hw, pkt_index=hw),
        dict(msg_type=g, contributors=w, sender=hw, pkt_index=hw),
        dict(msg_type=g, contributors=1, sender=hw, pkt_index=hw + w),
        dict(msg_type=g, contributors=1, sender=hw, pkt_index=hw + 1),
        dict(count=p.p - 1), dict(count=p.p + 1), dict(count=0),
        dict(job_id=p.job_id + 1), dict(job_id=0xFFFF),
        dict(sender=w), dict(sender=w - 1 if w - 1 != cfg.rank else 0), dict(sender=0xFFFF),
        dict(sender=cfg.rank), dict(world=w + 1), dict(world=w - 1),
        dict(op_len=c), dict(op_len=c + 1), dict(op_len=0), dict(op_len=1), dict(op_len=2**32 - 1),
        dict(op_id=(cfg.base - 1) % 2**32), dict(op_id=cfg.base),
        dict(op_id=cfg.base + p.rx_window - 1), dict(op_id=cfg.base + p.rx_window),
        dict(op_id=2**32 - 1), dict(op_id=0),
        dict(pkt_index=cfg.rank), dict(pkt_index=cfg.rank + w), dict(pkt_index=cfg.rank + 1),
        dict(pkt_index=2**32 - 1), dict(pkt_index=p.packets_for(c) - 1),
        dict(pkt_index=p.packets_for(c)), dict(pkt_index=cfg.rank + 2**20 * w),
        dict(op_len=1, pkt_index=p.packets_per_block - 1),
        dict(op_len=1, pkt_index=p.packets_per_block),
        dict(op_len=p.b + 1, pkt_index=2 * p.packets_per_block - 1),
        dict(version=9, msg_type=7, reserved=1), dict(msg_type=7, flags=2),
        dict(t_c_us=0), dict(t_c_us=1), dict(t_c_us=0, count=0),
    ]  # fmt: skip
    out = []
    for f in cases:
        f = {k: v % 2**32 if k in ("op_id",) else v for k, v in f.items()}
        if f.get("op_id", 0) >= 2**32:
            continue
        out.append(with_header(good, cfg, p, **f))
    return out


def cuts(good: bytes, p: NicParams) -> list[bytes]:
    """Truncations at every header boundary (and a byte either side), and trailing bytes."""
    at = {0, 1, 6, 12, 14, 24, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 58, 62, 66, 70, 74}
    at |= {len(good) - 4, len(good) - 1, 75, 78}
    lens = sorted({n + d for n in at for d in (-1, 0, 1) if 0 <= n + d < len(good)})
    return [good[:n] for n in lens] + [good + b"\0" * 4, good + bytes(range(64)), good + b"\xff"]


# --- tests ----------------------------------------------------------------------------------


def test_header_layout_built_from_fields():
    assert [n for n, _ in HEADER_LAYOUT] == [f.name for f in ubt.FIELDS]
    for name, fld in HEADER_LAYOUT:
        f = next(f for f in ubt.FIELDS if f.name == name)
        assert fld.shape.width == ubt.field_bits(f) and fld.shape.signed == ubt.field_signed(f)
    assert HEADER_LAYOUT.size == 8 * ubt.HEADER_LEN

    # wire bytes -> layout -> wire bytes, in the simulator, against the struct unpacker
    wire = [Signal(8, name=f"b{j}") for j in range(ubt.HEADER_LEN)]
    view = Signal(HEADER_LAYOUT)
    back = [Signal(8, name=f"o{j}") for j in range(ubt.HEADER_LEN)]
    m = Module()
    m.d.comb += view.eq(wire_to_header(wire))
    m.d.comb += [o.eq(v) for o, v in zip(back, header_to_wire(view), strict=True)]
    rng = np.random.default_rng(5)
    raw = [bytes(32), b"\xff" * 32, bytes(range(32))]
    raw += [rng.integers(0, 256, 32, dtype=np.uint8).tobytes() for _ in range(20)]

    async def bench(ctx):
        for r in raw:
            for s, b in zip(wire, r, strict=True):
                ctx.set(s, b)
            assert header_value(ctx.get(view)) == ubt.UbtHeader.unpack(r)
            assert bytes(ctx.get(o) for o in back) == r

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("base", [0, 2])
def test_every_malformed_class_and_valid_frames(base):
    """bad_frames of tests/test_nic_rules.py (world 3, rank 0), the test_protocol cases,
    every op-check boundary and truncation, between valid scatter and gather frames."""
    p, cfg = SMALL, Cfg(rank=0, world=3, base=base)
    rng = np.random.default_rng(1 + base)
    good = good_frame(p, cfg, rng, sender=1, op_id=base, op_len=192, pkt_index=3, flags=0)
    bad = list(bad_frames(good).values())
    frames = []
    for f in (
        bad + l2_l4_cases(good, cfg, p) + ubt_cases(good, cfg, p) + cuts(good, p)
    ):  # fmt: skip
        frames.append(f)
        if rng.random() < 0.3:
            msg = int(rng.choice([ubt.MSG_SCATTER, ubt.MSG_GATHER]))
            frames.append(good_frame(p, cfg, rng, msg_type=msg, sender=int(rng.integers(1, 3))))
    frames.append(good_frame(p, cfg, rng, values=np.full(p.p, I32[0])))
    frames.append(good_frame(p, cfg, rng, values=np.full(p.p, I32[1])))
    frames.append(good_frame(p, cfg, rng, values=np.zeros(p.p, np.int64)))
    e, _ = check(p, frames, cfg, idle=0.3, backpressure=0.3, seed=2 + base)
    # the vectors reach every reason the parser owns (none is stale below base 0)
    off = set(ADMISSION_REASONS) | ({"stale_op"} if base == 0 else set())  # admission off
    assert set(e.counts) == set(PARSER_REASONS) - off
    assert len(e.packets) >= 20


def test_random_bytes_mutations_and_window_edge():
    """Random junk, randomly edited and cut frames; a window at the top of op_id's range,
    the largest world, the last rank, a non-default addressing."""
    p = SMALL
    cfg = Cfg(
        rank=7, world=8, base=2**32 - 3, addressing=ubt.Addressing(0x0A_0B_0C_0D_0E_00, 0x0A000000)
    )
    rng = np.random.default_rng(7)
    frames = []
    for n in [*range(36, 46), *rng.integers(0, 140, 30)]:  # around the 42-byte minimum too
        frames.append(rng.integers(0, 256, int(n), dtype=np.uint8).tobytes())
    for _ in range(100):
        msg = int(rng.choice([ubt.MSG_SCATTER, ubt.MSG_GATHER]))
        g = bytearray(good_frame(p, cfg, rng, msg_type=msg, sender=int(rng.integers(0, 7))))
        kind = rng.random()
        if kind < 0.4:
            for _ in range(int(rng.integers(1, 4))):
                g[int(rng.integers(0, len(g)))] = int(rng.integers(0, 256))
            if rng.random() < 0.5:
                g = bytearray(patch(bytes(g), 24, "H", 0))
        elif kind < 0.55:
            g = g[: int(rng.integers(0, len(g)))]
        frames.append(bytes(g))
    frames += [good_frame(p, cfg, rng, op_id=2**32 - 1), good_frame(p, cfg, rng, op_id=0)]
    e, _ = check(p, frames, cfg, idle=0.5, backpressure=0.2, seed=3)
    assert len(e.packets) >= 30 and len(set(e.counts)) >= 8


def test_inband_proposal_words_and_notes():
    """With NicParams.exp_inband: a well-formed proposal word passes, any other non-zero
    `reserved` is malformed_header; the proposal of every accepted frame and of every
    stale_op frame is noted (op_id, sender, word), as NicModel._accept notes it, and no
    other frame's (future_op, wrong_owner, index out of range, bad words)."""
    p = SMALL.replace(exp_inband=True)
    cfg = Cfg(rank=1, world=4, base=6)
    rng = np.random.default_rng(11)
    frames = []
    for _ in range(90):
        prop = rng.choice([None, -128, 127, int(rng.integers(-128, 128))])
        word = ubt.proposal_word(None if prop is None else int(prop))
        if rng.random() < 0.15:  # malformed words: bits 7..1 set, or no present bit
            word = int(rng.choice([0x0003, 0x8000, 0x0180, 0xFF02, 0x00FF]))
        msg = int(rng.choice([ubt.MSG_SCATTER, ubt.MSG_GATHER]))
        sender = int(rng.choice([0, 2, 3]))
        fields = {"reserved": word, "msg_type": msg, "sender": sender}
        r = rng.random()
        if r < 0.2:
            fields["op_id"] = int(rng.integers(0, cfg.base))  # stale
        elif r < 0.3:
            fields["op_id"] = cfg.base + p.rx_window + int(rng.integers(0, 3))  # future
        elif r < 0.4:
            fields["pkt_index"] = 2 if msg == ubt.MSG_SCATTER else 3  # not the owner's
        frames.append(good_frame(p, cfg, rng, **fields))
    e, run = check(p, frames, cfg, idle=0.3, backpressure=0.3, seed=11)
    want = []
    for f in frames:
        r = classify(f, p, cfg.rank, cfg.world, cfg.base, cfg.addressing)
        if not isinstance(r, str) or r == "stale_op":
            h = ubt.UbtHeader.unpack(f, ubt.L2_L4_LEN)
            want.append((h.op_id, h.sender, h.reserved))
    assert run.notes == want
    assert e.counts["stale_op"] >= 10 and e.counts["malformed_header"] >= 8
    assert e.counts["future_op"] >= 5 and e.counts["wrong_owner"] >= 5
    assert len(e.packets) >= 30 and {w for _, _, w in want} >= {0, 0x8001, 0x7F01}
    # off: the same frames, but a proposal word is malformed and nothing is noted
    e_off, run_off = check(SMALL, frames, cfg)
    assert run_off.notes == [] and e_off.counts["malformed_header"] > e.counts["malformed_header"]


def test_admission_by_the_peer_table():
    """With the peer table on (frame_checks.admit): a source that is no peer of the world
    (address, port, or a table entry past the world) is not_member, a peer naming another
    sender wrong_sender, both after the L2-L4 checks and before the UBT header's; with two
    entries at one address either rank may send from it; a datagram too short to name a
    sender is only checked for membership."""
    p = SMALL
    world, rank = 4, 1
    table = default_peers(p, 8)
    table[2] = (0x0A000009, 5000)  # rank 2 elsewhere
    table[3] = table[0]  # two entries with one address: ranks 0 and 3 may both send
    table[6] = (0x0A000006, p.udp_port)  # past the world: no member
    cfg = Cfg(rank=rank, world=world, peers=tuple(table))
    rng = np.random.default_rng(21)

    def from_addr(f: bytes, ip: int, port: int) -> bytes:
        return patch(patch(f, 26, "I", ip), 34, "H", port, fix_ip=False)

    frames = []
    for _ in range(60):
        sender = int(rng.choice([0, 2, 3]))
        f = good_frame(p, cfg, rng, sender=sender, msg_type=ubt.MSG_SCATTER)
        src = int(rng.choice([0, 2, 3, 6, 7]))  # 7: an outsider
        ip, port = table[src] if src != 7 else (0x0B000001, p.udp_port)
        if rng.random() < 0.15:
            port += 1  # a member's address, another port
        g = from_addr(f, ip, port)
        kind = rng.random()
        if kind < 0.1:
            g = patch(g, 24, "H", 0, fix_ip=False)  # bad IP checksum: counted before admission
        elif kind < 0.2:  # a datagram of 4 (no sender field) or 8 bytes
            cut = ubt.L2_L4_LEN + int(rng.choice([4, 8]))
            g = patch(g[:cut], 16, "H", cut - ubt.ETH_LEN)
            g = patch(g, 38, "H", cut - ubt.ETH_LEN - ubt.IP_LEN, fix_ip=False)
        frames.append(g)
    e, _ = check(p, frames, cfg, idle=0.2, backpressure=0.3, seed=21)
    assert e.counts["not_member"] >= 15 and e.counts["wrong_sender"] >= 8
    assert e.counts["bad_ip_checksum"] >= 3 and e.counts["truncated"] >= 1
    assert len(e.packets) >= 8
    # off: the same frames are judged by the protocol's checks alone
    e_off, _ = check(p, frames, Cfg(rank=rank, world=world))
    assert e_off.counts["not_member"] == e_off.counts["wrong_sender"] == 0


@pytest.mark.parametrize("lanes", [4, 16])
def test_wide_datapath(lanes):
    """Other beat widths move the payload's alignment (16 lanes: one output beat a packet)."""
    p = SMALL.replace(lanes=lanes)
    cfg = Cfg(rank=1, world=2, base=5)
    rng = np.random.default_rng(lanes)
    good = good_frame(p, cfg, rng)
    frames = cuts(good, p)[::2] + l2_l4_cases(good, cfg, p)[:12]
    frames += [good_frame(p, cfg, rng, msg_type=ubt.MSG_GATHER, sender=0) for _ in range(8)]
    frames += [good_frame(p, cfg, rng) for _ in range(8)]
    rng.shuffle(frames)
    check(p, frames, cfg, idle=0.3, backpressure=0.5, seed=lanes)


def test_world_larger_than_packet_count():
    """world > c/p: pkt_index mod world is pkt_index itself; gathers from high ranks can't fit."""
    p, cfg = SMALL, Cfg(rank=5, world=40, base=100)
    rng = np.random.default_rng(8)
    frames = []
    for _ in range(30):
        msg = int(rng.choice([ubt.MSG_SCATTER, ubt.MSG_GATHER]))
        frames.append(good_frame(p, cfg, rng, msg_type=msg, sender=int(rng.integers(0, 40))))
    frames.append(good_frame(p, cfg, rng, pkt_index=5 + 40))
    e, _ = check(p, frames, cfg, idle=0.2, backpressure=0.2, seed=8)
    assert len(e.packets) >= 8 and e.counts["wrong_owner"] >= 5


def test_back_to_back_full_rate_small():
    """No idle, no backpressure: bad and good frames back to back never stall the input."""
    p, cfg = SMALL, Cfg()
    rng = np.random.default_rng(3)
    good = good_frame(p, cfg, rng)
    frames = []
    for j in range(12):
        frames.append(good_frame(p, cfg, rng))
        frames.append(good[: 1 + 7 * j])  # short: truncated
        frames.append(patch(good, 23, "B", 6))  # full length, dropped
    _, run = check(p, frames, cfg)
    assert run.in_cycles == list(range(run.in_cycles[0], run.in_cycles[0] + len(run.in_cycles)))


def test_full_rate_and_latency_default_params():
    """Default NicParams: 1 KiB payloads back to back leave with no bubble; LATENCY holds."""
    p, cfg = NicParams(), Cfg(rank=2, world=4)
    rng = np.random.default_rng(4)
    frames = [good_frame(p, cfg, rng) for _ in range(3)]
    _, run = check(p, frames, cfg)
    n = len(run.out_cycles)
    assert n == 3 * p.p and run.out_cycles[-1] - run.out_cycles[0] == n - 1
    assert run.out_cycles[0] - run.in_cycles[0] == run.latency_const


def test_run_stream_latency_matches_constant():
    p, cfg = SMALL, Cfg()
    dut = Parser(p)
    rng = random.Random(0)
    f = good_frame(p, cfg, np.random.default_rng(0))
    want = classify(f, p, cfg.rank, cfg.world, cfg.base)
    assert not isinstance(want, str)

    async def setup(ctx):
        for port, v in ((dut.rank, 0), (dut.world, 3), (dut.base, 0)):
            ctx.set(port, v)
        ctx.set(dut.mac, int.from_bytes(cfg.addressing.mac(0), "big"))
        ctx.set(dut.ip, int.from_bytes(cfg.addressing.ip(0), "big"))

    run = run_stream(dut, frame_beats(f, dut.nbytes, rng), p.p, setup=setup)
    np.testing.assert_equal(
        np.array([v for d, _, _ in run.outputs for v in d]), ubt.payload_values(want.payload)
    )
    assert run.latency == dut.LATENCY and run.cycles_per_beat() == 1.0


def test_cocotb_verilator_random_mix():
    """AXI-Stream shell under Verilator: good and bad frames, idle and backpressure."""
    run_bench(AxisWrapper(Parser(SMALL)), "parser_top", f"{__package__}.benches.tb_parser",
              {"p": SMALL.p, "b": SMALL.b, "c": SMALL.c, "n_max": SMALL.n_max})  # fmt: skip
