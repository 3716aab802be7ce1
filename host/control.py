"""The hook's control plane: all-gathers and a broadcast that never wait past a bound.

Exponent agreement, the loss decision, the replica checksum and the resync of the
parameters must not block on a worker that died or stalled (a gloo collective would
wait for gloo's timeout). So
they run over the reliable message layer on a socket of their own, each with a
deadline. A rank that misses one deadline is taken as gone for the rest of the
job: later exchanges do not wait for it, and its messages are ignored. The bound is for
a silent rank. A rank that is waiting in an exchange sends a keep-alive to the others
every quarter bound, so a rank still waiting out a dead peer one exchange behind is not
mistaken for a dead one: past the bound, a peer heard from within the last bound is
waited for, up to MAX_BOUNDS bounds. Without it, the ranks that saw a peer die one
exchange apart excluded each other. Every
exchange carries a sequence number, so a late answer is never mistaken for a
later exchange's.
"""

from __future__ import annotations

import contextlib
import struct
import time

from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.reliable import ReliableEndpoint
from optireduce.host.transport import transport_from_store

TAG = 0x0C7
TAG_ALIVE = 0x0C8  # keep-alive of a rank that waits in an exchange (empty, dropped on arrival)
ALIVE_PER_BOUND = 4
MAX_BOUNDS = 4  # the longest wait for a peer that keeps showing life, in bounds
STORE_PREFIX = "optireduce/control/"
_SEQ = struct.Struct("!Q")


class ControlPlane:
    def __init__(self, rank: int, world: int, store, timeout_s: float = 30.0, *,
                 impairment: ImpairmentSpec | None = None, seed: int = 0) -> None:  # fmt: skip
        """impairment: the same injected delay as the data path (an experiment's tail hits
        control traffic too: a late rank's exponent or checksum is late as well)."""
        self.rank, self.world = rank, world
        self.timeout_s = timeout_s
        self.transport = transport_from_store(store, rank, world, prefix=STORE_PREFIX,
                                              impairment=impairment, seed=seed)  # fmt: skip
        self.ep = ReliableEndpoint(self.transport)
        self.seq = 0
        self.gone: set[int] = set()

    def allgather(self, value: bytes, timeout_s: float | None = None) -> list[bytes | None]:
        """Every live rank's value (None for a rank that is gone or missed the bound)."""
        self.seq += 1
        self._drop_keep_alives()
        msg = _SEQ.pack(self.seq) + value
        live = [r for r in range(self.world) if r != self.rank and r not in self.gone]
        for r in live:
            self.ep.send(r, TAG, msg)
        out: list[bytes | None] = [None] * self.world
        out[self.rank] = value
        bound = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        for r in live:
            out[r] = self._await(r, start, bound)
        return out

    def broadcast(self, value: bytes, root: int, timeout_s: float | None = None) -> bytes | None:
        """`root`'s value on every live rank (the others' `value` is unused): None where
        the root is gone or missed the bound. Each receiver answers, so the root keeps
        sending fragments until every live rank has all of them, and takes a rank that
        did not answer in time as gone."""
        self.seq += 1
        self._drop_keep_alives()
        bound = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        if self.rank != root:
            if root in self.gone:
                return None
            got = self._await(root, start, bound)
            if got is not None:
                self.ep.send(root, TAG, _SEQ.pack(self.seq))
            return got
        live = [r for r in range(self.world) if r != self.rank and r not in self.gone]
        for r in live:
            self.ep.send(r, TAG, _SEQ.pack(self.seq) + value)
        for r in live:
            self._await(r, start, bound)
        return value

    def _await(self, r: int, start: float, bound: float) -> bytes | None:
        """Rank r's message of the exchange that began at `start`; None (and r gone) once
        the bound has passed and r was not heard from within the last bound, or past
        MAX_BOUNDS bounds."""
        hard = start + MAX_BOUNDS * bound
        while True:
            now = time.monotonic()
            try:
                got = self.ep.recv(r, TAG, max(0.0, min(bound / ALIVE_PER_BOUND, hard - now)))
            except TimeoutError:
                self._keep_alive(but=r)
                now = time.monotonic()
                heard = self.transport.heard.get(r, start - bound)
                if now < start + bound or (now < hard and heard > now - bound):
                    continue
                self.gone.add(r)
                return None
            (seq,) = _SEQ.unpack_from(got)
            if seq == self.seq:
                return got[_SEQ.size :]
            # an answer to an exchange that already timed out: drop it

    def _keep_alive(self, but: int) -> None:
        """Tell the live ranks (but the one awaited) that we are alive and waiting; drop
        the keep-alives that came to us."""
        self._drop_keep_alives()
        for q in range(self.world):
            if q not in (self.rank, but) and q not in self.gone:
                self.ep.send(q, TAG_ALIVE, b"")

    def _drop_keep_alives(self) -> None:
        for q in range(self.world):
            with contextlib.suppress(TimeoutError):
                while True:
                    self.ep.recv(q, TAG_ALIVE, 0.0)

    def max_ints(self, values: list[int], timeout_s: float | None = None) -> list[int]:
        """Element-wise max over the live ranks."""
        fmt = f"!{len(values)}q"
        got = self.allgather(struct.pack(fmt, *values), timeout_s)
        rows = [struct.unpack(fmt, g) for g in got if g is not None]
        return [max(col) for col in zip(*rows, strict=True)]

    def close(self) -> None:
        # peers still waiting for our acks get them; a gone peer never acks
        with contextlib.suppress(TimeoutError):
            self.ep.settle(timeout=1.0, quiet_s=0.05)
        self.transport.close()
