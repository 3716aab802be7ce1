"""The hook's control plane: small all-gathers that never wait past a bound.

Exponent agreement, the loss decision and the replica checksum must not block on a
worker that died or stalled (a gloo collective would wait for gloo's timeout). So
they run over the reliable message layer on a socket of their own, each with a
deadline. A rank that misses one deadline is taken as gone for the rest of the
job: later exchanges do not wait for it, and its messages are ignored. Every
exchange carries a sequence number, so a late answer is never mistaken for a
later exchange's.
"""

from __future__ import annotations

import contextlib
import struct
import time

from optireduce.host.reliable import ReliableEndpoint
from optireduce.host.transport import transport_from_store

TAG = 0x0C7
STORE_PREFIX = "optireduce/control/"
_SEQ = struct.Struct("!Q")


class ControlPlane:
    def __init__(self, rank: int, world: int, store, timeout_s: float = 30.0) -> None:
        self.rank, self.world = rank, world
        self.timeout_s = timeout_s
        self.transport = transport_from_store(store, rank, world, prefix=STORE_PREFIX)
        self.ep = ReliableEndpoint(self.transport)
        self.seq = 0
        self.gone: set[int] = set()

    def allgather(self, value: bytes, timeout_s: float | None = None) -> list[bytes | None]:
        """Every live rank's value (None for a rank that is gone or missed the bound)."""
        self.seq += 1
        msg = _SEQ.pack(self.seq) + value
        live = [r for r in range(self.world) if r != self.rank and r not in self.gone]
        for r in live:
            self.ep.send(r, TAG, msg)
        out: list[bytes | None] = [None] * self.world
        out[self.rank] = value
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for r in live:
            while True:
                left = deadline - time.monotonic()
                try:
                    got = self.ep.recv(r, TAG, max(0.0, left))
                except TimeoutError:
                    self.gone.add(r)
                    break
                (seq,) = _SEQ.unpack_from(got)
                if seq == self.seq:
                    out[r] = got[_SEQ.size :]
                    break
                # an answer to an exchange that already timed out: drop it
        return out

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
