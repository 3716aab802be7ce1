"""Traces: pcap files of timestamped frames on one NIC's host and network ports.

A scenario is what one rank of a small world (rank 0 unless asked) sees: its CONFIG
and START/DATA host frames, and every network frame its peers deliver to it, taken from
a run of the virtual cluster, then disturbed as the scenario says. Replaying it (sim/replay.py)
through the model or the RTL must give the same output frames and counters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from optireduce import host_port, ubt
from optireduce.frame_checks import default_peers
from optireduce.host.model.quantize import propose_exponent
from optireduce.host.model.virtual_cluster import _run
from optireduce.hw.sdram_controller import SdramSpec
from optireduce.params import NicParams

TRACE_PARAMS = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=400, t_c_min_us=50)
WORLD, RANK, OP_LEN, OPS = 3, 0, 256, 3  # three ops of one whole chunk each
# In-band exponents (docs/numerics.md 1): ops 0 and 1 take the host's exponent, ops 2..4
# the agreed one; each rank's chunk is scaled by 2^0..2^3 per op, so the max moves, and
# rank 2's chunk of op 3 by 2^6.
INBAND_PARAMS = TRACE_PARAMS.replace(exp_inband=True, exp_lead=2)
INBAND_OPS = 5
# The 25F's choices (hw/board_colorlight.py; tests/test_cosim_replay.py checks they are
# its) at trace sizes: one op in flight, one FWHT, its narrower clock
SLIM_PARAMS = TRACE_PARAMS.replace(ops_in_flight=1, fwht_shared=True, tick_bits=24)
# ... and its accumulators in the 5A-75B's SDRAM
SDRAM_PARAMS = SLIM_PARAMS.replace(sdram_addr_bits=SdramSpec().addr_bits)

Frame = tuple[int, bytes]  # (tick in microseconds, frame bytes)


def _base(
    seed: int,
    inband: bool = False,
    admit: bool = False,
    params: NicParams | None = None,
    rank: int = RANK,
) -> tuple[list[tuple], list[tuple]]:
    """(host, network) frames of `rank` in a lossless run, as (tick, seq, frame): seq is
    the order things happened in, which breaks ties between frames of the same tick.
    params: the run's (TRACE_PARAMS if None). inband: INBAND_PARAMS, INBAND_OPS ops; a
    START past the first lead ops asks for the in-band exponent, and each carries rank
    0's proposal for op + lead. admit: the CONFIG carries the peers table (admission on)."""
    p, ops = (INBAND_PARAMS, INBAND_OPS) if inband else (params or TRACE_PARAMS, OPS)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(ops * OP_LEN).astype(np.float32) for _ in range(WORLD)]
    if inband:  # rank 2 holds op 3's largest values, the others move between ranks
        for r, x in enumerate(xs):
            scale = 2.0 ** rng.integers(0, 4, ops)
            scale[3] = 2.0**6 if r == 2 else scale[3]
            x *= np.repeat(scale, OP_LEN).astype(np.float32)
    props = [propose_exponent(xs[rank][k * OP_LEN : (k + 1) * OP_LEN], p) for k in range(ops)]
    lead = p.exp_lead_eff
    peers = default_peers(p, WORLD) if admit else None
    host: list[tuple] = [(0, 0.0, host_port.config_frame(p, rank, WORLD, peers))]
    net: list[tuple] = []

    def tap(kind: str, tick: int, who: int, what: object) -> None:
        if who != rank:
            return
        seq = float(len(host) + len(net))
        if kind == "start":
            op_id, chunk, exp = what
            word = 0
            if inband:
                exp = None if op_id >= lead else exp
                word = ubt.proposal_word(props[op_id + lead] if op_id + lead < ops else None)
            frames = host_port.chunk_frames(host_port.START, op_id, chunk, exp, word)
            for k, f in enumerate(frames):
                host.append((tick, seq + k / 1000, f))
        else:
            net.append((tick, seq, what))

    _run(xs, ops * OP_LEN, p, 0.0, seed, set(), 5, 10.0, tap=tap)
    return host, net


