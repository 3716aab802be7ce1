"""HostAdapter against optireduce/host_port.py, bit for bit (amaranth.sim).

Frames in are built with host_port.build; what reaches the core must equal what
host_port.ChunkAssembler makes of the good frames. Frames out must equal
host_port.build(RESULT fragments) and host_port.stats_frame(stats_words(...)).
Every side runs with random idle and backpressure. The frame plumbing that feeds the
adapter on a board (hw/board_frames.py) is checked byte for byte at the end.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce import host_port
from optireduce.host_port import DATA, START, HostFrame, reg_reply, reg_request
from optireduce.hw.csr import register_map
from optireduce.hw.host_adapter import COUNTERS, HostAdapter
from optireduce.op_stats import OpStats
from optireduce.params import NicParams
from optireduce.sim.stream_sim import send_bytes

P = NicParams(p=16, b=64, c=1024, n_max=8)
FRAG = 96  # words per frame in and out (small, so ops span several frames)
MAX_CYCLES = 400_000


def _frame(kind: int, op: int, off: int, n: int, e: int, words: np.ndarray) -> bytes:
    payload = np.asarray(words, ">f4").tobytes()
    return host_port.build(HostFrame(kind, op, off, n, e, payload), to_nic=True)


def _chunk(op: int, data: np.ndarray, e: int, frag: int = FRAG) -> list[bytes]:
    return [
        _frame(START if off == 0 else DATA, op, off, len(data), e, data[off : off + frag])
        for off in range(0, len(data), frag)
    ]


def _message(results: list[int], rec: list[int]) -> tuple[list[int], list[int]]:
    """A core's message: its head (the record's first words), the results, the record."""
    return rec[: len(host_port.HEAD_FIELDS)], results + rec


def _result_frames(op: int, n: int, e: int, res: np.ndarray) -> list[bytes]:
    """The model's RESULT frames of an op's results."""
    return [
        host_port.build(HostFrame(host_port.RESULT, op, off, n, e,
                                  res[off : off + FRAG].astype(">f4").tobytes()), to_nic=False)
        for off in range(0, len(res), FRAG)
    ]  # fmt: skip


def _stats(op: int, n: int, e: int, world: int, rng: random.Random) -> list[int]:
    st = OpStats(
        op_id=op, rank=0, world=world, n=n, exponent=e, start_us=rng.randrange(1 << 40),
        end_us=rng.randrange(1 << 40), phase1_reason="early", phase2_reason="deadline",
        phase1_timeout_us=400, phase2_timeout_us=390, phase1_end_us=77, p1_expected=8,
        p1_received=7, p2_expected=10, p2_received=9,
        contributor_hist=[rng.randrange(100) for _ in range(world + 1)], sat_quantize=2,
        sat_transform=3, sat_output=4, nonfinite=5, t_c_us=(61, 62),
    )  # fmt: skip
    return host_port.stats_words(st)


def _run(
    dut: HostAdapter,
    frames_in,
    messages,
    regs=None,
    seed=0,
    max_cycles=MAX_CYCLES,
    messages_after: int | None = None,
):
    """Drive frames into `i` and messages into `host_o` (`messages_after` cycles after the
    last frame went in, if given); collect everything out. A message is (head words,
    words): the head words flagged `head` (`_message` makes a core's)."""
    rng = random.Random(seed)
    regs = dict(regs or {})
    out = {"cmd": [], "inband": [], "words": [], "frames": [], "writes": [],
           "counters": dict.fromkeys(COUNTERS, 0)}  # fmt: skip
    done = {"in": False, "msg": False}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def drive_frames(ctx):
        for fr in frames_in:
            await send_bytes(ctx, dut.i, fr, rng, gap=0.2)
        done["in"] = True

    async def drive_host_o(ctx):
        if messages_after is not None:
            while not done["in"]:
                await ctx.tick()
            await ctx.tick().repeat(messages_after)
        for head, body in messages:
            words = [(w, 1) for w in head] + [(w, 0) for w in body]
            for k, (w, flag) in enumerate(words):
                while rng.random() < 0.2:
                    await ctx.tick()
                ctx.set(dut.host_o.valid, 1)
                ctx.set(dut.host_o.payload.data, w)
                ctx.set(dut.host_o.payload.head, flag)
                ctx.set(dut.host_o.payload.last, k == len(words) - 1)
                await ctx.tick().until(dut.host_o.ready)
                ctx.set(dut.host_o.valid, 0)
        done["msg"] = True

    async def sinks(ctx):
        frame = bytearray()
        idle = 0
        pending = []  # [cycles to go, data] per access in flight
        for _ in range(max_cycles):
            # backpressure on every output
            for port in (dut.o, dut.host_cmd, dut.host_i):
                ctx.set(port.ready, rng.random() < 0.7)
            # register bank across a clock crossing: each access comes back (csr_done,
            # a read's data) 1..6 cycles later, and the adapter must wait for it
            r_en, addr = ctx.get(dut.csr_r_en), ctx.get(dut.csr_addr)
            if ctx.get(dut.csr_w_en):
                out["writes"].append((addr, ctx.get(dut.csr_w_data)))
                regs[addr] = ctx.get(dut.csr_w_data)
                pending.append([rng.randint(1, 6), 0])
            if r_en:
                pending.append([rng.randint(1, 6), regs.get(addr, 0xDEAD0000 | addr)])
            busy = False
            strobes = ctx.get(dut.counts)  # the bank counts them: so does this bench
            for j, name in enumerate(COUNTERS):
                out["counters"][name] += (strobes >> j) & 1
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                frame.append(ctx.get(dut.o.payload.data[0]))
                if ctx.get(dut.o.payload.last):
                    out["frames"].append(bytes(frame))
                    frame = bytearray()
                busy = True
            if ctx.get(dut.host_cmd.valid) and ctx.get(dut.host_cmd.ready):
                c = ctx.get(dut.host_cmd.payload)
                out["cmd"].append((c.op_id, c.n, c.exponent))
                out["inband"].append((c.inband, c.proposal))
                busy = True
            if ctx.get(dut.host_i.valid) and ctx.get(dut.host_i.ready):
                pl = ctx.get(dut.host_i.payload)
                out["words"].append((pl.data[0], pl.first, pl.last))
                busy = True
            await ctx.tick()
            ctx.set(dut.csr_done, 0)
            if pending:
                pending[0][0] -= 1
                if pending[0][0] == 0:
                    ctx.set(dut.csr_done, 1)
                    ctx.set(dut.csr_r_data, pending.pop(0)[1])
            idle = 0 if busy or not (done["in"] and done["msg"]) else idle + 1
            if idle > 200:
                break
        else:
            raise AssertionError(f"the adapter did not go idle within {max_cycles} cycles")
        out["world"] = ctx.get(dut.world)

    sim.add_testbench(drive_frames, background=True)
    sim.add_testbench(drive_host_o, background=True)
    sim.add_testbench(sinks)
    sim.run()
    return out


def _counts(**nonzero) -> dict:
    return {name: nonzero.get(name, 0) for name in COUNTERS}


def test_chunks_reach_the_core_as_the_model_assembles_them():
    rng = np.random.default_rng(1)
    ops = [(0, rng.standard_normal(250).astype(np.float32), -7), (1, np.float32([1.5]), 3),
           (2, rng.standard_normal(1024).astype(np.float32), 120)]  # fmt: skip
    frames = [f for op, x, e in ops for f in _chunk(op, x, e)]
    # op 3 asks for the in-band exponent and carries a proposal word (docs/protocol.md)
    x3 = rng.standard_normal(90).astype(np.float32)  # one frame of at most FRAG words
    frames += host_port.chunk_frames(START, 3, x3, None, 0x8101)
    # the model: the assembler's chunks, and the commands in order
    asm = host_port.ChunkAssembler()
    done = [asm.add(host_port.parse(f)) for f in frames]
    chunks = [d for d in done if d is not None]
    assert [c[0] for c in chunks] == [0, 1, 2, 3]
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, frames, [])
    assert out["cmd"] == [(op, len(x), e) for op, x, e in ops] + [(3, 90, 0)]
    assert out["inband"] == [(int(c.exponent is None), c.proposal) for c in chunks]
    assert out["inband"][-1] == (1, 0x8101)
    ops.append((3, x3, None))
    want = np.concatenate([c[2] for c in chunks]).view(np.uint32).tolist()
    assert [w for w, _, _ in out["words"]] == want
    ends = np.cumsum([len(x) for _, x, _ in ops])
    firsts = {0, *ends[:-1].tolist()}
    assert [k for k, (_, f, _) in enumerate(out["words"]) if f] == sorted(firsts)
    assert [k for k, (_, _, last) in enumerate(out["words"]) if last] == (ends - 1).tolist()
    assert out["counters"] == _counts(rx_frames=len(frames))
    assert out["frames"] == []


