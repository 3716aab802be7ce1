# amaranth: UnusedElaboratable=no
"""The board's shell (hw/nic_shell.py) with the real NIC core in its own clock, in
amaranth.sim: sync at 125 MHz, core at 52.08 MHz. Frames on the network port cross
into the core and are counted there by drop reason, as the software parser
(host/ubt.py parse_frame) classifies them; a REG frame on the host port crosses to the
core's register bank and comes back as the model (host_adapter.reg_reply) says, with
the counters' values and the writes applied."""

from __future__ import annotations

import collections
import random

from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from optireduce.host import ubt
from optireduce.host.trace import TRACE_PARAMS
from optireduce.hw.csr import register_map
from optireduce.hw.host_adapter import reg_reply, reg_request
from optireduce.hw.nic_shell import NicShell
from optireduce.sim.stream_sim import send_bytes

SYNC_NS, CORE_NS = 8.0, 19.2


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
    top = Module()
    top.domains.sync = ClockDomain("sync")
    top.domains.core = ClockDomain("core")
    top.submodules.shell = shell
    sim = Simulator(top)
    sim.add_clock(SYNC_NS * 1e-9, domain="sync")
    sim.add_clock(CORE_NS * 1e-9, domain="core")
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
