"""cocotb bench of the Quantizer (through AxisWrapper) against host/model/quantize.py `quantize`.

Each op is one AXI-Stream frame of float32 bit patterns (tuser marks the first beat); the
exponent port is set before the frame and the whole padded output frame is awaited before
the next op. Random idle on the source and backpressure on the sink.
"""

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from optireduce.host.model.quantize import quantize
from optireduce.params import NicParams
from optireduce.sim.axis_tb import AxisTB, pack, unpack
from optireduce.sim.cocotb_run import bench_config


@cocotb.test()
async def quantizer_ops_with_idle_and_backpressure(dut):
    cfg = bench_config()
    p = NicParams(**cfg["params"])
    tb = AxisTB(dut, seed=4, idle=0.3, backpressure=0.3)
    await tb.reset(exponent=0, clear=0)
    sat = nf = 0
    for op in cfg["ops"]:
        bits = np.array(op["bits"], dtype=np.int64)
        e = op["exponent"]
        model = quantize(bits.astype(np.uint32).view(np.float32), e, p)
        want = np.zeros(p.padded_len(len(bits)), dtype=np.int64)
        want[: len(bits)] = model.q
        sat, nf = sat + model.saturated, nf + model.nonfinite
        dut.exponent.value = e
        got = await tb.op(pack(bits, 32, p.lanes))
        np.testing.assert_equal(unpack(got.tdata, p.w_in, p.lanes), want)
    for _ in range(4):
        await RisingEdge(dut.clk)
    assert (int(dut.saturated.value), int(dut.nonfinite.value)) == (sat, nf)
    assert sat > 0 and nf > 0
