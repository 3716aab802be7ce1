"""UBT v1: the one definition of the wire format (docs/protocol.md is its spec).

FIELDS drives the fast struct packer here, the scapy layer (optireduce/ubt_scapy.py),
the Wireshark dissector (optireduce/ubt_lua.py) and the gateware's layout (hw/ubt_layout.py).
Frames are Ethernet / IPv4 / UDP / UBT header / P big-endian int32 elements.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

VERSION = 1
HEADER_LEN = 32
ETH_LEN, IP_LEN, UDP_LEN = 14, 20, 8
L2_L4_LEN = ETH_LEN + IP_LEN + UDP_LEN
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17

MSG_SCATTER = 1
MSG_GATHER = 2
MSG_TYPES = {MSG_SCATTER: "scatter", MSG_GATHER: "gather"}

FLAG_LAST = 0x01  # sender's last-percentile packet of this phase
FLAG_NONFINITE = 0x02  # the op holds a non-finite input: its result is NaN on every rank
FLAGS_KNOWN = FLAG_LAST | FLAG_NONFINITE
FLAG_NAMES = {FLAG_LAST: "LAST", FLAG_NONFINITE: "NONFINITE"}  # dissectors: ubt.flags.<lower>

# Keyed jobs (docs/security.md): every datagram ends in a tag, BLAKE2b keyed with the job's
# key over the datagram's UBT header, which the receiving transport checks and cuts off.
TAG_LEN = 8
KEY_LEN = 32


def header_tag(key: bytes, datagram: bytes | memoryview) -> bytes:
    """The tag of a datagram (without its tag): over its first HEADER_LEN bytes."""
    return hashlib.blake2b(bytes(datagram[:HEADER_LEN]), key=key, digest_size=TAG_LEN).digest()


class Field(NamedTuple):
    name: str
    fmt: str  # struct code, network order
    doc: str


# Order is wire order; every field sits on its natural alignment.
FIELDS: tuple[Field, ...] = (
    Field("version", "B", "protocol version, 1"),
    Field("msg_type", "B", "1 scatter (phase 1), 2 gather (phase 2)"),
    Field(
        "flags",
        "B",
        "bit 0 LAST: one of the sender's last-percentile packets; "
        "bit 1 NONFINITE: the op holds a non-finite input; others zero",
    ),
    Field("exponent", "b", "shared exponent E of the op: value = integer * 2^E"),
    Field("job_id", "H", "job the frame belongs to"),
    Field("sender", "H", "rank of the sender"),
    Field("op_id", "I", "op (chunk) id, increasing per job"),
    Field("pkt_index", "I", "packet index inside the op"),
    Field("count", "H", "elements in the payload (P)"),
    Field("contributors", "H", "gather: contributions in the mean; scatter: 0"),
    Field("t_c_us", "I", "sender's t_C estimate, microseconds"),
    Field("op_len", "I", "elements of the op before padding"),
    Field("world", "H", "world size N"),
    Field("reserved", "H", "zero; with NicParams.exp_inband a proposal word (below)"),
)

# With NicParams.exp_inband the 16-bit `reserved` field carries a proposal (docs/protocol.md).
PROPOSAL_PRESENT = 0x0001


def proposal_word(proposal: int | None) -> int:
    """The `reserved` field that carries `proposal` (an int8), or says there is none."""
    if proposal is None:
        return 0
    if not -128 <= proposal <= 127:
        raise ValueError(f"proposal {proposal} outside int8")
    return ((proposal & 0xFF) << 8) | PROPOSAL_PRESENT


def proposal_word_ok(word: int) -> bool:
    """A well-formed proposal word: none (0), or an int8 with bit 0 set and bits 7..1 zero."""
    return word == 0 or (word & 0xFF) == PROPOSAL_PRESENT


def proposal_of(word: int) -> int | None:
    """The proposal a well-formed word carries, None when it carries none."""
    if not word & PROPOSAL_PRESENT:
        return None
    v = word >> 8
    return v - 256 if v > 127 else v


HEADER = struct.Struct("!" + "".join(f.fmt for f in FIELDS))
assert HEADER.size == HEADER_LEN

_FIELD_BITS = {"B": 8, "b": 8, "H": 16, "I": 32}
FIELD_OFFSETS: dict[str, tuple[int, int]] = {}
_off = 0
for _f in FIELDS:
    FIELD_OFFSETS[_f.name] = (_off, _FIELD_BITS[_f.fmt] // 8)
    assert _off % (_FIELD_BITS[_f.fmt] // 8) == 0, f"{_f.name} misaligned"
    _off += _FIELD_BITS[_f.fmt] // 8


def field_signed(f: Field) -> bool:
    return f.fmt.islower()


def field_bits(f: Field) -> int:
    return _FIELD_BITS[f.fmt]


class UbtHeader(NamedTuple):
    version: int
    msg_type: int
    flags: int
    exponent: int
    job_id: int
    sender: int
    op_id: int
    pkt_index: int
    count: int
    contributors: int
    t_c_us: int
    op_len: int
    world: int
    reserved: int

    def pack(self) -> bytes:
        return HEADER.pack(*self)

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> UbtHeader:
        return cls._make(HEADER.unpack_from(data, offset))


assert UbtHeader._fields == tuple(f.name for f in FIELDS)


# Why a frame was dropped. The order is the counter order of the register bank.
DROP_REASONS: tuple[str, ...] = (
    "truncated",  # shorter than its headers claim
    "not_ipv4",  # EtherType is not IPv4
    "bad_ip_header",  # IP version/IHL other than 4/5 (no options)
    "bad_ip_checksum",
    "ip_fragment",
    "not_udp",
    "wrong_address",  # not our MAC or IP
    "wrong_port",
    "bad_udp_length",
    "bad_version",
    "bad_type",
    "malformed_header",  # reserved bits set, impossible counts, wrong world size
    "wrong_job",
    "unknown_rank",
    "own_rank",
    "bad_length",  # payload length or count not what the op needs
    "stale_op",  # op id below the window
    "future_op",  # op id beyond the window
    "index_out_of_range",
    "wrong_owner",  # packet index not owned by the receiver (scatter) or sender (gather)
    "exponent_mismatch",
    "late",  # the phase it belongs to has ended
    "duplicate",
)
DROP_CODE = {r: i for i, r in enumerate(DROP_REASONS)}


@dataclass(frozen=True)
class Addressing:
    """MAC and IPv4 address of each rank (198.18.0.0/15: benchmarking range, never routed)."""

    mac_base: int = 0x02_4F_52_00_00_00  # locally administered
    ip_base: int = (198 << 24) | (18 << 16)

    def mac(self, rank: int) -> bytes:
        return (self.mac_base + rank).to_bytes(6, "big")

    def ip(self, rank: int) -> bytes:
        return (self.ip_base + rank + 1).to_bytes(4, "big")

    def ip_str(self, rank: int) -> str:
        return ".".join(str(b) for b in self.ip(rank))

    def mac_str(self, rank: int) -> str:
        return ":".join(f"{b:02x}" for b in self.mac(rank))


DEFAULT_ADDRESSING = Addressing()


def ipv4_checksum(header: bytes) -> int:
    """RFC 1071 one's-complement sum of a 20-byte header with its checksum field zero."""
    s = sum(struct.unpack("!10H", header))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def patch_frame(frame: bytes, offset: int, fmt: str, value: int, *, fix_ip: bool = True) -> bytes:
    """`frame` with the big-endian struct field `fmt` at byte `offset` set to `value`; the
    IPv4 header checksum recomputed, or, with fix_ip=False, left as it was (a bad one)."""
    b = bytearray(frame)
    struct.pack_into("!" + fmt, b, offset, value)
    if fix_ip:
        struct.pack_into("!H", b, 24, 0)
        struct.pack_into("!H", b, 24, ipv4_checksum(bytes(b[14:34])))
    return bytes(b)


