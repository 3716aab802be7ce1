"""Receiver checks of a parsed UBT header against the NIC's configuration and window.

Stateless given (rank, world, window base): the gateware parser does them on the
header alone. Checks that need per-op state (exponent, late, duplicate) are the
aggregator's and the gather buffer's. Order and names: docs/protocol.md.
"""

from __future__ import annotations

from optireduce import ubt
from optireduce.params import NicParams


def check_peer(h: ubt.UbtHeader, p: NicParams, rank: int, world: int) -> str | None:
    """Is this a frame of our job from a known peer? None, or the drop reason."""
    if h.job_id != p.job_id:
        return "wrong_job"
    if h.sender >= world:
        return "unknown_rank"
    if h.sender == rank:
        return "own_rank"
    if h.world != world:
        return "malformed_header"
    return None


def check_op(h: ubt.UbtHeader, p: NicParams, rank: int, world: int, base: int) -> str | None:
    """Does it fit the op window and the op's packet layout? None, or the drop reason."""
    if h.count != p.p or not 1 <= h.op_len <= p.c:
        return "bad_length"
    if h.op_id < base:
        return "stale_op"
    if h.op_id >= base + p.rx_window:
        return "future_op"
    if h.pkt_index >= p.packets_for(h.op_len):
        return "index_out_of_range"
    owner = h.pkt_index % world
    if owner != (rank if h.msg_type == ubt.MSG_SCATTER else h.sender):
        return "wrong_owner"
    return None


def classify(
    frame: bytes, p: NicParams, rank: int, world: int, base: int,
    addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
) -> ubt.ParsedFrame | str:  # fmt: skip
    """Everything the parser decides about one frame: the parsed frame or a drop reason."""
    r = ubt.parse_frame(frame, port=p.udp_port, rank=rank, addressing=addressing,
                        inband=p.exp_inband)  # fmt: skip
    if isinstance(r, str):
        return r
    return check_peer(r.header, p, rank, world) or check_op(r.header, p, rank, world, base) or r
