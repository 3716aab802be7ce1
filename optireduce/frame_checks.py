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


# Admission (docs/security.md): the transports' rule, and the gateware parser's with its
# peer table on. Not in ubt.DROP_REASONS: the NIC model sees only admitted datagrams.
ADMISSION_REASONS = ("not_member", "wrong_sender")
Peer = tuple[int, int]  # (IPv4 address as an integer, UDP port)
_L2_L4 = ubt.DROP_REASONS[: ubt.DROP_CODE["bad_udp_length"] + 1]


def default_peers(p: NicParams, world: int,
                  addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING) -> list[Peer]:  # fmt: skip
    """The peers table of a job on `addressing`: rank r at its IP and the job's port."""
    return [(int.from_bytes(addressing.ip(r), "big"), p.udp_port) for r in range(world)]


def admit(frame: bytes, parsed: ubt.ParsedFrame | str, peers: list[Peer]) -> str | None:
    """Admission of a frame whose L2-L4 checks passed (`parsed`: ubt.parse_frame's answer;
    None when they failed, which then names the drop): its source (IP, port) must be a
    peer's (`not_member`), and the rank its UBT header names, if the datagram is long
    enough to name one, a rank at that source (`wrong_sender`), as host/transport.py
    admits datagrams (where every rank has its own address)."""
    if isinstance(parsed, str) and parsed != "truncated" and parsed in _L2_L4:
        return None
    n = len(frame)
    if n < ubt.L2_L4_LEN:
        return None
    ip_len = int.from_bytes(frame[ubt.ETH_LEN + 2 : ubt.ETH_LEN + 4], "big")
    if ip_len < ubt.IP_LEN + ubt.UDP_LEN or ubt.ETH_LEN + ip_len > n:
        return None  # truncated at L2-L4
    src = (int.from_bytes(frame[26:30], "big"), int.from_bytes(frame[34:36], "big"))
    if src not in peers:
        return "not_member"
    datagram = frame[ubt.L2_L4_LEN : ubt.ETH_LEN + ip_len]
    sender = int.from_bytes(datagram[6:8], "big") if len(datagram) >= 8 else None
    if sender is not None and not (sender < len(peers) and peers[sender] == src):
        return "wrong_sender"
    return None


def classify(
    frame: bytes, p: NicParams, rank: int, world: int, base: int,
    addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING, peers: list[Peer] | None = None,
) -> ubt.ParsedFrame | str:  # fmt: skip
    """Everything the parser decides about one frame: the parsed frame or a drop reason.
    peers: the admission table (None: admission off)."""
    r = ubt.parse_frame(frame, port=p.udp_port, rank=rank, addressing=addressing,
                        inband=p.exp_inband)  # fmt: skip
    if peers is not None and (a := admit(frame, r, peers)):
        return a
    if isinstance(r, str):
        return r
    return check_peer(r.header, p, rank, world) or check_op(r.header, p, rank, world, base) or r
