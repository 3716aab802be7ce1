"""The shared gateware harnesses on a toy block: amaranth.sim streams, cocotb+Verilator, yosys."""

import numpy as np
import pytest

from optireduce.experiments.area import ecp5_area
from optireduce.hw.axis import AxisWrapper
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, run_stream
from tests.hw.infra_blocks import Negate


@pytest.mark.parametrize(("idle", "bp"), [(0.0, 0.0), (0.4, 0.4)])
def test_stream_harness_counts_and_orders(idle, bp):
    rng = np.random.default_rng(0)
    vals = rng.integers(-1000, 1000, (50, 2))
    pl = [element_payload(v, k == 0, k == 49) for k, v in enumerate(vals)]
    run = run_stream(Negate(), pl, 50, idle=idle, backpressure=bp, seed=3)
    np.testing.assert_array_equal([o[0] for o in run.outputs], -vals)
    assert [o[1] for o in run.outputs] == [1] + [0] * 49
    assert [o[2] for o in run.outputs] == [0] * 49 + [1]
    if not idle and not bp:
        assert run.latency == Negate.LATENCY and run.cycles_per_beat() == 1.0


def test_cocotb_verilator_axis_shell():
    run_bench(AxisWrapper(Negate(20, 2)), "negate_top", f"{__package__}.benches.tb_negate",
              {"width": 20, "lanes": 2})  # fmt: skip


def test_ecp5_area_counts_cells():
    small, big = ecp5_area(Negate(8, 1), "neg8"), ecp5_area(Negate(24, 4), "neg24x4")
    assert 0 < small["luts"] < big["luts"]
    assert big["ffs"] >= 24 * 4 + 3 and big["brams"] == 0