def test_bad_frames_are_counted_drops_and_never_reach_the_core():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(200).astype(np.float32)
    good = _chunk(0, x, 5)  # START (96), DATA (96), DATA (8)
    start = bytearray(good[0])
    bad = {
        "drop_not_host": [bytes(start[:12]) + b"\x08\x00" + bytes(start[14:]), bytes(start[:30])],
        "drop_bad_header": [bytes(start[:14]) + b"\x02" + bytes(start[15:]),
                            bytes(start[:15]) + b"\x09" + bytes(start[16:])],
        "drop_bad_length": [bytes(start[:-1]), bytes(start) + b"\x00\x00\x00\x00"],
        "drop_too_long": [_frame(START, 0, 0, 200, 5, x[:FRAG + 1])],
        "drop_bad_op": [_frame(START, 0, 0, 0, 5, x[:0]), _frame(START, 0, 0, P.c + 1, 5, x[:4]),
                        _frame(START, 0, 8, 200, 5, x[:4]), _frame(START, 0, 0, 3, 5, x[:4])],
        "drop_sequence": [_frame(START, 1, 0, 200, 5, x[:4]),  # op 0 is next
                          _frame(DATA, 0, 0, 200, 5, x[:4])],  # no open op yet
        "drop_unsupported": [host_port.config_frame(P, 0, 2),
                             host_port.build(HostFrame(host_port.RESULT, 0, 0, 1, 0, b"\0" * 4),
                                             to_nic=True)],
    }  # fmt: skip
    after_start = {
        "drop_sequence": [_frame(DATA, 0, 0, 200, 5, x[:4]),  # offset 0 again
                          _frame(DATA, 7, FRAG, 200, 5, x[FRAG : FRAG + 4]),  # wrong op
                          # the next offset plus 2^11: the op's counts are 11 bits (C = 1024)
                          _frame(DATA, 0, FRAG + 2048, 200, 5, x[FRAG : FRAG + 4])],
    }  # fmt: skip
    past_end = _frame(DATA, 0, 2 * FRAG, 200, 5, np.zeros(200 - 2 * FRAG + 1, np.float32))
    frames = [f for fs in bad.values() for f in fs] + [good[0]]
    frames += [f for fs in after_start.values() for f in fs] + [good[1], past_end, good[2]]
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, frames, [], seed=3)
    assert out["cmd"] == [(0, 200, 5)]
    assert [w for w, _, _ in out["words"]] == x.view(np.uint32).tolist()
    n_bad = {k: len(v) for k, v in bad.items()}
    n_bad["drop_sequence"] += len(after_start["drop_sequence"]) + 1
    assert out["counters"] == _counts(rx_frames=len(good), **n_bad)


