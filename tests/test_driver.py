"""The driver's op loop (HostNic._allreduce), shared by every backend, on a scripted one:
chunks of at most C, K ops in flight, results in op order whatever order they come in,
one exponent agreement per call, the 2 t_B + 1 s per op bound."""

from __future__ import annotations

import time

import numpy as np
import pytest

from optireduce.host.driver import HostNic
from optireduce.host.model.nic_model import OpResult
from optireduce.host.model.quantize import propose_exponent
from optireduce.op_stats import OpStats
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=256, ops_in_flight=3, t_b_us=1000)


class ScriptedNic(HostNic):
    """Each op's result is its chunk + op id; the two newest pending ops come back
    newest first, so results arrive out of order."""

    backend = "scripted"

    def _open(self) -> None:
        self.pending: list[tuple[int, np.ndarray, int]] = []
        self.started: list[tuple[int, int, int]] = []  # (op id, length, exponent)
        self.in_flight_max = 0
        self.stall = False

    def _room(self, op_id: int, done: int) -> bool:
        return op_id < done + self.p.ops_in_flight

    def _start(
        self, op_id: int, chunk: np.ndarray, exponent: int | None, ahead: int | None
    ) -> None:
        self.pending.append((op_id, chunk.copy(), exponent))
        self.started.append((op_id, len(chunk), exponent))
        self.in_flight_max = max(self.in_flight_max, len(self.pending))

    def _poll(self, deadline: float) -> list[OpResult]:
        if self.stall == "raise":
            raise TimeoutError("scripted: nothing")
        if self.stall:
            return []
        out = []
        for _ in range(min(2, len(self.pending))):
            op_id, chunk, exp = self.pending.pop()
            st = OpStats(op_id=op_id, rank=self.rank, world=self.world, n=len(chunk), exponent=exp)
            out.append(OpResult(op_id, chunk + np.float32(op_id), st))
        return out


def agree_calls() -> tuple[list[list[int]], object]:
    calls: list[list[int]] = []

    def agree(proposals: list[int]) -> list[int]:
        calls.append(list(proposals))
        return [e + 1 for e in proposals]  # another rank proposed one more

    return calls, agree


def test_chunks_in_flight_and_results_in_op_order():
    calls, agree = agree_calls()
    nic = ScriptedNic(P, 0, 2, transport=None, agree=agree)
    x = np.arange(700, dtype=np.float32) / 7
    out, stats = nic.allreduce(x)
    # 700 elements: chunks of 256, 256, 188, op ids 0, 1, 2
    want_exps = [propose_exponent(x[a:b], P) for a, b in ((0, 256), (256, 512), (512, 700))]
    assert calls == [want_exps]
    assert nic.started == [(0, 256, want_exps[0] + 1), (1, 256, want_exps[1] + 1),
                           (2, 188, want_exps[2] + 1)]  # fmt: skip
    assert nic.in_flight_max == 3
    want = np.concatenate([x[:256], x[256:512] + 1, x[512:] + 2])
    np.testing.assert_array_equal(out, want)
    assert [s.op_id for s in stats] == [0, 1, 2]
    # the next call goes on from op 3, with the same shape back for any input shape
    out2, stats2 = nic.allreduce(x[:500].reshape(20, 25))
    assert out2.shape == (20, 25) and [s.op_id for s in stats2] == [3, 4]
    np.testing.assert_array_equal(out2.ravel(), np.concatenate([x[:256] + 3, x[256:500] + 4]))


def test_k_bounds_the_ops_in_flight():
    nic = ScriptedNic(P.replace(ops_in_flight=2), 1, 3, transport=None, agree=agree_calls()[1])
    nic.allreduce(np.ones(10 * 256, dtype=np.float32))
    assert nic.in_flight_max == 2 and [s[0] for s in nic.started] == list(range(10))


def test_empty_input_and_a_silent_backend_are_errors():
    nic = ScriptedNic(P, 0, 2, transport=None, agree=agree_calls()[1])
    with pytest.raises(ValueError, match="empty"):
        nic.allreduce(np.zeros(0, dtype=np.float32))
    nic.stall = "raise"  # the backend's own wait ran out (the sim NIC's pipe)
    with pytest.raises(TimeoutError, match=r"scripted rank 0 got 0/2 ops by the bound"):
        nic.allreduce(np.ones(300, dtype=np.float32))
    nic.stall, nic.wait_slack_s = "empty", 0.0  # polls that return nothing, forever
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"scripted rank 0 got 0/1 ops by the bound"):
        nic.allreduce(np.ones(100, dtype=np.float32))
    assert 1.002 <= time.monotonic() - t0 < 3  # 2 t_B + 1 s for the one op


def test_world_one_is_the_local_nic_and_returns_its_input():
    import torch

    from optireduce.host.driver import select_nic
    from optireduce.host.transport import UdpTransport

    tr = UdpTransport(0)
    tr.connect([tr.address])
    nic = select_nic(NicParams(), 0, 1, transport=tr, agree=lambda v: v)
    try:
        assert nic.backend == "local"
        x = np.random.default_rng(3).standard_normal(40_000).astype(np.float32)
        out, stats = nic.allreduce(x)
        assert out is not x
        np.testing.assert_array_equal(out, x)  # the mean of one input is that input
        assert [s.n for s in stats] == [16_384, 16_384, 7_232]
        assert [s.op_id for s in stats] == [0, 1, 2]
        t, st = nic.allreduce(torch.arange(6.0).view(2, 3))
        assert isinstance(t, torch.Tensor) and t.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert st[0].op_id == 3 and st[0].lost_phase1 == st[0].lost_phase2 == 0
        assert nic.counters()["tx_datagrams"] == 0  # nothing went on the network
        with pytest.raises(ValueError, match="world 1"):
            nic.exclude(1)
    finally:
        nic.close()