def payload_bytes(values: np.ndarray) -> bytes:
    """Wire bytes of the payload: big-endian int32."""
    return np.asarray(values).astype(">i4", copy=False).tobytes()


def payload_values(data: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(data, dtype=">i4").astype(np.int64)


def build_frame(
    header: UbtHeader,
    payload: bytes,
    *,
    src: int,
    dst: int,
    port: int,
    addressing: Addressing = DEFAULT_ADDRESSING,
) -> bytes:
    """Ethernet/IPv4/UDP/UBT frame from rank src to rank dst (UDP checksum 0)."""
    udp_len = UDP_LEN + HEADER_LEN + len(payload)
    ip_len = IP_LEN + udp_len
    ip = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45, 0, ip_len, 0, 0x4000, 64, IPPROTO_UDP, 0,
            addressing.ip(src), addressing.ip(dst),
        )
    )  # fmt: skip
    struct.pack_into("!H", ip, 10, ipv4_checksum(bytes(ip)))
    eth = addressing.mac(dst) + addressing.mac(src) + struct.pack("!H", ETHERTYPE_IPV4)
    udp = struct.pack("!HHHH", port, port, udp_len, 0)
    return b"".join((eth, bytes(ip), udp, header.pack(), payload))


class ParsedFrame(NamedTuple):
    header: UbtHeader
    payload: memoryview  # raw big-endian int32 bytes, count * 4 long


