"""cocotb bench of the toy Negate block (checks the shared AXI-Stream harness)."""

import cocotb
import numpy as np

from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def negate_with_idle_and_backpressure(dut):
    cfg = bench_config()
    w, lanes = cfg["width"], cfg["lanes"]
    tb = AxisTB(dut, seed=1, idle=0.3, backpressure=0.3)
    await tb.reset()
    rng = np.random.default_rng(0)
    lo, hi = -(1 << (w - 1)) + 1, (1 << (w - 1)) - 1
    for n in (2, 6, 100):
        vals = rng.integers(lo, hi + 1, n)
        got = await tb.op(pack(vals, w, lanes))
        np.testing.assert_array_equal(unpack(got.tdata, w, lanes), -vals)
        assert got.tuser in (1, [1] * (len(got.tdata) // (-(-w * lanes // 8)))) or got.tuser[0] == 1
