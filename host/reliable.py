"""Reliable messages over `UdpTransport`: what the baselines (ring, TAR) run on.

The same socket and the same impairment as the OptiReduce path: loss, delay,
duplication and reordering hit data and acks alike, so the comparison is fair.

- A message (src, tag, bytes of any size) is split into datagrams of at most
  `max_datagram` bytes (32 KiB), each with a 32-byte header: magic, kind (DATA or
  ACK), sender rank, tag, message id, per-(destination, tag) sequence number,
  fragment index, fragment count and a timestamp.
- The receiver acknowledges fragments selectively: one ACK datagram per peer per
  pump, with an entry per message that got a fragment in that pump: the bitmap of
  every fragment of it held so far, or "complete". So a lost ack is repaired by
  the next one, and a duplicate (counted, dropped) is acked again. Messages of one
  (src, tag) are delivered in the order they were sent.
- The sender keeps each fragment until it is acked and sends it again when its
  RTO expires. The RTO is Jacobson/Karels (srtt + 4 rttvar) of the ACK round trips,
  with an initial value, a floor and a ceiling, and doubles per retransmission of
  the same fragment. Every DATA datagram carries its send time and every ACK echoes
  the newest one it answers (as TCP's timestamps do), so each ACK is an unambiguous
  sample, retransmissions included (Karn's problem does not arise). A window of `window_bytes` per
  destination bounds what is in flight, so a burst cannot overrun the receiver's
  socket buffer.
- One thread pumps: `send` queues and sends what the window allows; `recv` and
  `flush` receive, ack, and retransmit until done or until their timeout, when
  they raise TimeoutError saying what is missing. Nothing blocks without a bound.

A rank that has got everything it needs may still owe its peers acks, and its own
last fragments may not be acked yet. So before blocking on anything else (a gloo
collective, the end of the process) call `settle()`: it flushes, then lingers,
acking, until the peers go quiet.
"""

from __future__ import annotations

import math
import struct
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from optireduce.host.transport import UdpTransport

MAGIC = b"RM"
DATA, ACK = 0, 1
HEADER = struct.Struct("!2sBBIIIIIII")  # magic kind version src tag msg seq frag nfrags ts
VERSION = 1
MAX_DATAGRAM = 32 * 1024
_ENTRY = struct.Struct("!II")  # an ACK entry: msg, nbits; then the bitmap (nbits = 0: complete)


@dataclass(frozen=True)
class ReliableConfig:
    max_datagram: int = MAX_DATAGRAM  # bytes of one datagram, header included
    window_bytes: int = 1 << 20  # unacked payload in flight per destination
    rto_init_s: float = 0.1  # before any round trip has been measured
    rto_min_s: float = 0.01  # floor: a descheduled peer acks late, not never
    rto_max_s: float = 1.0  # ceiling, also of the backed-off RTO

    def __post_init__(self) -> None:
        if not HEADER.size + 1 <= self.max_datagram <= 65507:
            raise ValueError(f"ReliableConfig.max_datagram={self.max_datagram}: not in 29..65507")
        if self.window_bytes < self.max_datagram:
            raise ValueError("ReliableConfig.window_bytes must hold at least one datagram")
        if not 0 < self.rto_min_s <= self.rto_init_s <= self.rto_max_s:
            raise ValueError("ReliableConfig: need 0 < rto_min_s <= rto_init_s <= rto_max_s")


@dataclass
class _Frag:
    dst: int
    tag: int
    msg: int
    seq: int
    frag: int
    nfrags: int
    data: bytes
    due: float = 0.0
    tries: int = 0  # transmissions so far
    held: bool = False  # due, but waiting for the answer to its message's probe

    @property
    def payload(self) -> int:
        return len(self.data)


@dataclass
class _Peer:
    """Send-side state towards one destination."""

    queue: deque[_Frag] = field(default_factory=deque)  # waiting for the window
    unacked: dict[tuple[int, int], _Frag] = field(default_factory=dict)
    inflight: int = 0  # payload bytes of unacked
    next_msg: int = 0
    nfrags: dict[int, int] = field(default_factory=dict)  # msg -> fragments, until all acked


@dataclass
class _Partial:
    tag: int
    seq: int
    frags: list[bytes | None]
    have: int = 0


@dataclass
class _Touched:
    """What one pump owes one source: acks for these messages, and the timestamp echo."""

    echo: int
    msgs: set[int] = field(default_factory=set)


