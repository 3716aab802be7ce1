"""cocotb bench of SignFlip (through AxisWrapper) against host/model/signs.py `apply_signs`.

Each op is one AXI-Stream frame (tuser marks the first beat); seed and op_id are set
before the frame and the output frame is awaited before the next op. Random idle on the
source and backpressure on the sink.
"""

import cocotb
import numpy as np

from optireduce.host.model.signs import apply_signs
from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def sign_flip_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    width, lanes = cfg["width"], cfg["lanes"]
    tb = AxisTB(dut, seed=8, idle=0.3, backpressure=0.3)
    dut.seed.value = 0
    dut.op_id.value = 0
    await tb.reset()
    for op in cfg["ops"]:
        v = np.array(op["v"], dtype=np.int64)
        dut.seed.value = op["seed"]
        dut.op_id.value = op["op_id"]
        await tb.send(pack(v, width, lanes), first=True)
        got = await tb.recv()
        np.testing.assert_equal(
            unpack(got.tdata, width, lanes), apply_signs(v, op["seed"], op["op_id"])
        )
