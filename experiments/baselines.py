"""The baselines OptiReduce is measured against, under the same impairment.

- `reliable_ring_allreduce`: ring AllReduce (reduce-scatter, then allgather: 2(N-1)
  steps) over the reliable message layer, so nothing is lost, only late.
- `reliable_tar_allreduce`: Transpose AllReduce over the same layer: chunk j goes to
  its owner, rank j, which sums it and sends the reduced chunk to every rank
  (2 steps, N-1 messages out per step per rank).
- `gloo_allreduce_mean`: torch's own gloo allreduce, unimpaired: the reference for
  raw speed on this machine.

Both reliable baselines return the mean in float32. Each chunk is summed in one
fixed order, once, by one rank, and the result is copied to the others, so every
rank gets the same bits. Ring: chunk c is summed in the order of ranks c, c+1, ...,
c-1. TAR: chunk j is summed in the order of ranks 0, 1, ..., N-1. Then the sum is
divided by N.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from optireduce.host.reliable import ReliableEndpoint

TAG_RING = 0x52000000  # + step
TAG_TAR_SCATTER = 0x54000001
TAG_TAR_GATHER = 0x54000002


def _bounds(n: int, world: int) -> list[tuple[int, int]]:
    edges = [n * k // world for k in range(world + 1)]
    return list(pairwise(edges))


def _recv_f32(ep: ReliableEndpoint, src: int, tag: int, n: int, timeout: float) -> np.ndarray:
    data = ep.recv(src, tag, timeout)
    if len(data) != 4 * n:
        raise ValueError(
            f"rank {ep.rank}: got {len(data) // 4} elements from rank {src} where {n} were "
            "expected; is every rank reducing an input of the same length?"
        )
    return np.frombuffer(data, dtype=np.float32)


def _check(rank: int, world: int, x: np.ndarray) -> np.ndarray:
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} not in 0..{world - 1}")
    return np.ascontiguousarray(x, dtype=np.float32).ravel()


def reliable_ring_allreduce(
    ep: ReliableEndpoint, rank: int, world: int, x: np.ndarray, *, timeout: float = 60.0
) -> np.ndarray:
    """Mean over the ranks of x (float32), by a ring over reliable messages.

    Each step waits at most `timeout` seconds for its message (TimeoutError)."""
    x = _check(rank, world, x)
    if world == 1:
        return x.copy()
    bounds = _bounds(x.size, world)
    acc = x.copy()  # chunk c of acc: the running sum of that chunk
    right, left = (rank + 1) % world, (rank - 1) % world
    # Reduce-scatter: at step s, send chunk rank-s, receive chunk rank-s-1 and add ours to it.
    for s in range(world - 1):
        a, b = bounds[(rank - s) % world]
        ep.send(right, TAG_RING + s, acc[a:b])
        c = (rank - s - 1) % world
        a, b = bounds[c]
        got = _recv_f32(ep, left, TAG_RING + s, b - a, timeout)
        np.add(got, acc[a:b], out=acc[a:b])  # sum so far (ranks c..left) + ours
    # Now chunk rank+1 is complete here. Allgather: pass complete chunks round the ring.
    own = (rank + 1) % world
    a, b = bounds[own]
    acc[a:b] /= np.float32(world)
    for s in range(world - 1):
        a, b = bounds[(own - s) % world]
        ep.send(right, TAG_RING + world + s, acc[a:b])
        a, b = bounds[(own - s - 1) % world]
        acc[a:b] = _recv_f32(ep, left, TAG_RING + world + s, b - a, timeout)
    return acc


def reliable_tar_allreduce(
    ep: ReliableEndpoint, rank: int, world: int, x: np.ndarray, *, timeout: float = 60.0
) -> np.ndarray:
    """Mean over the ranks of x (float32), by Transpose AllReduce over reliable messages.

    Each message is awaited at most `timeout` seconds (TimeoutError)."""
    x = _check(rank, world, x)
    if world == 1:
        return x.copy()
    bounds = _bounds(x.size, world)
    for j in range(world):  # scatter: chunk j to its owner
        if j != rank:
            a, b = bounds[j]
            ep.send(j, TAG_TAR_SCATTER, x[a:b])
    a, b = bounds[rank]
    parts = [
        x[a:b] if r == rank else _recv_f32(ep, r, TAG_TAR_SCATTER, b - a, timeout)
        for r in range(world)
    ]
    mine = parts[0].copy()
    for p in parts[1:]:  # rank order, float32
        mine += p
    mine /= np.float32(world)
    for j in range(world):  # gather: the reduced chunk to every rank
        if j != rank:
            ep.send(j, TAG_TAR_GATHER, mine)
    out = np.empty_like(x)
    out[a:b] = mine
    for j in range(world):
        if j != rank:
            a, b = bounds[j]
            out[a:b] = _recv_f32(ep, j, TAG_TAR_GATHER, b - a, timeout)
    return out


def gloo_allreduce_mean(tensor, group=None, in_place: bool = False):
    """torch.distributed.all_reduce(SUM) / world on a copy of `tensor` (the input is kept),
    or, in_place, on `tensor` itself (as DDP reduces a bucket)."""
    import torch.distributed as dist

    out = tensor if in_place else tensor.detach().clone()
    dist.all_reduce(out, group=group)
    out /= dist.get_world_size(group)
    return out