def test_an_op_of_c_words_is_taken_whole():
    """n = C, the most an op holds (the op's counts are as wide as C needs)."""
    x = np.random.default_rng(5).standard_normal(P.c).astype(np.float32)
    frames = _chunk(0, x, 2)
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, frames, [], seed=5)
    assert out["cmd"] == [(0, P.c, 2)]
    assert [w for w, _, _ in out["words"]] == x.view(np.uint32).tolist()
    assert [k for k, (_, _, last) in enumerate(out["words"]) if last] == [P.c - 1]
    assert out["counters"] == _counts(rx_frames=len(frames))


def test_a_start_before_the_last_words_pads_the_open_op_with_zeros():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(300).astype(np.float32)
    y = rng.standard_normal(20).astype(np.float32)
    frames = _chunk(0, x, 1)[:2] + _chunk(1, y, 2)  # op 0 loses its last fragment
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, frames, [], seed=4)
    assert out["cmd"] == [(0, 300, 1), (1, 20, 2)]
    padded = np.concatenate([x[: 2 * FRAG], np.zeros(300 - 2 * FRAG, np.float32), y])
    assert [w for w, _, _ in out["words"]] == padded.view(np.uint32).tolist()
    assert [k for k, (_, _, last) in enumerate(out["words"]) if last] == [299, 319]
    assert out["counters"] == _counts(rx_frames=3, truncated_ops=1)


