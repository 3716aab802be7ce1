"""In-band exponents live on loopback, one NIC the co-simulated RTL, the others the model."""

from __future__ import annotations

import multiprocessing as mp
import queue

import numpy as np
import pytest

from optireduce import simulate_allreduce
from optireduce.experiments.bench_cosim import LIVE_PARAMS, inputs
from optireduce.host.model.quantize import propose_exponent
from optireduce.host.transport import UdpTransport
from optireduce.sim.cosim_build import harness_path

# ops 0 and 1 take the hosts' exchange, ops 2..5 the exponent agreed in-band
INBAND_LIVE = LIVE_PARAMS.replace(exp_inband=True, exp_lead=2)
SIM_RANK = 1


def _worker(rank, xs, transports, results, ready) -> None:
    from optireduce.host.driver import select_nic

    for r, t in enumerate(transports):
        if r != rank:
            t.sock.close()  # the fork's copies of the other ranks' sockets
    p, x = INBAND_LIVE, xs[rank]

    def agree(proposals: list[int]) -> list[int]:
        """The reliable exchange of one call's first ops: the max over the ranks."""
        return [max(propose_exponent(y[k * p.c : (k + 1) * p.c], p) for y in xs)
                for k in range(len(proposals))]  # fmt: skip

    prefer = ("sim",) if rank == SIM_RANK else ("software",)
    nic = select_nic(p, rank, len(xs), transport=transports[rank], agree=agree, prefer=prefer)
    try:
        # every NIC up before any op starts, as the DDP hook waits (a barrier after building
        # the NIC): the harness's start on a loaded machine took longer than t_B (5 s),
        # and the others' first ops ended at their deadline without its data
        ready.wait(timeout=240)
        out, stats = nic.allreduce(x)
        counters = nic.counters() if nic.backend == "sim" else {}
        results.put((rank, out, [s.to_dict() for s in stats], nic.backend, counters))
    finally:
        nic.close()


# the harness's first Verilator build takes 1-6 min, more beside the rest of the suite
@pytest.mark.timeout(1500)
def test_mixed_inband_cluster_is_bit_identical_to_the_model():
    harness_path(INBAND_LIVE)  # build before the workers fork (cached under build/cosim/)
    world, n, seed = 3, 1500, 5  # 6 ops of at most c = 256, the last one partial
    xs = inputs(world, n, seed)
    for r, x in enumerate(xs):  # the largest value moves between ranks from op to op
        x *= np.repeat(2.0 ** ((np.arange(6) + r) % 3), 256)[:n].astype(np.float32)
    transports = [UdpTransport(r) for r in range(world)]
    ctx = mp.get_context("fork")
    results, procs, got, ready = ctx.Queue(), [], {}, ctx.Barrier(world)
    try:
        for t in transports:
            t.connect([u.address for u in transports])
        for r in range(world):
            procs.append(ctx.Process(target=_worker, args=(r, xs, transports, results, ready)))
            procs[-1].start()
        while len(got) < world:
            try:
                item = results.get(timeout=240)
            except queue.Empty:
                pytest.fail(f"{len(got)}/{world} ranks done; exit codes "
                            f"{[q.exitcode for q in procs]}")  # fmt: skip
            got[item[0]] = item
    finally:
        for q in procs:
            q.join(timeout=30)
            if q.is_alive():
                q.kill()
        for t in transports:
            t.sock.close()
    assert [got[r][3] for r in range(world)] == ["software", "sim", "software"]
    want, _ = simulate_allreduce(xs, params=INBAND_LIVE, calibrate=False)
    for r in range(world):
        np.testing.assert_array_equal(got[r][1].view(np.uint32), want[r].view(np.uint32))
    exps = [[s["exponent"] for s in got[r][2]] for r in range(world)]
    assert exps[0] == exps[1] == exps[2] and len(set(exps[0])) > 1  # agreed, and moving
    for r in range(world):
        assert all(s["lost_phase1"] == s["lost_phase2"] == 0 for s in got[r][2])
    c = got[SIM_RANK][4]  # the RTL's register bank: 2 ops given, 4 agreed in-band
    assert (c["exp_given"], c["exp_inband"], c["exp_incomplete"], c["exp_followed"]) == (2, 4, 0, 0)
