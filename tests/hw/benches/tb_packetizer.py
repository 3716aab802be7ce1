"""cocotb bench of the packetizer (AxisWrapper around PlainStreams) under Verilator.

Ops go in on s_axis (elements, tuser = first), frames come out on m_axis with tkeep; `own`
is drained on plain ports with random backpressure. Frames are compared byte for byte with
host/model/packetizer.py, then parsed by scapy (optireduce/ubt_scapy.py), which recomputes the IPv4
header checksum independently of both.
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from optireduce import ubt
from optireduce.host.model.packetizer import OpContext, gather_frames, scatter_frames
from optireduce.params import NicParams
from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config
from optireduce.ubt_scapy import scapy_to_header, scapy_values


def _params() -> NicParams:
    return NicParams(**bench_config())


class Monitor:
    """Records dst at each frame's first beat on m_axis, and drains `own` (random ready)."""

    def __init__(self, dut, lanes: int, seed: int) -> None:
        self.dut, self.lanes = dut, lanes
        self.dsts: list[int] = []
        self.own: list[tuple[int, list[int]]] = []
        self.rng = random.Random(seed)

    async def run(self) -> None:
        dut = self.dut
        in_frame, pkt, idx = False, [], None
        while True:
            dut.own_ready.value = int(self.rng.random() > 0.4)
            await RisingEdge(dut.clk)
            if dut.m_axis_tvalid.value and dut.m_axis_tready.value:
                if not in_frame:
                    self.dsts.append(int(dut.dst.value))
                in_frame = not dut.m_axis_tlast.value
            if dut.own_valid.value and dut.own_ready.value:
                assert int(dut.own_first.value) == (not pkt)
                raw = int(dut.own_data.value).to_bytes(4 * self.lanes, "little")
                pkt += [int(v) for v in unpack(raw, 32, self.lanes)]
                idx = int(dut.own_index.value) if idx is None else idx
                assert int(dut.own_index.value) == idx
                if dut.own_last.value:
                    self.own.append((idx, pkt))
                    pkt, idx = [], None


def _set_ports(dut, ctx: OpContext, gather: bool, t_c: int, contributors: int = 0) -> None:
    dut.msg_type.value = ubt.MSG_GATHER if gather else ubt.MSG_SCATTER
    dut.rank.value = ctx.rank
    dut.world.value = ctx.world
    dut.job_id.value = ctx.p.job_id
    dut.op_id.value = ctx.op_id
    dut.exponent.value = ctx.exponent & 0xFF
    dut.op_len.value = ctx.op_len
    dut.t_c_us.value = t_c
    dut.contributors.value = contributors


def _scapy_check(frame: bytes, exp_header: ubt.UbtHeader, exp_values: np.ndarray) -> None:
    pkt = Ether(frame)
    ip = pkt[IP]
    redo = ip.copy()
    del redo.chksum  # scapy computes it again when the layer is built
    assert ip.chksum == IP(bytes(redo)).chksum, "IPv4 header checksum"
    assert ip.len == len(frame) - ubt.ETH_LEN and pkt[UDP].chksum == 0
    assert scapy_to_header(pkt) == exp_header
    np.testing.assert_equal(scapy_values(pkt), exp_values)


@cocotb.test()
async def frames_match_model_and_scapy(dut):
    p = _params()
    tb = AxisTB(dut, seed=2, idle=0.3, backpressure=0.3)
    mon = Monitor(dut, p.lanes, seed=3)
    await tb.reset()
    cocotb.start_soon(mon.run())
    rng = np.random.default_rng(4)
    cases = [  # (gather, world, rank, op_len): world 2 and n_max, a one-block op
        (False, 3, 1, 200), (True, 3, 0, 256), (False, p.n_max, 0, 1),
        (True, 2, 1, 130), (False, 2, 1, p.c),
    ]  # fmt: skip
    want_own = []
    for gather, world, rank, op_len in cases:
        exponent = int(rng.integers(-128, 128))
        op_id, t_c = (int(x) for x in rng.integers(0, 1 << 32, 2))
        ctx = OpContext(p, rank, world, op_id, exponent, op_len)
        n = p.packets_for(op_len)
        if gather:
            slots = np.arange(rank, n, world)
            vals = rng.integers(-(1 << 31), 1 << 31, (len(slots), p.p))
            counts = rng.integers(1, world + 1, len(slots))
            frames = gather_frames(slots, vals, counts, ctx, t_c)
            for row in range(len(slots)):  # contributors is sampled per slot
                _set_ports(dut, ctx, True, t_c, int(counts[row]))
                await tb.send(pack(vals[row], 32, p.lanes), first=True)
                await tb.source.wait()
        else:
            vals = rng.integers(-(1 << 31), 1 << 31, (n, p.p))
            vals[0, :2] = [(1 << 31) - 1, -(1 << 31)]
            frames = scatter_frames(vals, ctx, t_c)
            want_own += [(i, list(vals[i])) for i in range(rank, n, world)]
            _set_ports(dut, ctx, False, t_c)
            await tb.send(pack(vals, 32, p.lanes), first=True)
            await tb.source.wait()
        for i, dst, exp in frames:
            got = await tb.recv()
            assert bytes(got.tdata) == exp, f"frame of packet {i} to {dst}"
            h = ubt.UbtHeader.unpack(exp, ubt.L2_L4_LEN)
            row = i if not gather else (i - rank) // world
            _scapy_check(bytes(got.tdata), h, vals[row])
        assert mon.dsts[-len(frames) :] == [d for _, d, _ in frames]
    for _ in range(4 * p.p):
        await RisingEdge(dut.clk)
    assert [i for i, _ in mon.own] == [i for i, _ in want_own]
    np.testing.assert_equal(np.array([v for _, v in mon.own]), np.array([v for _, v in want_own]))