@pytest.mark.parametrize("seed", [0, 1])
def test_results_and_stats_leave_as_the_model_frames_them(seed):
    """Good messages leave as the model frames them. A bad one is read to its end and
    counted, every RESULT frame its words filled goes out, no STATS follows, and the
    messages after it are whole: a record longer than world says, one that says another
    n, one that says another exponent, a head with n > C, no head, and two messages that
    end before their n results (one with no frame filled, one right after a whole
    frame's words)."""
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    world = register_map(P)[0]  # the record's world must be the CSR's (reset: 2)
    world = next(reg.reset for reg in world.regs if reg.name == "world")
    good = []
    for op, n, e in [(4, 200, -3), (3, 1, 7), (5, P.c, 0), (6, FRAG, -128), (7, 0, 1)]:
        res = rng.standard_normal(n).astype(np.float32)
        rec = _stats(op, n, e, world, r)
        good.append((_message(res.view(np.uint32).tolist(), rec),
                     [*_result_frames(op, n, e, res), host_port.stats_frame(rec)]))  # fmt: skip
    res0 = good[0][0][1][:200]
    bad_world = _message(res0, _stats(9, 200, 0, world + 1, r))  # longer than world says
    bad_n = ([9, 1, 0], res0[:1] + [0] * 3 + _stats(9, 1, 0, world, r))  # says n = 0
    too_long = ([9, P.c + 1, 0], [0] * (P.c + 1) + _stats(9, P.c + 1, 0, world, r))
    no_head = ([], res0[:5] + _stats(9, 5, 0, world, r))
    short = ([9, 50, 0], res0[:10])  # ends before its 50 results: no frame was due
    short_whole = ([9, 200, 0], res0[:FRAG])  # ends with a whole frame's words: it goes
    bad_e = ([9, 5, 3], res0[:5] + _stats(9, 5, 4, world, r))  # another exponent
    as_sent = {  # the bad messages' frames out: the RESULT frames their words filled
        "bad_world": _result_frames(9, 200, 0, np.uint32(res0).view(np.float32)),
        "bad_n": _result_frames(9, 1, 0, np.uint32(res0[:1]).view(np.float32)),
        "short_whole": _result_frames(9, 200, 0, np.uint32(res0[:FRAG]).view(np.float32)),
        "bad_e": _result_frames(9, 5, 3, np.uint32(res0[:5]).view(np.float32)),
    }
    msgs = [good[0][0], bad_world, good[1][0], bad_n, too_long, good[2][0], no_head,
            good[3][0], short, short_whole, bad_e, good[4][0]]  # fmt: skip
    want = [*good[0][1], *as_sent["bad_world"], *good[1][1], *as_sent["bad_n"], *good[2][1],
            *good[3][1], *as_sent["short_whole"], *as_sent["bad_e"], *good[4][1]]  # fmt: skip
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, [], msgs, seed=seed)
    assert len(out["frames"]) == len(want)
    for k, (got, ref) in enumerate(zip(out["frames"], want, strict=True)):
        assert got == ref, f"frame {k}"
    assert out["counters"] == _counts(tx_frames=len(want), bad_records=7)