def _rewrite(frame: bytes, **fields: int) -> bytes:
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(**fields)
    dst = int.from_bytes(frame[0:6], "big") - ubt.DEFAULT_ADDRESSING.mac_base
    payload = frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :]
    return ubt.build_frame(h, payload, src=h.sender, dst=dst, port=TRACE_PARAMS.udp_port)


def _malformed(frame: bytes, rng: np.random.Generator) -> bytes:
    kind = int(rng.integers(0, 6))
    b = bytearray(frame)
    if kind == 0:
        return bytes(b[: int(rng.integers(1, len(b)))])  # truncated
    if kind == 1:
        b[24] ^= 0xFF  # bad IPv4 checksum
        return bytes(b)
    if kind == 2:
        return _rewrite(frame, version=2)
    if kind == 3:
        return _rewrite(frame, count=3)  # length disagrees with the payload
    if kind == 4:
        return bytes(rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8))
    return _rewrite(frame, flags=0x40)  # reserved flag


def _scenarios() -> dict[str, Callable]:
    def clean(net, rng):
        return net

    def loss(net, rng):
        return [f for f in net if rng.random() >= 0.1]

    def reorder(net, rng):
        out = list(net)
        for _ in range(len(out) // 3):
            i = int(rng.integers(0, len(out) - 1))
            (t0, s0, a), (t1, s1, b) = out[i], out[i + 1]
            out[i], out[i + 1] = (t0, s0, b), (t1, s1, a)
        return out

    def duplicates(net, rng):
        return net + [(t + int(rng.integers(1, 20)), s + 0.5, f) for t, s, f in net
                      if rng.random() < 0.15]  # fmt: skip

    def late(net, rng):
        t_b = TRACE_PARAMS.t_b_us
        return [(t + 3 * t_b if rng.random() < 0.1 else t, s, f) for t, s, f in net]

    def stale_future(net, rng):
        end = max(t for t, _, _ in net)
        extra = [(end + 10 + k, 1e9 + k, _rewrite(f, op_id=0)) for k, (_, _, f) in
                 enumerate(net[:5])]  # fmt: skip
        extra += [(t + 1, s + 0.5, _rewrite(f, op_id=40 + k)) for k, (t, s, f) in
                  enumerate(net[:5])]  # fmt: skip
        return net + extra

    def unknown_rank(net, rng):
        return net + [(t + 1, s + 0.5, _rewrite(f, sender=r)) for (t, s, f), r in
                      zip(net[:6], [7, 5, 0] * 2, strict=True)]  # fmt: skip

    def malformed(net, rng):
        return net + [(t + 1, s + 0.5, _malformed(f, rng)) for t, s, f in net
                      if rng.random() < 0.2]  # fmt: skip

    def huge_tc(net, rng):
        """Losses, and rank 1's t_C beyond every t_B the NIC's clock allows (recorded as
        NicParams.t_c_max_us): 2^20 and up, to the header field's largest."""
        big = (1 << 32) - 1, 1 << 31, (1 << 28) + 5, (1 << 20) + 7
        out = []
        for t, s, f in loss(net, rng):
            if ubt.UbtHeader.unpack(f, ubt.L2_L4_LEN).sender == 1:
                f = _rewrite(f, t_c_us=big[int(rng.integers(0, len(big)))])
            out.append((t, s, f))
        return out

    return {f.__name__: f for f in (clean, loss, reorder, duplicates, late, stale_future,
                                     unknown_rank, malformed, huge_tc)}  # fmt: skip


SCENARIOS = tuple(_scenarios())


def _inband_scenarios() -> dict[str, Callable]:
    """Disturbances of in-band traces: (host, net, rng) -> (host, net)."""

    def follow(host, net, rng):
        """Rank 2's frames of op 1 are lost, so its proposal for op 3 (the largest) is
        missing here; peers' frames of op 3, with the exponent they agreed, come before
        rank 0 starts op 3, which it then follows."""
        return host, [e for e in net if _hdr(e[2])[:2] != (2, 1)]

    def silent(host, net, rng):
        """That, and the peers' frames of ops 3 and 4 come late: rank 0 starts op 3 at
        the smaller exponent it agreed (incomplete), and their frames disagree with it."""
        net = follow(host, net, rng)[1]
        return host, [(t + 100 if _hdr(f)[1] >= 3 else t, q, f) for t, q, f in net]

    def words(host, net, rng):
        """Proposal words malformed on some frames (dropped); "no proposal" on some frames
        of the last ops (for ops past the trace: a START of those would need an exponent)."""
        lead, out = INBAND_PARAMS.exp_lead_eff, []
        for t, q, f in net:
            r = rng.random()
            if r < 0.1:
                f = _rewrite(f, reserved=0x0003)
            elif r < 0.4 and _hdr(f)[1] >= INBAND_OPS - lead:
                f = _rewrite(f, reserved=0)  # the first word heard from a sender counts
            out.append((t, q, f))
        return host, out

    def predicted(host, net, rng):
        """Rank 0's host predicts too small (its proposals 3 below its need): an op agreed
        from them saturates here, and its frames disagree with the peers'."""
        out = []
        for t, q, f in host:
            h = host_port.parse(f) if host_port.is_host_frame(f) else None
            if h is not None and h.kind == host_port.START and h.proposal & 1:
                v = ubt.proposal_of(h.proposal) - 3
                h = dataclasses.replace(h, proposal=ubt.proposal_word(max(v, -128)))
                f = host_port.build(h, to_nic=True)
            out.append((t, q, f))
        return out, net

    return {f.__name__: f for f in (follow, silent, words, predicted)}


INBAND_SCENARIOS = tuple(_inband_scenarios())


def _from(frame: bytes, ip: int | None = None, port: int | None = None) -> bytes:
    """The frame from another source address or port (the IPv4 checksum fixed)."""
    b = bytearray(frame)
    if ip is not None:
        b[26:30] = ip.to_bytes(4, "big")
        b[24:26] = b"\0\0"
        b[24:26] = ubt.ipv4_checksum(bytes(b[14:34])).to_bytes(2, "big")
    if port is not None:
        b[34:36] = port.to_bytes(2, "big")
    return bytes(b)


def _admission_scenarios() -> dict[str, Callable]:
    """Traces with the peers table on (admission, frame_checks.admit)."""

    def strangers(net, rng):
        """Copies of peers' frames from an outsider's address, from a peer's address and
        another port, from a peer's address naming another sender, from this NIC's own
        address (admitted, then own_rank), and a peer's datagram too short to name a
        sender (admitted, then truncated)."""
        ip = int.from_bytes(ubt.DEFAULT_ADDRESSING.ip(1), "big")
        port = TRACE_PARAMS.udp_port
        out = list(net)
        for k, (t, q, f) in enumerate(net):
            if rng.random() >= 0.25:
                continue
            kind = k % 5
            if kind == 0:
                g = _from(f, ip=ip + 50)
            elif kind == 1:
                g = _from(_rewrite(f, sender=1), ip=ip, port=port + 1)
            elif kind == 2:
                g = _from(_rewrite(f, sender=2), ip=ip)
            elif kind == 3:
                g = _rewrite(f, sender=RANK)
            else:
                g = bytearray(f[: ubt.L2_L4_LEN + 4])
                g[16:18] = (ubt.IP_LEN + ubt.UDP_LEN + 4).to_bytes(2, "big")
                g[38:40] = (ubt.UDP_LEN + 4).to_bytes(2, "big")
                g = _from(bytes(g), ip=int.from_bytes(g[26:30], "big"))  # checksum again
            out.append((t + 1, q + 0.5, g))
        return out

    return {f.__name__: f for f in (strangers,)}


ADMISSION_SCENARIOS = tuple(_admission_scenarios())


def _hdr(frame: bytes) -> tuple[int, int]:
    """(sender, op_id) of a UBT frame, (-1, -1) if it is not one."""
    if len(frame) < ubt.L2_L4_LEN + ubt.HEADER_LEN:
        return -1, -1
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)
    return h.sender, h.op_id


