"""`allreduce(x, out=...)` on the Python backends (SoftwareNic, LocalNic): the result
written into `out` (which may be x itself, as the DDP hook passes its bucket) has the
bits of the call without it; a wrong `out` is a TypeError. The native engine's `out` is
tested in tests/native/test_live_native.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optireduce.host.driver import LocalNic, SoftwareNic
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.host.transport import UdpTransport
from optireduce.params import NicParams
from tests.native.test_live_native import ThreadAgreement, inputs, run_all

P = NicParams(p=64, b=256, c=1024, t_b_us=5_000_000, t_c_min_us=5_000_000)
WORLD, N = 3, 2500  # three ops, the last one short


def test_software_nic_writes_the_result_into_out_and_into_x_itself():
    trs = [UdpTransport(r) for r in range(WORLD)]
    for t in trs:
        t.connect([u.address for u in trs])
    agreement = ThreadAgreement(WORLD)
    nics = [SoftwareNic(P, r, WORLD, trs[r], agreement.rank(r)) for r in range(WORLD)]
    xs = inputs(WORLD, N, seed=4)

    def job(r, nic):
        x = xs[r].copy()
        other = np.full(N, np.nan, np.float32)
        got_out, _ = nic.allreduce(x, out=other)  # a numpy out
        tx = torch.from_numpy(xs[r].copy())
        got_self, _ = nic.allreduce(tx, out=tx)  # a tensor, in place
        return x, got_out, other, got_self, tx

    try:
        got = run_all(nics, job)
    finally:
        for t in trs:
            t.close()
    want, _ = simulate_allreduce(xs, params=P, calibrate=False)
    for r, (x, got_out, other, got_self, tx) in enumerate(got):
        np.testing.assert_array_equal(x, xs[r])  # the input untouched
        assert got_out is other and got_self is tx
        np.testing.assert_array_equal(other.view(np.uint32), want[r].view(np.uint32))
        np.testing.assert_array_equal(tx.numpy().view(np.uint32), want[r].view(np.uint32))


def test_local_nic_out_and_a_wrong_out():
    nic = LocalNic(P, 0, UdpTransport(0))
    try:
        x = np.arange(10, dtype=np.float32)
        out = np.zeros(10, np.float32)
        res, _ = nic.allreduce(x, out=out)
        assert res is out and out.tolist() == list(range(10))
        with pytest.raises(TypeError, match="float32 array of x's size"):
            nic.allreduce(x, out=np.zeros(9, np.float32))
        with pytest.raises(TypeError, match="float32"):
            nic.allreduce(x, out=np.zeros(10, np.float64))
    finally:
        nic.transport.close()