def test_results_go_out_while_the_message_still_comes():
    """An op of C results through a ring of 2 fragments, which holds less than the op:
    its frames leave as its words come, the model's."""
    r = random.Random(3)
    res = np.random.default_rng(3).standard_normal(P.c).astype(np.float32)
    rec = _stats(1, P.c, 0, 2, r)
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    assert dut.ring < P.c
    out = _run(dut, [], [_message(res.view(np.uint32).tolist(), rec)], seed=3)
    assert out["frames"] == [*_result_frames(1, P.c, 0, res), host_port.stats_frame(rec)]


def test_register_frames_write_and_read_the_bank_and_set_the_world():
    regs = [r for blk in register_map(P) for r in blk.regs]
    off = {r.name: r.offset for r in regs}
    bank = {off["param_c"]: P.c, off["rank"]: 0}
    req = reg_request([(off["param_c"], None), (off["rank"], 3), (off["world"], 5),
                       (off["rank"], None), (0x1F0, None)])  # fmt: skip
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    rng = random.Random(5)
    res = np.float32([2.5, -1.0])
    rec = _stats(0, 2, 0, 5, rng)  # a record of world 5 now fits
    out = _run(
        dut,
        [req],
        [_message(res.view(np.uint32).tolist(), rec)],
        regs=bank,
        seed=5,
        messages_after=300,
    )
    assert out["writes"] == [(off["rank"], 3), (off["world"], 5)]
    after = dict(bank) | {off["rank"]: 3, off["world"]: 5, 0x1F0: 0xDEAD0000 | 0x1F0}
    reply = reg_reply(req, after)
    assert out["world"] == 5
    assert reply in out["frames"]
    f0 = HostFrame(host_port.RESULT, 0, 0, 2, 0, res.astype(">f4").tobytes())
    want = {reply, host_port.build(f0, to_nic=False), host_port.stats_frame(rec)}
    assert set(out["frames"]) == want and len(out["frames"]) == 3
    assert out["counters"] == _counts(rx_frames=1, tx_frames=3)


@pytest.mark.parametrize("seed", [11, 12])
def test_replies_and_results_take_turns_on_the_one_sender(seed):
    """REG frames come in while results and STATS records go out: the adapter's one frame
    sender takes the two in turns, a whole frame at a time. Every reply and every result
    frame is the model's, the results in order, and some replies leave between two frames
    of one op's results (the two really overlapped)."""
    regs = [r for blk in register_map(P) for r in blk.regs]
    off = {r.name: r.offset for r in regs}
    bank = {off["param_c"]: P.c, off["param_b"]: P.b}
    reqs = [reg_request([(off["param_c"], None), (off["param_b"], None)], tag=k)
            for k in range(6)]  # fmt: skip
    rng, r = np.random.default_rng(seed), random.Random(seed)
    msgs, results = [], []
    for op in range(3):
        n = 3 * FRAG + 5
        res = rng.standard_normal(n).astype(np.float32)
        rec = _stats(op, n, 0, 2, r)  # world 2: the bank's reset value
        msgs.append(_message(res.view(np.uint32).tolist(), rec))
        for o in range(0, n, FRAG):
            part = res[o : o + FRAG].astype(">f4").tobytes()
            results.append(host_port.build(HostFrame(host_port.RESULT, op, o, n, 0, part),
                                           to_nic=False))  # fmt: skip
        results.append(host_port.stats_frame(rec))
    replies = [reg_reply(q, bank) for q in reqs]
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, reqs, msgs, regs=bank, seed=seed)
    assert [fr for fr in out["frames"] if fr in results] == results
    assert [fr for fr in out["frames"] if fr in replies] == replies
    assert len(out["frames"]) == len(results) + len(replies)
    first = out["frames"].index(results[0])
    last = out["frames"].index(results[4])  # op 0's STATS frame
    assert any(out["frames"].index(q) in range(first, last) for q in replies)
    assert out["counters"] == _counts(rx_frames=len(reqs), tx_frames=len(out["frames"]))


