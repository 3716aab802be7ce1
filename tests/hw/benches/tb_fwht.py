"""cocotb bench of Fwht behind AxisWrapper: ops as AXI-Stream frames (tuser = first on the first
beat, tlast = last), random idle and backpressure, every frame checked against fwht_blocks."""

import cocotb
import numpy as np
from cocotb.triggers import Timer

from optireduce.host.model.fwht import fwht_blocks
from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config


def beat_user(frame, beat_bytes: int) -> list[int]:
    """tuser of each beat (the sink keeps one value per byte, or one int if all are equal)."""
    beats = len(frame.tdata) // beat_bytes
    if frame.tuser is None or isinstance(frame.tuser, int):
        return [int(frame.tuser or 0)] * beats
    return [int(u) for u in frame.tuser[::beat_bytes]]


@cocotb.test()
async def fwht_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    b, lanes, w_in, w_out = cfg["b"], cfg["lanes"], cfg["width_in"], cfg["width_out"]
    out_bytes = -(-(w_out * lanes) // 8)
    top = (1 << (w_in - 1)) - 1
    rng = np.random.default_rng(cfg.get("seed", 0))
    ops = [
        rng.integers(-top, top + 1, b),
        np.concatenate([np.full(b, top), np.full(b, -top), np.zeros(b, dtype=np.int64)]),
        rng.integers(-top, top + 1, 2 * b),
        rng.integers(-3, 4, b),
    ]
    for idle, bp in ((0.3, 0.3), (0.0, 0.0)):
        tb = AxisTB(dut, seed=int(idle * 10) + 1, idle=idle, backpressure=bp)
        await tb.reset()
        for x in ops:  # queue all ops: they stream back to back
            await tb.send(pack(x, w_in, lanes), first=True)
        for x in ops:
            got = await tb.recv()
            np.testing.assert_equal(unpack(got.tdata, w_out, lanes), fwht_blocks(x, b))
            user = beat_user(got, out_bytes)
            assert user == [1] + [0] * (len(user) - 1), user
        assert tb.sink.empty()
        await Timer(100, unit="ns")
