"""cocotb bench of Saturate behind AxisWrapper: ops as frames with random idle and backpressure;
outputs and the per-op clamp counter checked against host/model/codec.py: saturate."""

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from optireduce.host.model.codec import saturate
from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def saturate_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    lanes, w_in, w_out = cfg["lanes"], cfg["width_in"], cfg["limit_bits"]
    lim = (1 << (w_out - 1)) - 1
    lo, hi = -(1 << (w_in - 1)), (1 << (w_in - 1)) - 1
    rng = np.random.default_rng(0)
    edges = [0, 1, -1, lim, -lim, lim + 1, -lim - 1, hi, lo, lim - 1]
    ops = [
        np.array(edges, dtype=np.int64),
        rng.integers(lo, hi + 1, 64),
        rng.integers(-2 * lim, 2 * lim + 1, 100),
        np.zeros(4, dtype=np.int64),
    ]
    tb = AxisTB(dut, seed=3, idle=0.3, backpressure=0.3)
    await tb.reset()
    for x in ops:  # one op at a time, so `count` is read before the next op starts
        got = await tb.op(pack(x, w_in, lanes))
        await RisingEdge(dut.clk)
        want, n = saturate(x, lim)
        np.testing.assert_equal(unpack(got.tdata, w_out, lanes), want)
        assert int(dut.count.value) == n, (int(dut.count.value), n)