def parse_frame(
    frame: bytes,
    *,
    port: int,
    rank: int,
    addressing: Addressing = DEFAULT_ADDRESSING,
    inband: bool = False,
) -> ParsedFrame | str:
    """Check L2-L4 and the UBT header's own consistency.

    Returns the parsed frame, or the drop reason (a name in DROP_REASONS).
    Checks that need op state (job, ranks, window, ownership) are the NIC's.
    inband (NicParams.exp_inband): `reserved` may carry a proposal word.
    """
    n = len(frame)
    if n < L2_L4_LEN:
        return "truncated"
    mv = memoryview(frame)
    if mv[12] != 0x08 or mv[13] != 0x00:
        return "not_ipv4"
    if mv[14] != 0x45:
        return "bad_ip_header"
    ip_hdr = bytes(mv[14 : 14 + IP_LEN])
    if ipv4_checksum(ip_hdr) != 0:  # sum over a header with its checksum is 0xFFFF
        return "bad_ip_checksum"
    ip_len, frag = struct.unpack_from("!H2xH", ip_hdr, 2)
    if ip_len < IP_LEN + UDP_LEN or ETH_LEN + ip_len > n:
        return "truncated"
    if frag & 0x3FFF:
        return "ip_fragment"
    if ip_hdr[9] != IPPROTO_UDP:
        return "not_udp"
    if bytes(mv[0:6]) != addressing.mac(rank) or ip_hdr[16:20] != addressing.ip(rank):
        return "wrong_address"
    _sport, dport, udp_len = struct.unpack_from("!HHH", frame, ETH_LEN + IP_LEN)
    if dport != port:
        return "wrong_port"
    if udp_len != ip_len - IP_LEN:
        return "bad_udp_length"
    return parse_ubt(mv[L2_L4_LEN : ETH_LEN + ip_len], inband=inband)


def parse_ubt(datagram: bytes | memoryview, *, inband: bool = False) -> ParsedFrame | str:
    """Check a UBT datagram (UDP payload) on its own: header and payload length.
    inband (NicParams.exp_inband): `reserved` may carry a proposal word."""
    mv = memoryview(datagram)
    if len(mv) < HEADER_LEN:
        return "truncated"
    h = UbtHeader.unpack(mv)
    if h.version != VERSION:
        return "bad_version"
    if h.msg_type not in MSG_TYPES:
        return "bad_type"
    if h.flags & ~FLAGS_KNOWN:
        return "malformed_header"
    if not (proposal_word_ok(h.reserved) if inband else h.reserved == 0):
        return "malformed_header"
    if (h.msg_type == MSG_SCATTER) != (h.contributors == 0):
        return "malformed_header"
    if h.contributors > h.world or h.t_c_us == 0:  # a t_C is at least one tick
        return "malformed_header"
    if len(mv) != HEADER_LEN + 4 * h.count:
        return "bad_length"
    return ParsedFrame(h, mv[HEADER_LEN:])