def _op_of(frame: bytes) -> int:
    """The op of a host frame (-1 for CONFIG)."""
    h = host_port.parse(frame)
    return -1 if h.kind == host_port.CONFIG else h.op_id


# scenarios that name ranks (a sender rewritten to 0 or 1, rank 2's frames dropped, this
# rank's address): what they test holds at rank 0 only
RANK_ZERO_SCENARIOS = ("unknown_rank", "huge_tc", "strangers", "follow", "silent")


def make_trace(
    scenario: str,
    seed: int = 0,
    *,
    inband: bool = False,
    params: NicParams | None = None,
    rank: int = RANK,
) -> list[Frame]:
    """The frames of a scenario, ordered by tick (stable), from a run at `params`
    (TRACE_PARAMS if None), as `rank` sees it (ValueError for a scenario of
    RANK_ZERO_SCENARIOS at another rank: they name ranks). inband: a trace of
    INBAND_PARAMS, disturbed as any of SCENARIOS or INBAND_SCENARIOS says.
    ADMISSION_SCENARIOS turn the peers table on."""
    if rank != RANK and scenario in RANK_ZERO_SCENARIOS:
        raise ValueError(f"scenario {scenario!r} is written for rank {RANK}, not {rank}")
    table, extra = {**_scenarios(), **_admission_scenarios()}, _inband_scenarios() if inband else {}
    if scenario not in table and scenario not in extra:
        names = [*SCENARIOS, *ADMISSION_SCENARIOS, *(INBAND_SCENARIOS if inband else ())]
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(names)}")
    admit = scenario in ADMISSION_SCENARIOS
    host, net = _base(seed, inband, admit=admit, params=params, rank=rank)
    rng = np.random.default_rng(seed + 1)
    if scenario in extra:
        host, net = extra[scenario](host, net, rng)
    else:
        net = table[scenario](net, rng)
    frames = sorted(host + net, key=lambda e: (e[0], e[1]))
    return [(t, f) for t, _, f in frames]


