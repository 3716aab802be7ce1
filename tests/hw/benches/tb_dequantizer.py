"""cocotb bench of the Dequantizer against host/model/quantize.py `dequantize`.

Each op is one AXI-Stream frame of signed elements (tuser marks the first beat); the
exponent port is set before the frame and the output frame of float32 bit patterns is
awaited before the next op. Random idle on the source and backpressure on the sink.
"""

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from optireduce.host.model.quantize import dequantize
from optireduce.sim.axis_tb import AxisTB, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def dequantizer_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    lanes = cfg["lanes"]
    tb = AxisTB(dut, seed=6, idle=0.3, backpressure=0.3)
    await tb.reset(exponent=0, clear=0)
    sat = 0
    async for op, v, got in tb.ops(cfg["ops"], cfg["width"], lanes, ("exponent",)):
        model = dequantize(v, op["exponent"])
        sat += model.saturated
        got_bits = unpack(got, 32, lanes, signed=False).astype(np.uint32)
        np.testing.assert_equal(got_bits, model.x.view(np.uint32))
    for _ in range(4):
        await RisingEdge(dut.clk)
    assert int(dut.saturated.value) == sat
    assert sat > 0
