"""Host-port frames: commands into the NIC and results out of it, as Ethernet frames.

Everything the host and the NIC exchange can then sit in one pcap next to the
network frames, so one file holds a whole scenario (docs/protocol.md, "Host port").
EtherType 0x88B5 (IEEE local experimental), then a 20-byte header, network order:

    0 u8 version (1)   1 u8 kind   2 u16 count   4 u32 op_id   8 u32 offset
    12 u32 n           16 i8 exponent   17 u8 flags   18 u16 proposal

flags bit 0 (START, NicParams.exp_inband): the op takes the NIC's in-band exponent, not
`exponent`; proposal (START): this rank's proposal word for op op_id + lead
(ubt.proposal_word; 0 says none). Both zero in every other frame.

kinds: CONFIG (JSON: params, rank, world), START (first fragment of an op's float32
chunk, n elements in all), DATA (a further fragment), RESULT (a fragment of the
op's float32 result), STATS (the op's statistics record: STATS_FIELDS, then the
contributor histogram, 32-bit words). Fragments carry at most FRAGMENT elements
(8 KiB of payload: a jumbo frame).

The NIC core's host port carries the same things as stream words (docs/nic_core.md):
the STATS record is defined here once, for the model, the RTL and the board.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from optireduce.op_stats import COMPLETE, DEADLINE, EARLY, OpStats
from optireduce.params import NicParams

ETHERTYPE = 0x88B5
VERSION = 1
HEADER = struct.Struct("!BBHIIIbBH")
HEADER_FIELDS = (
    "version", "kind", "count", "op_id", "offset", "n", "exponent", "flags", "proposal",
)  # fmt: skip
FLAG_INBAND = 0x01  # START: the exponent is the NIC's in-band agreed value
CONFIG, START, DATA, RESULT, STATS, REG = 0, 1, 2, 3, 4, 5
KINDS = {CONFIG: "config", START: "start", DATA: "data", RESULT: "result", STATS: "stats",
         REG: "reg"}  # fmt: skip
WORD_KINDS = (START, DATA, RESULT, STATS, REG)  # payload of 32-bit words, `count` of them
FRAGMENT = 2048
HEAD = 14 + HEADER.size  # Ethernet header + host-port header: 34 bytes
ETH_MIN = 60  # an Ethernet frame's least length without its FCS: shorter ones are padded
MIN_WORDS = 7  # the fewest words whose frame needs no padding (HEAD + 4 * 7 >= ETH_MIN)
# The host adapter's frame counters (hw/host_adapter.py), in its register block's order
ADAPTER_COUNTER_DOC = {
    "rx_frames": "host frames taken (START, DATA, REG)",
    "tx_frames": "host frames sent (RESULT, STATS, REG replies)",
    "drop_not_host": "host frames dropped: not EtherType 0x88B5, or under 34 bytes",
    "drop_bad_header": "host frames dropped: version or kind unknown",
    "drop_bad_length": "host frames dropped: length not the count's (padding aside), odd REG count",
    "drop_too_long": "host frames dropped: more words than the frame buffer holds",
    "drop_bad_op": "host frames dropped: START with n outside 1..C, offset != 0 or count > n",
    "drop_sequence": "host frames dropped: not the next op id, or not the open op's next words",
    "drop_unsupported": "host frames dropped: CONFIG, RESULT or STATS sent to the NIC",
    "truncated_ops": "ops padded with zeros: a START came before their last words",
    "bad_records": "results dropped: their STATS record did not fit",
}
ADAPTER_COUNTERS = tuple(ADAPTER_COUNTER_DOC)
HOST_MAC = bytes.fromhex("024f52ffffff")
NIC_MAC = bytes.fromhex("024f52fffffe")


@dataclass(frozen=True)
class HostFrame:
    kind: int
    op_id: int = 0
    offset: int = 0
    n: int = 0
    exponent: int = 0
    payload: bytes = b""
    flags: int = 0  # FLAG_INBAND
    proposal: int = 0  # START: the proposal word for op op_id + lead

    @property
    def count(self) -> int:
        return len(self.payload) // 4 if self.kind in WORD_KINDS else 0


def build(f: HostFrame, *, to_nic: bool) -> bytes:
    dst, src = (NIC_MAC, HOST_MAC) if to_nic else (HOST_MAC, NIC_MAC)
    head = HEADER.pack(VERSION, f.kind, f.count, f.op_id, f.offset, f.n, f.exponent, f.flags,
                       f.proposal)  # fmt: skip
    return dst + src + struct.pack("!H", ETHERTYPE) + head + f.payload


def is_host_frame(frame: bytes) -> bool:
    return len(frame) >= 14 and frame[12:14] == b"\x88\xb5"


def parse(frame: bytes) -> HostFrame:
    """A host frame, or ValueError saying what is wrong with it."""
    if not is_host_frame(frame) or len(frame) < 14 + HEADER.size:
        raise ValueError("not a host-port frame (EtherType 0x88B5, 20-byte header)")
    version, kind, count, op_id, offset, n, exponent, flags, proposal = HEADER.unpack_from(
        frame, 14
    )
    if version != VERSION or kind not in KINDS:
        raise ValueError(f"host frame: version {version}, kind {kind} unknown")
    payload = frame[14 + HEADER.size :]
    if kind in WORD_KINDS and len(payload) != 4 * count:
        raise ValueError(f"host frame: {len(payload)} payload bytes for {count} words")
    return HostFrame(kind, op_id, offset, n, exponent, payload, flags, proposal)


def config_frame(
    p: NicParams, rank: int, world: int, peers: list[tuple[int, int]] | None = None
) -> bytes:
    """CONFIG: the NIC's parameters and place; `peers` ((IPv4, port) by rank) turns
    admission on (frame_checks.admit)."""
    cfg = {"params": p.__dict__, "rank": rank, "world": world}
    if peers is not None:
        cfg["peers"] = [list(x) for x in peers]
    return build(HostFrame(CONFIG, payload=json.dumps(cfg).encode()), to_nic=True)


def chunk_frames(
    kind: int,
    op_id: int,
    data: np.ndarray,
    exponent: int | None,
    proposal: int = 0,
    fragment: int = FRAGMENT,
) -> list[bytes]:
    """An op's float32 chunk (START then DATA) or result (RESULT), in fragments of at most
    `fragment` elements. A START with exponent None takes the NIC's in-band exponent;
    `proposal` is its proposal word."""
    data = np.asarray(data, dtype=">f4")
    flags = FLAG_INBAND if exponent is None else 0
    offs = list(range(0, max(1, len(data)), fragment))
    out = []
    for off, end in zip(offs, [*offs[1:], len(data)], strict=True):
        k = kind if kind == RESULT or off == 0 else DATA
        head = (flags, proposal) if k == START else (0, 0)
        f = HostFrame(k, op_id, off, len(data), exponent or 0, data[off:end].tobytes(), *head)
        out.append(build(f, to_nic=kind != RESULT))
    return out


def unpad(frame: bytes) -> bytes:
    """A frame without the padding Ethernet adds to frames under ETH_MIN bytes (a word
    kind's length is its header's; anything else is returned as it came)."""
    if len(frame) != ETH_MIN or not is_host_frame(frame):
        return frame
    kind, count = frame[15], int.from_bytes(frame[16:18], "big")
    want = HEAD + 4 * count
    return frame[:want] if kind in WORD_KINDS and want < ETH_MIN else frame


WRITE = 1 << 31  # REG address word: bit 31 set = write


def reg_request(accesses: list[tuple[int, int | None]], tag: int = 0) -> bytes:
    """A REG frame to the NIC: (address, value) writes and (address, None) reads. The NIC
    echoes the header, so `tag` (the op_id field) matches a reply to its request."""
    words = []
    for addr, value in accesses:
        words += [addr | WRITE, value] if value is not None else [addr, 0]
    payload = np.asarray(words, dtype=">u4").tobytes()
    head = HEADER.pack(VERSION, REG, len(words), tag, 0, 0, 0, 0, 0)
    return NIC_MAC + HOST_MAC + struct.pack("!H", ETHERTYPE) + head + payload


def reg_reply(request: bytes, read: dict[int, int]) -> bytes:
    """The NIC's answer to a REG frame, given the registers' values (model of the gateware)."""
    words = np.frombuffer(request[HEAD:], ">u4").tolist()
    for k in range(0, len(words), 2):
        if not words[k] & WRITE:
            words[k + 1] = read.get(words[k], 0)
    eth = HOST_MAC + NIC_MAC + request[12:14]
    return eth + request[14:HEAD] + np.asarray(words, dtype=">u4").tobytes()


def reg_values(reply: HostFrame) -> list[int]:
    """The data words of a REG reply, one per access, in order (writes give back what
    was written)."""
    return np.frombuffer(reply.payload, ">u4")[1::2].tolist()


# The STATS record: one 32-bit word per field, in this order, then world + 1 words of
# the contributor histogram ([0] = reduced packets missing). Ticks are their low
# `tick_bits` bits (NicParams.tick_bits: the NIC's clock wraps); the exponent is
# sign-extended; reasons are REASON_CODES (hw/deadline.py Reason).
STATS_FIELDS = (
    "op_id", "n", "exponent", "start_us", "phase1_end_us", "end_us",
    "phase1_reason", "phase2_reason", "phase1_timeout_us", "phase2_timeout_us",
    "p1_expected", "p1_received", "p2_expected", "p2_received",
    "sat_quantize", "sat_transform", "sat_output", "nonfinite",
    "t_c_phase1_us", "t_c_phase2_us", "world",
)  # fmt: skip
# A NIC core gives an op's results to its host adapter as: the record's first words
# (HEAD_FIELDS, flagged), the results, the whole record. The adapter sends each RESULT
# frame as its words come, and their headers need these fields first.
HEAD_FIELDS = STATS_FIELDS[:3]
TX_FRAGMENT = 256  # words per RESULT frame from a board: 1058 bytes, inside a 1500 MTU


def result_ring_words(n_max: int, tx_fragment: int = TX_FRAGMENT) -> int:
    """The words a board's adapter holds of an op's message (a power of two): a RESULT
    frame being sent and the next one filling, or a whole record."""
    return 1 << (max(2 * tx_fragment, len(STATS_FIELDS) + 1 + n_max) - 1).bit_length()


REASON_CODES = {"": 0, COMPLETE: 1, EARLY: 2, DEADLINE: 3}
_MASK = 0xFFFF_FFFF
TICK_FIELDS = ("start_us", "phase1_end_us", "end_us")


def stats_words(st: OpStats, tick_bits: int = 32) -> list[int]:
    """The STATS record of one op, as the NIC core emits it on its host port (a NIC
    whose clock is `tick_bits` wide)."""
    v = {f: getattr(st, f, None) for f in STATS_FIELDS}
    for f in TICK_FIELDS:
        v[f] = int(v[f]) % (1 << tick_bits)
    v["phase1_reason"] = REASON_CODES[st.phase1_reason]
    v["phase2_reason"] = REASON_CODES[st.phase2_reason]
    v["t_c_phase1_us"], v["t_c_phase2_us"] = st.t_c_us
    words = [int(v[f]) & _MASK for f in STATS_FIELDS]
    hist = list(st.contributor_hist) or [0] * (st.world + 1)
    if len(hist) != st.world + 1:
        raise ValueError(f"stats: histogram of {len(hist)} entries for world {st.world}")
    return words + [int(h) & _MASK for h in hist]


def stats_from_words(words: list[int]) -> dict:
    """A STATS record back to named fields (reasons by name, exponent signed)."""
    nf = len(STATS_FIELDS)
    if len(words) < nf:
        raise ValueError(f"stats: {len(words)} words, the record has at least {nf + 3}")
    d = dict(zip(STATS_FIELDS, (int(w) for w in words[:nf]), strict=True))
    if len(words) != nf + d["world"] + 1:
        raise ValueError(f"stats: {len(words)} words for world {d['world']}")
    names = {c: r for r, c in REASON_CODES.items()}
    for f in ("phase1_reason", "phase2_reason"):
        if d[f] not in names:
            raise ValueError(f"stats: {f} code {d[f]} unknown")
        d[f] = names[d[f]]
    d["exponent"] = d["exponent"] - (1 << 32) if d["exponent"] >> 31 else d["exponent"]
    d["contributor_hist"] = [int(w) for w in words[nf:]]
    return d


def op_stats(d: dict, rank: int, tick_bits: int = 32, near: int | None = None) -> OpStats:
    """OpStats from a decoded STATS record (stats_from_words) of a NIC whose clock is
    `tick_bits` wide: the phase ends are put after the start (an op lasts less than
    2^(tick_bits - 3) ticks, hw/deadline.py "Ticks"), so durations hold across the wrap;
    with `near` (an earlier op's start_us on the host's unwrapped clock) the start is put
    at the tick nearest to it, so successive ops keep one timeline (while they start
    less than 2^(tick_bits - 1) ticks apart)."""
    fields = {k: v for k, v in d.items() if k in OpStats.__dataclass_fields__}
    wrap, start = 1 << tick_bits, d["start_us"]
    if near is not None:
        start = near + (start - near + wrap // 2) % wrap - wrap // 2
        fields["start_us"] = start
    for f in ("phase1_end_us", "end_us"):
        fields[f] = start + (d[f] - start) % wrap
    fields["t_c_us"] = (d["t_c_phase1_us"], d["t_c_phase2_us"])
    return OpStats(rank=rank, **fields)


def stats_frame(words: list[int]) -> bytes:
    """The STATS host frame of a record (stats_words)."""
    d = stats_from_words(words)
    payload = np.asarray(words, dtype=">u4").tobytes()
    f = HostFrame(STATS, d["op_id"], 0, d["n"], d["exponent"], payload)
    return build(f, to_nic=False)


class Chunk(NamedTuple):
    """A whole START chunk: exponent None asks for the NIC's in-band exponent."""

    op_id: int
    exponent: int | None
    data: np.ndarray
    proposal: int = 0  # the proposal word for op op_id + lead (0: none)


class ChunkAssembler:
    """Collects START/DATA fragments; returns a Chunk when a chunk is whole."""

    def __init__(self) -> None:
        self.parts: dict[int, dict] = {}

    def add(self, f: HostFrame) -> Chunk | None:
        if f.kind == START:
            e = None if f.flags & FLAG_INBAND else f.exponent
            self.parts[f.op_id] = {"n": f.n, "e": e, "w": f.proposal,
                                   "buf": np.zeros(f.n, ">f4"), "got": 0}  # fmt: skip
        st = self.parts.get(f.op_id)
        if st is None or f.offset + f.count > st["n"]:
            raise ValueError(f"host frame: fragment of op {f.op_id} outside its chunk")
        st["buf"][f.offset : f.offset + f.count] = np.frombuffer(f.payload, ">f4")
        st["got"] += f.count
        if st["got"] < st["n"]:
            return None
        del self.parts[f.op_id]
        return Chunk(f.op_id, st["e"], st["buf"].astype(np.float32), st["w"])