def write_pcap(path: str | Path, frames: list[Frame]) -> None:
    """Ethernet pcap with microsecond timestamps (tick t at t microseconds)."""
    from scapy.packet import Raw
    from scapy.utils import PcapWriter

    with PcapWriter(str(path), linktype=1, sync=False) as w:
        for t, f in frames:
            pkt = Raw(load=f)
            pkt.time = t / 1e6
            w.write(pkt)


def read_pcap(path: str | Path) -> list[Frame]:
    """Frames and ticks of a pcap or pcapng file; OSError/ValueError if it cannot be read."""
    from scapy.utils import RawPcapNgReader, RawPcapReader

    path = Path(path)
    if not path.is_file():
        raise OSError(f"{path}: no such file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"\x0a\x0d\x0d\x0a":
        reader = RawPcapNgReader(str(path))
    elif magic in (
        b"\xd4\xc3\xb2\xa1",
        b"\xa1\xb2\xc3\xd4",
        b"\x4d\x3c\xb2\xa1",
        b"\xa1\xb2\x3c\x4d",
    ):
        reader = RawPcapReader(str(path))
    else:
        raise ValueError(f"{path}: not a pcap or pcapng file")
    out = []
    with reader:
        for data, meta in reader:
            if hasattr(meta, "sec"):
                t = meta.sec * 1_000_000 + meta.usec
            else:  # pcapng: tshigh/tslow in the interface's resolution (microseconds)
                t = (meta.tshigh << 32) | meta.tslow
            out.append((t, bytes(data)))
    if out:
        t0 = out[0][0]
        out = [(t - t0, f) for t, f in out]
    return out