def test_of_two_clients_starting_together_the_first_goes_and_the_second_waits():
    """The sender's clients in one cycle: both ask; only the first may start (the second's
    `free` is low, so its FSM stays), the first's fields are the ones loaded, and the
    second's frame goes out after the first's."""
    from amaranth import Elaboratable, Module

    from optireduce.hw.host_adapter import _FrameSender, _share

    class Two(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.submodules.tx = self.tx = _FrameSender(4)
            self.a, self.b = _share(m, self.tx, ("a", "b"))
            return m

    dut = Two()
    frames = []

    async def bench(ctx):
        ctx.set(dut.tx.o.ready, 1)
        for k, c in enumerate((dut.a, dut.b)):
            ctx.set(c.kind, host_port.REG)
            ctx.set(c.op_id, 100 + k)
            ctx.set(c.start, 1)
        assert ctx.get(dut.a.free) and not ctx.get(dut.b.free)
        assert ctx.get(dut.tx.op_id) == 100
        await ctx.tick()
        ctx.set(dut.a.start, 0)
        assert ctx.get(dut.a.busy) and not ctx.get(dut.b.busy) and not ctx.get(dut.b.free)
        frame = bytearray()
        for _ in range(400):
            if ctx.get(dut.tx.o.valid):
                frame.append(ctx.get(dut.tx.o.payload.data[0]))
                if ctx.get(dut.tx.o.payload.last):
                    frames.append(bytes(frame))
                    frame = bytearray()
            b_starts = ctx.get(dut.b.free) and ctx.get(dut.b.start)
            await ctx.tick()
            if b_starts:  # it started at this edge
                ctx.set(dut.b.start, 0)
        assert not ctx.get(dut.a.busy) and not ctx.get(dut.b.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # the op_id field (bytes 18..21 of the header) names each frame's client: a, then b
    assert [int.from_bytes(fr[18:22], "big") for fr in frames] == [100, 101]


def _model_takes(frame: bytes) -> bool:
    try:
        host_port.parse(host_port.unpad(frame))
    except ValueError:
        return False
    return True


def test_padded_frames_are_taken_as_a_wire_delivers_them():
    """A wire pads every frame to Ethernet's 60 bytes (with any bytes): the adapter takes
    what the model's unpad and parse take, and the padding never reaches the core. (The
    model does not check a REG frame's count for pairs; the adapter drops an odd one.)"""
    rng = np.random.default_rng(7)
    off = {r.name: r.offset for blk in register_map(P) for r in blk.regs}

    def pad(frame: bytes, to: int = host_port.ETH_MIN) -> bytes:
        return frame + rng.integers(0, 256, to - len(frame), np.uint8).tobytes()

    x0 = rng.standard_normal(3).astype(np.float32)
    x1 = rng.standard_normal(9).astype(np.float32)
    x2 = rng.standard_normal(6).astype(np.float32)
    seven = _frame(START, 1, 0, 9, 4, x1[:7])  # 62 bytes
    req = reg_request([(off["param_c"], None)], tag=77)  # 42 bytes
    odd_reg = host_port.build(HostFrame(host_port.REG, 78, 0, 0, 0, bytes(4)), to_nic=True)
    frames = [
        pad(_frame(START, 0, 0, 3, -2, x0)),  # 46 bytes of a START, 14 of padding
        pad(_frame(START, 1, 0, 9, 4, x1[:2]), 61),  # one byte past the least length
        seven[: host_port.ETH_MIN],  # cut, not padded: its words end past 60 bytes
        _frame(START, 1, 0, 9, 4, x1[:8]),
        pad(_frame(DATA, 1, 8, 9, 4, x1[8:])),
        pad(req),
        pad(_frame(START, 2, 0, 6, 1, x2[:0])),  # no words: 34 bytes, 26 of padding
        pad(_frame(DATA, 2, 0, 6, 1, x2)),  # 6 words, the most a padded frame holds
        pad(odd_reg),  # one word: not an (address, data) pair
    ]
    taken = [True, False, False, True, True, True, True, True, False]  # by hand
    assert [_model_takes(f) for f in frames[:-1]] == taken[:-1]
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, frames, [], regs={off["param_c"]: P.c}, seed=7)
    assert out["cmd"] == [(0, 3, -2), (1, 9, 4), (2, 6, 1)]
    want = np.concatenate([x0, x1, x2]).view(np.uint32).tolist()
    assert [w for w, _, _ in out["words"]] == want
    assert [k for k, (_, _, last) in enumerate(out["words"]) if last] == [2, 11, 17]
    assert out["frames"] == [reg_reply(req, {off["param_c"]: P.c})]
    assert out["counters"] == _counts(rx_frames=sum(taken), tx_frames=1, drop_bad_length=3)


def test_every_register_access_goes_to_the_bank_in_order():
    """REG accesses of every block, the host block's counters and `ctrl` included, go to
    the bank in the frame's order (the bank counts the adapter's strobes: test_csr.py,
    and the virtual board end to end); a read's data comes back in the reply."""
    off = {r.name: r.offset for blk in register_map(P) for r in blk.regs}
    x = np.float32([0.25])
    start = _frame(START, 0, 0, 1, 0, x)
    bad_header = bytes(start[:14]) + b"\x02" + bytes(start[15:])
    bad_length = start + bytes(4)
    bank = {off["param_c"]: P.c, off["adapter_rx_frames"]: 1234,
            off["adapter_drop_bad_header"]: 77}  # fmt: skip
    names = ("adapter_drop_bad_header", "adapter_rx_frames", "param_c")
    req1 = reg_request([(off[name], None) for name in names], tag=1)
    req2 = reg_request([(off["ctrl"], 1), (off["adapter_rx_frames"], None)], tag=2)
    dut = HostAdapter(P, rx_words=FRAG, tx_fragment=FRAG)
    out = _run(dut, [bad_header, bad_length, start, req1, req2], [], regs=bank, seed=11)
    assert out["cmd"] == [(0, 1, 0)]
    assert out["frames"] == [reg_reply(req1, {off[name]: bank[off[name]] for name in names}),
                             reg_reply(req2, {off["adapter_rx_frames"]: 1234})]  # fmt: skip
    assert out["writes"] == [(off["ctrl"], 1)]
    # a strobe per event: two frames taken (the START and the REG frames' replies count
    # as sent), one bad header, one bad length
    assert out["counters"] == _counts(rx_frames=3, tx_frames=2, drop_bad_header=1,
                                      drop_bad_length=1)  # fmt: skip


# ---- the frame plumbing around the adapter on a board (hw/board_frames.py) ------------


def _stream_frames(dut_in, frames, rng, nbytes=1):
    """A testbench coroutine that sends frames (bytes) into a frame_stream(nbytes) port."""

    async def run(ctx):
        for fr in frames:
            beats = [fr[k : k + nbytes] for k in range(0, len(fr), nbytes)] or [b""]
            for j, beat in enumerate(beats):
                while rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut_in.valid, 1)
                for lane in range(nbytes):
                    ctx.set(dut_in.payload.data[lane], beat[lane] if lane < len(beat) else 0)
                ctx.set(dut_in.payload.keep, (1 << len(beat)) - 1)
                ctx.set(dut_in.payload.last, j == len(beats) - 1)
                await ctx.tick().until(dut_in.ready)
                ctx.set(dut_in.valid, 0)

    return run


