"""cocotb bench of the packet parser (hw/parser.py) in its AXI-Stream shell.

A random mix of valid frames and of frames broken at every layer goes in on
s_axis (tkeep on the last beat) with idle cycles; the payloads of the accepted
ones come out on m_axis under backpressure. Each is checked against
optireduce/frame_checks.py: classify, as are the per-frame verdict strobes, the header
port at each packet's first beat and the drop counters.
"""

from __future__ import annotations

import random
import struct

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from optireduce import ubt
from optireduce.frame_checks import classify
from optireduce.hw.parser import PARSER_REASONS
from optireduce.hw.ubt_layout import HEADER_LAYOUT
from optireduce.params import NicParams
from optireduce.sim.axis_tb import AxisTB, unpack
from optireduce.sim.cocotb_run import bench_config

RANK, WORLD, BASE = 2, 5, 7


def _header_from_bits(v: int) -> ubt.UbtHeader:
    out = {}
    for name, fld in HEADER_LAYOUT:
        x = (v >> fld.offset) & ((1 << fld.width) - 1)
        if fld.shape.signed and x >> (fld.width - 1):
            x -= 1 << fld.width
        out[name] = x
    return ubt.UbtHeader(**out)


def _fix_ip(b: bytearray) -> None:
    b[24:26] = b"\0\0"
    b[24:26] = ubt.ipv4_checksum(bytes(b[14:34])).to_bytes(2, "big")


def make_frames(p: NicParams, rng: random.Random, n: int) -> list[bytes]:
    frames = []
    for _ in range(n):
        msg = rng.choice([ubt.MSG_SCATTER, ubt.MSG_GATHER])
        sender = rng.choice([r for r in range(WORLD) if r != RANK])
        owner = RANK if msg == ubt.MSG_SCATTER else sender
        idx = rng.choice([i for i in range(p.packets_for(p.c)) if i % WORLD == owner])
        h = ubt.UbtHeader(
            version=1, msg_type=msg, flags=rng.randrange(2), exponent=rng.randrange(-128, 128),
            job_id=p.job_id, sender=sender, op_id=BASE + rng.randrange(p.rx_window),
            pkt_index=idx, count=p.p,
            contributors=0 if msg == ubt.MSG_SCATTER else rng.randrange(1, WORLD + 1),
            t_c_us=rng.randrange(2**32), op_len=p.c, world=WORLD, reserved=0,
        )  # fmt: skip
        vals = [rng.choice([-(2**31), 2**31 - 1, 0, rng.randrange(-(2**31), 2**31)])
                for _ in range(p.p)]  # fmt: skip
        f = bytearray(ubt.build_frame(h, ubt.payload_bytes(np.array(vals)),
                                      src=sender, dst=RANK, port=p.udp_port))  # fmt: skip
        kind = rng.random()
        if kind < 0.2:  # a header field or two broken, IP checksum still right
            for _ in range(rng.randrange(1, 3)):
                f[rng.randrange(ubt.L2_L4_LEN + ubt.HEADER_LEN)] = rng.randrange(256)
            _fix_ip(f)
        elif kind < 0.3:  # any byte, checksum left alone
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif kind < 0.4:
            f = f[: rng.randrange(1, len(f))]
        elif kind < 0.45:
            f += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 20)))
        elif kind < 0.5:
            struct.pack_into("!I", f, ubt.L2_L4_LEN + 8, (BASE + rng.choice([-1, 4, 5])) % 2**32)
        elif kind < 0.55:
            f = bytearray(rng.randrange(256) for _ in range(rng.randrange(1, 120)))
        frames.append(bytes(f))
    return frames


@cocotb.test()
async def parser_random_mix(dut):
    cfg = bench_config()
    p = NicParams(p=cfg["p"], b=cfg["b"], c=cfg["c"], n_max=cfg["n_max"])
    tb = AxisTB(dut, seed=4, idle=0.3, backpressure=0.4)
    dut.rank.value = RANK
    dut.world.value = WORLD
    dut.base.value = BASE
    dut.mac.value = int.from_bytes(ubt.DEFAULT_ADDRESSING.mac(RANK), "big")
    dut.ip.value = int.from_bytes(ubt.DEFAULT_ADDRESSING.ip(RANK), "big")
    await tb.reset()

    frames = make_frames(p, random.Random(11), 160)
    want = [classify(f, p, RANK, WORLD, BASE) for f in frames]
    good = [w for w in want if not isinstance(w, str)]
    assert 40 <= len(good) < len(frames)  # the mix has both kinds

    verdicts, headers = [], []

    async def monitor():
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            if int(dut.accept.value):
                verdicts.append(-1)
            if int(dut.drop.value):
                verdicts.append(int(dut.reason.value))
            if (int(dut.m_axis_tvalid.value) and int(dut.m_axis_tready.value)
                    and int(dut.m_axis_tuser.value)):  # fmt: skip
                headers.append(_header_from_bits(int(dut.header.value)))

    cocotb.start_soon(monitor())
    for f in frames:
        await tb.send(f)
    for w in good:
        got = await tb.recv()
        np.testing.assert_equal(unpack(got.tdata, 32, p.lanes), ubt.payload_values(w.payload))
    for _ in range(200):
        await RisingEdge(dut.clk)
    assert tb.sink.empty()
    assert verdicts == [-1 if not isinstance(w, str) else ubt.DROP_CODE[w] for w in want]
    assert headers == [w.header for w in good]
    counts = int(dut.drop_count.value)
    got_counts = [(counts >> (32 * j)) & 0xFFFFFFFF for j in range(len(PARSER_REASONS))]
    assert got_counts == [sum(w == r for w in want) for r in PARSER_REASONS]
