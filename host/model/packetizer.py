"""Which packet goes where, in what order, with which flags: the packetizer's model.

Phase 1: the encoded chunk streams out in index order; packet i goes to its
owner i mod N (own packets stay home). Phase 2: the owner sends each reduced
packet, slot by slot, to every other rank in rank order. In both, the last
max(1, ceil(n * last_percent / 100)) packets to each destination carry LAST.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from optireduce import ubt
from optireduce.host.model.deadline import flagged_count
from optireduce.params import NicParams


@dataclass(frozen=True)
class OpContext:
    """The header fields a NIC stamps on an op's packets."""

    p: NicParams
    rank: int
    world: int
    op_id: int
    exponent: int
    op_len: int
    addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING
    reserved: int = 0  # with NicParams.exp_inband: the proposal word for op_id + K
    nonfinite: bool = False  # FLAG_NONFINITE on every frame: the op's result is NaN

    def header(self, msg_type: int, pkt_index: int, contributors: int, last: bool,
               t_c_us: int) -> ubt.UbtHeader:  # fmt: skip
        return ubt.UbtHeader(
            version=ubt.VERSION,
            msg_type=msg_type,
            flags=(ubt.FLAG_LAST if last else 0) | (ubt.FLAG_NONFINITE if self.nonfinite else 0),
            exponent=self.exponent,
            job_id=self.p.job_id,
            sender=self.rank,
            op_id=self.op_id,
            pkt_index=pkt_index,
            count=self.p.p,
            contributors=contributors,
            t_c_us=t_c_us,
            op_len=self.op_len,
            world=self.world,
            reserved=self.reserved,
        )

    def frame(self, h: ubt.UbtHeader, dst: int, values: np.ndarray) -> bytes:
        return ubt.build_frame(
            h, ubt.payload_bytes(values), src=self.rank, dst=dst, port=self.p.udp_port,
            addressing=self.addressing,
        )  # fmt: skip


def scatter_order(n_packets: int, world: int, rank: int, last_percent: int
                  ) -> Iterator[tuple[int, int, bool]]:  # fmt: skip
    """(packet index, destination, LAST) for phase 1, in send order."""
    per_dst = [len(range(d, n_packets, world)) for d in range(world)]
    nflag = [flagged_count(c, last_percent) for c in per_dst]
    for i in range(n_packets):
        dst = i % world
        if dst != rank:
            yield i, dst, i // world >= per_dst[dst] - nflag[dst]


def gather_order(slots: np.ndarray, world: int, rank: int, last_percent: int
                 ) -> Iterator[tuple[int, int, int, bool]]:  # fmt: skip
    """(slot row, packet index, destination, LAST) for phase 2, in send order."""
    nflag = flagged_count(len(slots), last_percent)
    for row, i in enumerate(slots):
        for dst in range(world):
            if dst != rank:
                yield row, int(i), dst, row >= len(slots) - nflag


def scatter_frames(packets: np.ndarray, ctx: OpContext, t_c_us: int
                   ) -> list[tuple[int, int, bytes]]:  # fmt: skip
    """Phase-1 frames of an encoded chunk (packets: n_packets x P): (index, dst, frame)."""
    out = []
    for i, dst, last in scatter_order(len(packets), ctx.world, ctx.rank, ctx.p.last_percent):
        h = ctx.header(ubt.MSG_SCATTER, i, 0, last, t_c_us)
        out.append((i, dst, ctx.frame(h, dst, packets[i])))
    return out


def gather_frames(slots: np.ndarray, means: np.ndarray, counts: np.ndarray, ctx: OpContext,
                  t_c_us: int) -> list[tuple[int, int, bytes]]:  # fmt: skip
    """Phase-2 frames of the owner's reduced slots: (index, dst, frame)."""
    out = []
    for row, i, dst, last in gather_order(slots, ctx.world, ctx.rank, ctx.p.last_percent):
        h = ctx.header(ubt.MSG_GATHER, i, int(counts[row]), last, t_c_us)
        out.append((i, dst, ctx.frame(h, dst, means[row])))
    return out
