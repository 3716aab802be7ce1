# amaranth: UnusedElaboratable=no
"""The board's shell (hw/nic_shell.py) with the real NIC core in its own clock, in
amaranth.sim: sync at 125 MHz, core at 52.08 MHz. Frames on the network port cross
into the core and are counted there by drop reason, as the software parser
(optireduce/ubt.py parse_frame) classifies them; a REG frame on the host port crosses to the
core's register bank and comes back as the model (host_port.reg_reply) says, with
the counters' values and the writes applied. With a loopback in place of the core, an
op's words go out and its RESULT and STATS frames come back, network frames come back
whole, and the core counts every microsecond tick: every crossing carries data."""

from __future__ import annotations

import collections
import random

import numpy as np

from optireduce import host_port, ubt
from optireduce.host_port import HostFrame, reg_reply, reg_request
from optireduce.hw.csr import register_map
from optireduce.hw.host_adapter import RECORD_FIXED
from optireduce.hw.loopback_core import LoopbackCore
from optireduce.hw.nic_shell import NicShell
from optireduce.sim.stream_sim import send_bytes, two_clock_sim
from optireduce.sim.trace import TRACE_PARAMS


def _junk(rng: random.Random) -> list[bytes]:
    """Frames the core must drop before any op state: short, not IPv4, bad IP header."""
    frames = []
    for _ in range(4):
        frames.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(14, 40))))
    for _ in range(5):
        body = bytearray(rng.getrandbits(8) for _ in range(rng.randint(60, 90)))
        body[12:14] = b"\x86\xdd"  # IPv6
        frames.append(bytes(body))
    for _ in range(3):
        body = bytearray(rng.getrandbits(8) for _ in range(64))
        body[12:15] = b"\x08\x00\x46"  # IPv4 with options
        frames.append(bytes(body))
    rng.shuffle(frames)
    return frames


def test_frames_and_registers_cross_between_the_clocks():
    p = TRACE_PARAMS
    rng = random.Random(11)
    junk = _junk(rng)
    counts = collections.Counter(
        ubt.parse_frame(f, port=p.udp_port, rank=0)
        for f in junk  # rank: its reset value
    )
    assert set(counts) <= set(ubt.DROP_REASONS) and len(counts) >= 2

    regs = {r.name: r for blk in register_map(p) for r in blk.regs}
    accesses = [(regs["world"].offset, 3), (regs["seed"].offset, 0x1234_5678)]
    accesses += [(regs[name].offset, None) for name in ("world", "seed", "param_c", "param_n_max")]
    accesses += [(regs[name].offset, None) for name in ubt.DROP_REASONS[:4]]
    request = reg_request(accesses)
    read = {regs["world"].offset: 3, regs["seed"].offset: 0x1234_5678,
            regs["param_c"].offset: p.c, regs["param_n_max"].offset: p.n_max}  # fmt: skip
    read.update({regs[name].offset: counts[name] for name in ubt.DROP_REASONS[:4]})
    want = reg_reply(request, read)

    shell = NicShell(p)
    sim = two_clock_sim(shell)
    state = {"net_done": False}
    replies = []

    async def network(ctx):
        for f in junk:
            await send_bytes(ctx, shell.net_rx, f, rng, gap=0.1)
            await ctx.tick().repeat(rng.randint(1, 12))
        await ctx.tick().repeat(400)  # the last frame through the crossing and the parser
        state["net_done"] = True

    async def host(ctx):
        ctx.set(shell.host_tx.ready, 1)
        while not state["net_done"]:
            await ctx.tick()
        await send_bytes(ctx, shell.host_rx, request, rng, gap=0.1)
        frame = bytearray()
        for _ in range(5000):
            await ctx.tick()
            if ctx.get(shell.host_tx.valid):
                frame.append(ctx.get(shell.host_tx.payload.data[0]))
                if ctx.get(shell.host_tx.payload.last):
                    replies.append(bytes(frame))
                    return
        raise AssertionError("no REG reply within 5000 cycles")

    sim.add_testbench(network, background=True)
    sim.add_testbench(host)
    sim.run()
    assert replies == [want]


def test_every_crossing_carries_data_both_ways():
    p = TRACE_PARAMS
    rng = random.Random(5)
    x = np.float32([rng.uniform(-4, 4) for _ in range(200)])  # two RESULT frames of <= 128
    start = host_port.build(HostFrame(host_port.START, 0, 0, len(x), 5,
                                      x.astype(">f4").tobytes()), to_nic=True)  # fmt: skip
    net = [bytes(rng.getrandbits(8) for _ in range(rng.randint(60, 200))) for _ in range(6)]
    ticks = 9
    reg = reg_request([(0x0, None)])
    want_rec = [0, len(x), 5] + [0] * (RECORD_FIXED - 4) + [2] + [0] * 3

    shell = NicShell(p, LoopbackCore, tx_fragment=128)
    sim = two_clock_sim(shell)
    out = {"host": [], "net": []}
    done = {"net_in": False}

    async def drive(ctx):
        for _ in range(ticks):  # microsecond ticks, a pulse every 20 cycles
            ctx.set(shell.tick, 1)
            await ctx.tick()
            ctx.set(shell.tick, 0)
            await ctx.tick().repeat(19)
        for f in net:
            await send_bytes(ctx, shell.net_rx, f, rng, gap=0.2)
        done["net_in"] = True
        await send_bytes(ctx, shell.host_rx, start, rng, gap=0.1)
        await ctx.tick().repeat(200)
        await send_bytes(ctx, shell.host_rx, reg, rng, gap=0.1)

    def collector(port, key):
        async def collect(ctx):
            await _collect(ctx, port, key)

        return collect

    async def _collect(ctx, port, key):
        frame = bytearray()
        while True:
            ready = rng.random() < 0.8
            ctx.set(port.ready, ready)
            if ready and ctx.get(port.valid):  # taken at this cycle's edge
                frame.append(ctx.get(port.payload.data[0]))
                if ctx.get(port.payload.last):
                    out[key].append(bytes(frame))
                    frame = bytearray()
            await ctx.tick()

    async def stop(ctx):
        for _ in range(60_000):
            await ctx.tick()
            if len(out["host"]) == 4 and len(out["net"]) == len(net):  # 2 RESULT, STATS, REG
                return
        raise AssertionError(f"frames out: {len(out['host'])} host, {len(out['net'])} net")

    sim.add_testbench(drive, background=True)
    sim.add_testbench(collector(shell.host_tx, "host"), background=True)
    sim.add_testbench(collector(shell.net_tx, "net"), background=True)
    sim.add_testbench(stop)
    sim.run()

    assert out["net"] == net
    # the REG reply may come before the results (the adapter's two sides are independent)
    regs = [f for f in out["host"] if host_port.parse(f).kind == host_port.REG]
    assert regs == [reg_reply(reg, {0x0: ticks})]  # every tick reached the core
    res = [host_port.parse(f) for f in out["host"] if f not in regs]
    assert [f.kind for f in res] == [host_port.RESULT, host_port.RESULT, host_port.STATS]
    assert [(f.op_id, f.n, f.exponent) for f in res[:2]] == [(0, len(x), 5)] * 2
    got = np.frombuffer(res[0].payload + res[1].payload, ">f4")
    assert np.array_equal(got.view(">u4"), x.astype(">f4").view(">u4"))
    assert np.frombuffer(res[2].payload, ">u4").tolist() == want_rec
