"""NativeReliable: the reliable baselines (ring and TAR allreduce) in the native engine.

experiments/baselines.py's algorithms, on host/reliable.py's reliable message layer
(same wire format, ACK and RTO rules), run by one C++ engine thread per rank
(host/native/src/reliable_live.cpp) over the native UdpTransport with the native impairment,
ACKs included: the same transport and impairment as the native OptiReduce path, so a bench
compares algorithms, not languages. The results are the Python baselines' bits: the same
chunks, summed in the same order in float32 (ring: chunk c in the order of ranks c, c+1, ...;
TAR: ranks 0..N-1), then divided by N.

The socket is a dup of a UdpTransport's (its address, peers table and impairment spec; the
Python transport must not read it meanwhile), or a fresh one bound to `bind`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from optireduce.host.job_key import job_key
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.native import _engine, why
from optireduce.host.reliable import ReliableConfig

if TYPE_CHECKING:
    from optireduce.host.transport import UdpTransport

Address = tuple[str, int]
DEFAULT_BUFFER_BYTES = 64 << 20
CALL_TIMEOUT_S = 5.0  # the longest a control call waits for the engine thread


class NativeReliableUnavailable(RuntimeError):
    """The native module is not built, or not with the reliable runtime."""


class NativeReliable:
    """One rank's native reliable baselines."""

    implementation = "native"

    def __init__(
        self,
        rank: int,
        world: int,
        transport: UdpTransport | None = None,
        *,
        bind: Address | None = None,
        impairment: ImpairmentSpec | None = None,
        seed: int | None = None,
        cfg: ReliableConfig | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        if _engine is None or not hasattr(_engine, "ReliableLive"):
            raise NativeReliableUnavailable(
                why or "the native module has no reliable runtime; rebuild it with `make install`"
            )
        if not 0 <= rank < world:
            raise ValueError(f"NativeReliable: rank {rank} not in 0..{world - 1}")
        cfg = cfg or ReliableConfig()
        self.rank, self.world, self.cfg = rank, world, cfg
        fd, peers = -1, []
        key = job_key() if transport is None else transport.key
        if transport is not None:
            if transport.rank != rank:
                raise ValueError(f"NativeReliable: rank {rank} given a transport of rank "
                                 f"{transport.rank}")  # fmt: skip
            fd, peers = transport.sock.fileno(), list(transport.peers)
            if transport.impairment is not None:
                impairment = impairment or transport.impairment.spec
                if seed is None:  # one draw of the transport's own seeded stream
                    seed = int(transport.impairment.rng.integers(1 << 62))
        self.impairment = impairment
        bind = bind or ("127.0.0.1", 0)
        self._live = _engine.ReliableLive(
            rank, world, bind_ip=bind[0], port=bind[1], fd=fd, buffer_bytes=buffer_bytes,
            impairment=impairment, seed=rank if seed is None else seed,
            max_datagram=cfg.max_datagram, window_bytes=cfg.window_bytes,
            rto_init_s=cfg.rto_init_s, rto_min_s=cfg.rto_min_s, rto_max_s=cfg.rto_max_s, key=key,
        )  # fmt: skip
        self._leaked: list[object] = []
        self.retransmissions_last = 0  # of the last collective, this rank's
        if peers:
            self.connect(peers)

    @property
    def address(self) -> Address:
        return self._live.address

    def connect(self, peers: list[Address]) -> None:
        """Every rank's address, index = rank; datagrams from any other address are
        counted (not_member) and dropped."""
        if len(peers) != self.world:
            raise ValueError(f"connect: {len(peers)} addresses for a world of {self.world}")
        self._live.connect([(h, int(p)) for h, p in peers], CALL_TIMEOUT_S)

    def set_impairment(self, spec: ImpairmentSpec) -> None:
        """Change the impairment from the next datagram on (ACKs included)."""
        self._live.set_impairment(spec, CALL_TIMEOUT_S)
        self.impairment = spec

    # ---- the collectives

    def ring_allreduce(self, x: np.ndarray, *, timeout: float = 60.0) -> np.ndarray:
        """Mean over the ranks of x (float32), by the ring (reduce-scatter, then allgather).
        Each step waits at most `timeout` seconds for its message (TimeoutError)."""
        return self._run("ring", x, timeout)

    def tar_allreduce(self, x: np.ndarray, *, timeout: float = 60.0) -> np.ndarray:
        """Mean over the ranks of x (float32), by Transpose AllReduce. Each message is
        awaited at most `timeout` seconds (TimeoutError)."""
        return self._run("tar", x, timeout)

    def _run(self, algo: str, x: np.ndarray, timeout: float) -> np.ndarray:
        if not (timeout > 0 and np.isfinite(timeout)):
            raise ValueError(f"{algo} allreduce: timeout {timeout} must be > 0 s")
        xa = np.ascontiguousarray(x, dtype=np.float32).ravel()
        if xa.size == 0:
            raise ValueError(f"{algo} allreduce: empty input")
        out = np.empty_like(xa)
        try:
            status, msg, _, retx = self._live.allreduce(algo, xa, out, timeout)
        except RuntimeError:
            self._leaked.append((xa, out))  # the engine thread may still hold them
            raise
        self.retransmissions_last = retx
        if status == "timeout":
            raise TimeoutError(msg)
        if status == "bad_size":
            raise ValueError(msg)
        if status != "ok":
            raise RuntimeError(f"{algo} allreduce: rank {self.rank}: {status} {msg}")
        return out

    # ---- state

    def counters(self) -> dict[str, int]:
        """The layer's counters (fragments_sent, retransmissions, duplicates, acks_sent,
        foreign, malformed, ..., the impairment's), then the transport's (rx/tx datagrams,
        not_member, wrong_sender, ...)."""
        return dict(self._live.counters(CALL_TIMEOUT_S))

    @property
    def retransmissions(self) -> int:
        return self.counters()["retransmissions"]

    def pending(self) -> int:
        """Fragments sent or queued that are not acked yet."""
        return self._live.pending(CALL_TIMEOUT_S)

    def flush(self, timeout: float) -> None:
        """Until every fragment sent is acked; TimeoutError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while (left := self.pending()) > 0:
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"reliable flush: rank {self.rank} still has {left} unacked fragments "
                    f"after {timeout:.3g} s; are its peers alive?"
                )
            time.sleep(0.001)

    def settle(self, timeout: float = 30.0, quiet_s: float | None = None) -> None:
        """Flush, then wait until no datagram of the layer has arrived for `quiet_s` (default:
        twice the RTO ceiling), at most `timeout` seconds in all: the engine thread acks
        meanwhile, so peers whose last ACK from us was lost can finish."""
        if self.world == 1:
            return
        end = time.monotonic() + timeout
        self.flush(timeout)
        quiet = 2 * self.cfg.rto_max_s if quiet_s is None else quiet_s
        while (now := time.monotonic()) < end:
            q = self._live.quiet_s(CALL_TIMEOUT_S)
            if q >= quiet:
                return
            time.sleep(min(quiet - q, end - now))

    def close(
        self, timeout: float = 30.0, quiet_s: float | None = None, *, settle: bool = True
    ) -> None:
        """settle() (unless settle=False: e.g. after a peer died), then stop the engine
        thread. The adopted transport stays open (its owner closes it)."""
        try:
            if settle:
                self.settle(timeout, quiet_s)
        finally:
            self._live.stop()

    def __enter__(self) -> NativeReliable:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(settle=exc_type is None)