def _stamp(t: float) -> int:
    """Microseconds of the monotonic clock, modulo 2^32 (round trips are far shorter)."""
    return int(t * 1e6) & 0xFFFFFFFF


class _Done:
    """Message ids of one source that are complete: all ids < low, plus a sparse set."""

    def __init__(self) -> None:
        self.low = 0
        self.above: set[int] = set()

    def __contains__(self, msg: int) -> bool:
        return msg < self.low or msg in self.above

    def add(self, msg: int) -> None:
        self.above.add(msg)
        while self.low in self.above:
            self.above.remove(self.low)
            self.low += 1


def _admit_reliable(transport: UdpTransport) -> None:
    """Teach the transport's admission where our header names the sender (UBT frames on
    the same socket keep theirs)."""
    other = transport.sender_of
    if getattr(other, "reliable", False):
        return

    def sender_of(d: bytes) -> int | None:
        if d[:2] == MAGIC and len(d) >= HEADER.size:
            return HEADER.unpack_from(d)[3]
        return other(d)

    sender_of.reliable = True  # type: ignore[attr-defined]
    transport.sender_of = sender_of


class ReliableEndpoint:
    """Reliable, ordered-per-(src, tag) messages between the ranks of one transport."""

    def __init__(self, transport: UdpTransport, cfg: ReliableConfig | None = None) -> None:
        self.t = transport
        self.rank = transport.rank
        self.cfg = cfg or ReliableConfig()
        _admit_reliable(transport)
        self._payload = self.cfg.max_datagram - HEADER.size
        self._peers: dict[int, _Peer] = {}
        self._send_seq: dict[tuple[int, int], int] = {}  # (dst, tag) -> next seq
        self._partial: dict[tuple[int, int], _Partial] = {}  # (src, msg)
        self._done: dict[int, _Done] = {}
        self._ready: dict[tuple[int, int], dict[int, bytes]] = {}  # (src, tag) -> seq -> data
        self._next_seq: dict[tuple[int, int], int] = {}  # (src, tag) -> next seq to deliver
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = self.cfg.rto_init_s
        # counters
        self.retransmissions = 0  # fragments sent again after their RTO
        self.duplicates = 0  # data fragments received more than once
        self.fragments_sent = 0  # first transmissions
        self.acks_sent = 0  # ACK datagrams
        self.foreign = 0  # datagrams that are not ours (e.g. UBT frames)

    # ---- sending -----------------------------------------------------------------------------
    def send(self, dst: int, tag: int, data: bytes | bytearray | memoryview) -> None:
        """Queue one message to `dst`; send what the window allows now. Never blocks."""
        if dst == self.rank or not 0 <= dst < len(self.t.peers):
            raise ValueError(
                f"reliable send: rank {self.rank} cannot send to rank {dst} "
                f"(peers: 0..{len(self.t.peers) - 1}, not itself)"
            )
        if not 0 <= tag < 1 << 32:
            raise ValueError(f"reliable send: tag {tag} does not fit 32 bits")
        mv = memoryview(data).cast("B")
        peer = self._peers.setdefault(dst, _Peer())
        msg = peer.next_msg
        peer.next_msg += 1
        seq = self._send_seq.get((dst, tag), 0)
        self._send_seq[(dst, tag)] = seq + 1
        n = max(1, math.ceil(len(mv) / self._payload))
        peer.nfrags[msg] = n
        for i in range(n):
            chunk = bytes(mv[i * self._payload : (i + 1) * self._payload])
            peer.queue.append(_Frag(dst, tag, msg, seq, i, n, chunk))
        self._fill_window(dst, peer, time.monotonic())

    def _fill_window(self, dst: int, peer: _Peer, now: float) -> None:
        while peer.queue and (
            not peer.unacked or peer.inflight + peer.queue[0].payload <= self.cfg.window_bytes
        ):
            f = peer.queue.popleft()
            peer.unacked[(f.msg, f.frag)] = f
            peer.inflight += f.payload
            self._transmit(f, now)
            self.fragments_sent += 1

    def _transmit(self, f: _Frag, now: float) -> None:
        f.tries += 1
        f.held = False
        f.due = now + self._backoff(f.tries)
        head = HEADER.pack(
            MAGIC, DATA, VERSION, self.rank, f.tag, f.msg, f.seq, f.frag, f.nfrags, _stamp(now)
        )
        self.t.send(f.dst, head + f.data)

    def _retransmit_due(self, now: float) -> None:
        """Per message, send only its first due fragment again (a probe) and hold the other
        due ones: if only the ack was lost, the probe's ack clears them all; if not, it says
        which are missing and those go at once (`_on_ack`). A lost ack at the end of a
        message thus costs one datagram, not a window of them."""
        for peer in self._peers.values():
            probed: set[int] = set()
            for f in sorted((f for f in peer.unacked.values() if f.due <= now),
                            key=lambda f: (f.msg, f.frag)):  # fmt: skip
                if f.msg in probed:
                    f.held = True
                    f.due = now + self._backoff(f.tries)
                    continue
                probed.add(f.msg)
                self._transmit(f, now)
                self.retransmissions += 1

    def _backoff(self, tries: int) -> float:
        return min(self.cfg.rto_max_s, self.rto * 2 ** max(0, tries - 1))

    def _next_due(self) -> float | None:
        dues = [f.due for p in self._peers.values() for f in p.unacked.values()]
        return min(dues) if dues else None

    def _on_ack(self, src: int, echo: int, body: bytes, now: float) -> None:
        peer = self._peers.get(src)
        if peer is None:
            return
        self._rtt_sample(((_stamp(now) - echo) & 0xFFFFFFFF) * 1e-6)
        off = 0
        while off + _ENTRY.size <= len(body):
            msg, nbits = _ENTRY.unpack_from(body, off)
            off += _ENTRY.size
            nbytes = (nbits + 7) // 8
            n = peer.nfrags.get(msg)
            if n is None:  # every fragment of it acked already
                off += nbytes
                continue
            if nbits == 0:
                frags: range | np.ndarray = range(n)
            else:
                bits = np.unpackbits(np.frombuffer(body, np.uint8, nbytes, off), count=nbits)
                frags = np.flatnonzero(bits)
            off += nbytes
            for i in frags:
                f = peer.unacked.pop((msg, int(i)), None)
                if f is None:
                    continue  # acked before
                peer.inflight -= f.payload
            if nbits:  # what is still missing of a probed message goes again now
                for i in range(n):
                    f = peer.unacked.get((msg, i))
                    if f is not None and f.held:
                        self._transmit(f, now)
                        self.retransmissions += 1
            queued = bool(peer.queue) and peer.queue[0].msg <= msg  # the queue is in msg order
            if not queued and not any((msg, i) in peer.unacked for i in range(n)):
                del peer.nfrags[msg]
        self._fill_window(src, peer, now)

    def _rtt_sample(self, r: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        rto = self.srtt + 4 * self.rttvar
        self.rto = min(self.cfg.rto_max_s, max(self.cfg.rto_min_s, rto))

    # ---- receiving ---------------------------------------------------------------------------
    def _on_data(self, head: tuple, payload: bytes, touched: dict[int, _Touched]) -> None:
        _, _, _, src, tag, msg, seq, frag, nfrags, ts = head
        t = touched.setdefault(src, _Touched(ts))
        t.msgs.add(msg)
        t.echo = ts  # the newest: datagrams are handled in arrival order
        done = self._done.setdefault(src, _Done())
        if msg in done:
            self.duplicates += 1
            return
        p = self._partial.get((src, msg))
        if p is None:
            p = self._partial[(src, msg)] = _Partial(tag, seq, [None] * nfrags)
        if frag >= len(p.frags) or p.frags[frag] is not None:
            self.duplicates += 1
            return
        p.frags[frag] = payload
        p.have += 1
        if p.have == len(p.frags):
            del self._partial[(src, msg)]
            done.add(msg)
            self._ready.setdefault((src, p.tag), {})[p.seq] = b"".join(p.frags)  # type: ignore[arg-type]

    def _send_acks(self, touched: dict[int, _Touched]) -> None:
        room = self.cfg.max_datagram - HEADER.size
        for src, t in touched.items():
            entries = []
            for msg in sorted(t.msgs):
                p = self._partial.get((src, msg))
                if p is None:  # complete
                    entries.append(_ENTRY.pack(msg, 0))
                else:
                    bits = np.packbits([f is not None for f in p.frags]).tobytes()
                    entries.append(_ENTRY.pack(msg, len(p.frags)) + bits)
            while entries:
                body, size = [], 0
                while entries and (not body or size + len(entries[0]) <= room):
                    size += len(entries[0])
                    body.append(entries.pop(0))
                head = HEADER.pack(MAGIC, ACK, VERSION, self.rank, 0, 0, 0, 0, len(body), t.echo)
                self.t.send(src, head + b"".join(body))
                self.acks_sent += 1

    def pump(self, wait_s: float) -> int:
        """Receive for at most `wait_s` (less if a retransmission falls due), ack, retransmit.
        Returns the number of datagrams handled."""
        now = time.monotonic()
        due = self._next_due()
        if due is not None:
            wait_s = min(wait_s, max(0.0, due - now))
        datagrams = self.t.recv(wait_s)
        now = time.monotonic()
        touched: dict[int, _Touched] = {}  # src -> messages to ack
        for d in datagrams:
            if len(d) < HEADER.size or d[:2] != MAGIC:
                self.foreign += 1
                continue
            head = HEADER.unpack_from(d)
            if head[2] != VERSION:
                self.foreign += 1
            elif head[1] == DATA:
                self._on_data(head, d[HEADER.size :], touched)
            elif head[1] == ACK:
                self._on_ack(head[3], head[9], d[HEADER.size :], now)
            else:
                self.foreign += 1
        if touched:
            self._send_acks(touched)
        self._retransmit_due(time.monotonic())
        return len(datagrams)

    def _take(self, src: int, tag: int) -> bytes | None:
        key = (src, tag)
        ready = self._ready.get(key)
        seq = self._next_seq.get(key, 0)
        if not ready or seq not in ready:
            return None
        self._next_seq[key] = seq + 1
        return ready.pop(seq)

    def recv(self, src: int, tag: int, timeout: float) -> bytes:
        """The next message from `src` with `tag`; TimeoutError if it is not complete in time."""
        deadline = time.monotonic() + timeout
        while True:
            data = self._take(src, tag)
            if data is not None:
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(self._recv_timeout_message(src, tag, timeout))
            self.pump(min(left, 0.05))

    def _recv_timeout_message(self, src: int, tag: int, timeout: float) -> str:
        parts = [p for (s, _), p in self._partial.items() if s == src and p.tag == tag]
        got = (
            f"{parts[0].have}/{len(parts[0].frags)} fragments of it arrived"
            if parts
            else "no fragment of it arrived"
        )
        return (
            f"reliable recv: rank {self.rank} waited {timeout:.3g} s for message tag {tag} from "
            f"rank {src} and {got}; is rank {src} alive and sending it?"
        )

    def pending(self) -> int:
        """Fragments sent or queued that are not acked yet."""
        return sum(len(p.unacked) + len(p.queue) for p in self._peers.values())

    def flush(self, timeout: float) -> None:
        """Until every fragment sent is acked; TimeoutError if that takes longer than timeout."""
        deadline = time.monotonic() + timeout
        while self.pending():
            left = deadline - time.monotonic()
            if left <= 0:
                owed = {d: len(p.unacked) + len(p.queue) for d, p in self._peers.items()}
                owed = {d: n for d, n in owed.items() if n}
                raise TimeoutError(
                    f"reliable flush: rank {self.rank} still has unacked fragments after "
                    f"{timeout:.3g} s (destination: fragments {owed}); are those ranks alive "
                    "and pumping?"
                )
            self.pump(min(left, 0.05))

    def linger(self, quiet_s: float | None = None, timeout: float = 10.0) -> None:
        """Keep acking until no datagram has arrived for `quiet_s` (default: twice the RTO
        ceiling, longer than any peer's backed-off retransmission) or `timeout` passes."""
        quiet = 2 * self.cfg.rto_max_s if quiet_s is None else quiet_s
        end = time.monotonic() + timeout
        last = time.monotonic()
        while (now := time.monotonic()) < end and now - last < quiet:
            if self.pump(min(quiet - (now - last), end - now)):
                last = time.monotonic()

    def settle(self, timeout: float = 30.0, quiet_s: float | None = None) -> None:
        """Flush, then linger so that peers still waiting for our acks get them.

        Call it before anything that blocks without pumping (a gloo collective, a barrier,
        the end of the process): a peer whose last ack from us was lost can only finish
        while we still answer its retransmissions."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        self.linger(quiet_s, timeout=max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 30.0, quiet_s: float | None = None) -> None:
        """settle(); the transport stays open (its owner closes it)."""
        self.settle(timeout, quiet_s)

    def stats(self) -> dict:
        return {
            "fragments_sent": self.fragments_sent,
            "retransmissions": self.retransmissions,
            "duplicates": self.duplicates,
            "acks_sent": self.acks_sent,
            "foreign": self.foreign,
            "srtt_ms": None if self.srtt is None else self.srtt * 1e3,
            "rto_ms": self.rto * 1e3,
        }
