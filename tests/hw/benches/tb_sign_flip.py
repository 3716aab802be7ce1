"""cocotb bench of SignFlip (through AxisWrapper) against host/model/signs.py `apply_signs`.

Each op is one AXI-Stream frame (tuser marks the first beat); seed and op_id are set
before the frame and the output frame is awaited before the next op. Random idle on the
source and backpressure on the sink.
"""

import cocotb
import numpy as np

from optireduce.host.model.signs import apply_signs
from optireduce.sim.axis_tb import AxisTB, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def sign_flip_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    width, lanes = cfg["width"], cfg["lanes"]
    tb = AxisTB(dut, seed=8, idle=0.3, backpressure=0.3)
    await tb.reset(seed=0, op_id=0)
    async for op, v, got in tb.ops(cfg["ops"], width, lanes, ("seed", "op_id")):
        want = apply_signs(v, op["seed"], op["op_id"])
        np.testing.assert_equal(unpack(got, width, lanes), want)