def _collect(ports: dict, rng, cycles: int, nbytes: dict) -> dict:
    """A testbench coroutine body: frames (bytes) and beats seen on each output port."""
    got = {name: {"frames": [], "beats": [], "cur": bytearray()} for name in ports}

    async def run(ctx):
        for _ in range(cycles):
            for port in ports.values():
                ctx.set(port.ready, rng.random() < 0.6)
            for name, port in ports.items():
                if ctx.get(port.valid) and ctx.get(port.ready):
                    keep = ctx.get(port.payload.keep)
                    lanes = [ctx.get(port.payload.data[k]) for k in range(nbytes[name])]
                    last = ctx.get(port.payload.last)
                    g = got[name]
                    g["beats"].append((bytes(lanes), keep, last))
                    g["cur"] += bytes(b for k, b in enumerate(lanes) if keep >> k & 1)
                    if last:
                        g["frames"].append(bytes(g["cur"]))
                        g["cur"] = bytearray()
            await ctx.tick()

    return got, run


def _rand_frames(rng: random.Random, count: int, lo: int, hi: int) -> list[bytes]:
    return [bytes(rng.randrange(256) for _ in range(rng.randint(lo, hi))) for _ in range(count)]


def test_widen_and_narrow_keep_every_frame_byte_for_byte():
    from amaranth import Module

    from optireduce.hw.board_frames import Narrow, Widen

    rng = random.Random(7)
    frames = _rand_frames(rng, 30, 1, 40)
    m = Module()
    m.submodules.w, m.submodules.n = w, n = Widen(8), Narrow(8)
    sim = Simulator(m)
    sim.add_clock(1e-8)
    got_w, run_w = _collect({"w": w.o}, random.Random(8), 6000, {"w": 8})
    got_n, run_n = _collect({"n": n.o}, random.Random(9), 6000, {"n": 1})
    sim.add_testbench(_stream_frames(w.i, frames, rng), background=True)
    sim.add_testbench(_stream_frames(n.i, frames, random.Random(10), nbytes=8), background=True)

    sim.add_testbench(run_w)
    sim.add_testbench(run_n)
    sim.run()
    # reference: the frame cut into 8-byte beats, keep marking the valid low lanes
    ref = []
    for fr in frames:
        for k in range(0, len(fr), 8):
            beat = fr[k : k + 8]
            ref.append((len(beat), beat, k + 8 >= len(fr)))
    beats = got_w["w"]["beats"]
    assert [(bin(keep).count("1"), lanes[: bin(keep).count("1")], last)
            for lanes, keep, last in beats] == ref  # fmt: skip
    assert all(keep == (1 << bin(keep).count("1")) - 1 for _, keep, _ in beats)
    assert got_n["n"]["frames"] == frames


