"""The reliable message layer and the baselines on it: ring and TAR AllReduce.

Float32 tolerance against the float64 mean: elementwise |out - mean| <= 2 N eps32 mean_r |x_r|,
the textbook bound for a float32 sum of N terms in any order followed by one division
by N (eps32 = 2^-23). Beyond that, each baseline must give exactly the float32 sum in
the order its module documents, and the same bits on every rank.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from optireduce.experiments.baselines import (
    _bounds,
    reliable_ring_allreduce,
    reliable_tar_allreduce,
)
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.reliable import HEADER, MAX_DATAGRAM, ReliableEndpoint
from optireduce.host.transport import UdpTransport
from tests.live_workers import join_world, live_inputs, spawn_world

EPS32 = float(np.finfo(np.float32).eps)


def pair(spec: ImpairmentSpec | None, seed: int = 0) -> tuple[UdpTransport, UdpTransport]:
    a = UdpTransport(0, impairment=spec, seed=seed)
    b = UdpTransport(1, impairment=spec, seed=seed + 1)
    for t in (a, b):
        t.connect([a.address, b.address])
    return a, b


def test_reliable_messages_arrive_intact_under_loss_duplication_and_reordering():
    spec = ImpairmentSpec(median_us=200, p99_ratio=2.0, loss=0.1, duplicate=0.1, reorder=0.1)
    rng = np.random.default_rng(1)
    payload = MAX_DATAGRAM - HEADER.size
    sizes = [0, 1, 1000, payload, payload + 1, 5 * payload - 3, 300_000, 1_000_000] * 2
    msgs = {
        0: [(t % 3, rng.bytes(n)) for t, n in enumerate(sizes)],
        1: [(7, rng.bytes(n)) for n in (17, 70_000, 0, 9, 600_000)],  # one tag: order must hold
    }
    ta, tb = pair(spec, seed=10)
    eps = [ReliableEndpoint(ta), ReliableEndpoint(tb)]
    got: dict[int, list[bytes]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def run(me: int) -> None:
        ep, other = eps[me], 1 - me
        try:
            for tag, data in msgs[me]:
                ep.send(other, tag, data)
            for tag, _ in msgs[other]:
                got[me].append(ep.recv(other, tag, timeout=20))
            ep.settle(timeout=20, quiet_s=0.3)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    ta.close()
    tb.close()
    assert not errors, errors
    assert got[1] == [d for _, d in msgs[0]]
    assert got[0] == [d for _, d in msgs[1]]
    assert sum(ep.retransmissions for ep in eps) > 0
    assert sum(ep.duplicates for ep in eps) > 0
    assert ta.impairment.lost + tb.impairment.lost > 0
    for ep in eps:
        assert ep.pending() == 0
        # round trips of ~2 x 200 us delays plus Python: measured, within the floor/ceiling
        assert ep.srtt is not None and 2e-4 < ep.srtt < 0.5
        assert ep.cfg.rto_min_s <= ep.rto <= ep.cfg.rto_max_s


def test_recv_and_flush_time_out_when_the_peer_never_answers():
    ta, tb = pair(None)  # tb is never pumped: a peer that is gone
    ep = ReliableEndpoint(ta)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="tag 5 from rank 1 and no fragment"):
        ep.recv(1, 5, timeout=0.3)
    ep.send(1, 5, b"x" * 100_000)
    with pytest.raises(TimeoutError, match="unacked fragments"):
        ep.flush(timeout=0.3)
    assert ep.retransmissions > 0  # it kept trying within the bound
    with pytest.raises(TimeoutError, match="from rank 1"):
        reliable_ring_allreduce(ep, 0, 2, np.ones(1000, np.float32), timeout=0.3)
    with pytest.raises(TimeoutError, match="from rank 1"):
        reliable_tar_allreduce(ep, 0, 2, np.ones(1000, np.float32), timeout=0.3)
    assert time.monotonic() - t0 < 5
    ta.close()
    tb.close()


# ---- three processes on loopback ------------------------------------------------------------


def expected_bits(xs: list[np.ndarray], algo: str) -> np.ndarray:
    """The float32 sums in the order baselines.py documents, divided by N."""
    world, n = len(xs), xs[0].size
    out = np.empty(n, np.float32)
    for c, (a, b) in enumerate(_bounds(n, world)):
        order = [(c + k) % world for k in range(world)] if algo == "ring" else range(world)
        acc = np.zeros(b - a, np.float32)
        for k, r in enumerate(order):
            acc = xs[r][a:b].copy() if k == 0 else acc + xs[r][a:b]
        out[a:b] = acc / np.float32(world)
    return out


SIZES = (300_001, 2)  # uneven chunks; and fewer elements than ranks (empty messages)


def baseline_worker(rank: int, world: int, tmp: str, seed: int) -> None:
    store = join_world(rank, world, tmp)
    import torch
    import torch.distributed as dist

    from optireduce.experiments.baselines import gloo_allreduce_mean
    from optireduce.host.transport import transport_from_store

    tr = transport_from_store(store, rank, world, impairment=ImpairmentSpec(loss=0.05),
                              seed=seed * 100 + rank)  # fmt: skip
    ep = ReliableEndpoint(tr)
    for n in SIZES:
        x = live_inputs(world, n, seed)[rank]
        np.save(
            f"{tmp}/ring{n}_{rank}.npy", reliable_ring_allreduce(ep, rank, world, x, timeout=20)
        )
        np.save(f"{tmp}/tar{n}_{rank}.npy", reliable_tar_allreduce(ep, rank, world, x, timeout=20))
    ep.settle(timeout=20, quiet_s=0.3)  # before gloo blocks this rank's pump
    for n in SIZES:
        x = live_inputs(world, n, seed)[rank]
        t = torch.from_numpy(x)
        g = gloo_allreduce_mean(t)
        assert torch.equal(t, torch.from_numpy(x))  # the input is kept
        t2 = torch.from_numpy(x.copy())  # in place, as the bench and DDP reduce a bucket
        assert gloo_allreduce_mean(t2, in_place=True) is t2 and torch.equal(t2, g)
        np.save(f"{tmp}/gloo{n}_{rank}.npy", g.numpy())
    with open(f"{tmp}/rel{rank}.json", "w") as f:
        json.dump({**ep.stats(), "lost": tr.impairment.lost}, f)
    dist.barrier()
    tr.close()
    dist.destroy_process_group()


def test_ring_and_tar_under_loss_are_exact_and_identical_on_every_rank(tmp_path):
    world, seed = 3, 4
    spawn_world(baseline_worker, (world, str(tmp_path), seed), world, 90)
    for n in SIZES:
        xs = live_inputs(world, n, seed)
        ref = np.mean([x.astype(np.float64) for x in xs], axis=0)
        tol = 2 * world * EPS32 * np.mean([np.abs(x.astype(np.float64)) for x in xs], axis=0)
        for algo in ("ring", "tar"):
            outs = [np.load(tmp_path / f"{algo}{n}_{r}.npy") for r in range(world)]
            for o in outs:
                assert o.dtype == np.float32 and o.shape == (n,)
                np.testing.assert_array_equal(o, outs[0])  # the same bits everywhere
                assert np.all(np.abs(o - ref) <= tol)
            np.testing.assert_array_equal(outs[0], expected_bits(xs, algo))
        gloo = np.load(tmp_path / f"gloo{n}_0.npy")
        assert np.all(np.abs(gloo - ref) <= tol)
    stats = [json.loads((tmp_path / f"rel{r}.json").read_text()) for r in range(world)]
    assert sum(s["lost"] for s in stats) > 0  # the loss was real...
    assert sum(s["retransmissions"] for s in stats) > 0  # ...and repaired