def test_ethertype_demux_and_frame_mux_route_whole_frames():
    from amaranth import Module

    from optireduce.hw.board_frames import EtherTypeDemux, FrameMux

    rng = random.Random(11)
    host = [_frame(START, k, 0, 3, 0, np.float32([k, 1, 2])) for k in range(6)]
    other = _rand_frames(rng, 8, 14, 60) + _rand_frames(rng, 3, 1, 13)  # short ones: net
    other = [f[:12] + b"\x08\x00" + f[14:] if len(f) >= 14 else f for f in other]
    mixed = host + other
    rng.shuffle(mixed)
    m = Module()
    m.submodules.d, m.submodules.x = d, x = EtherTypeDemux(), FrameMux()
    sim = Simulator(m)
    sim.add_clock(1e-8)
    got, run = _collect({"host": d.host, "net": d.net, "mux": x.o}, random.Random(12), 8000,
                        {"host": 1, "net": 1, "mux": 1})  # fmt: skip
    a_frames = [b"\xaa" + f for f in _rand_frames(rng, 10, 0, 30)]  # sources tell apart
    b_frames = [b"\xbb" + f for f in _rand_frames(rng, 10, 0, 30)]
    sim.add_testbench(_stream_frames(d.i, mixed, rng), background=True)
    sim.add_testbench(_stream_frames(x.a, a_frames, random.Random(13)), background=True)
    sim.add_testbench(_stream_frames(x.b, b_frames, random.Random(14)), background=True)
    sim.add_testbench(run)
    sim.run()
    assert got["host"]["frames"] == [f for f in mixed if f in host]
    assert got["net"]["frames"] == [f for f in mixed if f not in host]
    out = got["mux"]["frames"]
    assert [f for f in out if f in a_frames] == a_frames  # whole frames, each source in order
    assert [f for f in out if f in b_frames] == b_frames
    assert len(out) == len(a_frames) + len(b_frames)
