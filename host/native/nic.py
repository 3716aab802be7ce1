"""NativeNic: the live native backend (C++ engine thread, UDP socket, impairment; no GIL).

The same face as host/driver.py's backends: `allreduce(x) -> (mean, [OpStats])`,
`exclude`, `gone`, `counters`, `calibrate`, `set_t_b`, `close`. The work runs in one
engine thread per rank (host/native/src/live.cpp): this class only cuts the bucket into
chunks of at most C, plans their exponents (host/exponent_plan.py: the reliable exchange, or
in-band with NicParams.exp_inband), submits every chunk at once (the thread
starts each when the window of K ops has room) and waits, the GIL released, for the results,
which the thread writes straight into the output array. Memory: O(C x K) inside the engine,
whatever the bucket size; the output is the caller's array when `out=` is given (may be x
itself: each op reads its chunk before its result is written).

The socket is the driver's UdpTransport's own (a dup of it: the address the peers already
know, its peers table, its impairment spec), or a fresh one bound to `bind`, or, without
either, to the address and port host/bind_address.py picks (as the Python transport).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Union

import numpy as np

from optireduce.host.bind_address import bind_udp, local_ipv4, port_range
from optireduce.host.driver import writable_out
from optireduce.host.exponent_plan import ExponentAgreement, ExponentPlan
from optireduce.host.job_key import job_key
from optireduce.host.model.deadline import calibrate_t_b, phase_times
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.native import _engine, why
from optireduce.op_stats import OpStats
from optireduce.params import NicParams

if TYPE_CHECKING:
    import torch

    from optireduce.host.transport import UdpTransport

ArrayLike = Union[np.ndarray, "torch.Tensor"]
Address = tuple[str, int]

DEFAULT_BUFFER_BYTES = 64 << 20  # asked for SO_RCVBUF and SO_SNDBUF (root may pass rmem_max)
CALL_TIMEOUT_S = 5.0  # the longest a control call waits for the engine thread
TRACE_MAX_ENTRIES = 1 << 20  # per direction
TRACE_FIELDS = ("op_id", "phase", "peer", "pkt_index", "tick_us", "delay_us", "extra_us")


class NativeUnavailable(RuntimeError):
    """The native engine is not built (or not with the live runtime)."""


class NativeTransport:
    """`nic.transport` as the host backends' callers use it (the DDP hook's warm-up runs
    under `nic.transport.reliable()`), for the engine thread's own socket."""

    def __init__(self, nic: NativeNic, adopted: UdpTransport | None) -> None:
        self._nic, self.adopted = nic, adopted

    @property
    def address(self) -> Address:
        return self._nic.address

    def reliable(self) -> contextlib.AbstractContextManager[None]:
        return self._nic.reliable()

    def set_impairment(self, spec: ImpairmentSpec) -> None:
        self._nic.set_impairment(spec)

    @property
    def sent(self) -> int:
        return self._nic.counters()["tx_datagrams"]

    @property
    def received(self) -> int:
        return self._nic.counters()["rx_datagrams"]

    @property
    def lost(self) -> int:
        """Datagram copies the engine's impairment dropped."""
        return self._nic.counters()["impairment_lost"]


class NativeNic:
    """One rank's live native NIC."""

    backend = "native"

    def __init__(
        self,
        p: NicParams,
        rank: int,
        world: int,
        transport: UdpTransport | None = None,
        agree: ExponentAgreement | None = None,
        *,
        bind: Address | None = None,
        impairment: ImpairmentSpec | None = None,
        seed: int | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    ) -> None:
        if _engine is None or not hasattr(_engine, "LiveNic"):
            raise NativeUnavailable(why or "the native module has no live runtime; rebuild it")
        if agree is None:
            raise ValueError(
                "NativeNic: agree is required: every rank must run an op with the same "
                "exponent (driver.torch_exponent_agreement() over torch.distributed)"
            )
        self.p, self.rank, self.world = p, rank, world
        self.agree = agree
        self._params = _engine.Params.from_nicparams(p)
        peers: list[Address] = []
        fd = -1
        # without a transport: the environment's key, and no fingerprint check (that is
        # transport_from_store's, at rendezvous)
        key = job_key() if transport is None else transport.key
        if transport is not None:
            fd = transport.sock.fileno()
            peers = list(transport.peers)
            if transport.impairment is not None:
                impairment = impairment or transport.impairment.spec
                if seed is None:  # one draw of the transport's own seeded stream
                    seed = int(transport.impairment.rng.integers(1 << 62))
        self.impairment = impairment
        own = None
        if fd < 0 and bind is None:  # the address and ports the Python transport would take
            own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            bind_udp(own, local_ipv4(), port_range())
            fd = own.fileno()
        bind = bind or ("127.0.0.1", 0)
        try:
            self._live = _engine.LiveNic(
                self._params, rank, world, bind_ip=bind[0], port=bind[1], fd=fd,
                buffer_bytes=buffer_bytes, impairment=impairment,
                seed=rank if seed is None else seed,
                exp_lead=p.exp_lead_eff if p.exp_inband else 0, key=key,
            )  # fmt: skip
        finally:
            if own is not None:
                own.close()  # the engine holds its own dup
        self.transport = NativeTransport(self, transport)
        self.exponents = ExponentPlan(p, self._live.next_op)
        self._lock = threading.Lock()  # one allreduce at a time: op ids are handed out in order
        # arrays the engine thread may still read or write, by op id
        self._held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._leaked: list[object] = []
        if peers:
            self.connect(peers)

    # ---- set-up

    @property
    def next_op(self) -> int:
        """The id the next chunk will run as (ops are numbered across allreduce calls)."""
        return self._live.next_op

    @property
    def address(self) -> Address:
        return self._live.address

    @property
    def socket_buffers(self) -> tuple[int, int]:
        """(SO_RCVBUF, SO_SNDBUF) as the kernel granted them (it reports twice the ask)."""
        return self._live.rcvbuf, self._live.sndbuf

    def connect(self, peers: Sequence[Address]) -> None:
        """Every rank's address, index = rank; datagrams from any other address are
        counted (not_member) and dropped."""
        self._live.connect([(h, int(port)) for h, port in peers], CALL_TIMEOUT_S)

    # ---- the Nic interface

    @property
    def gone(self) -> set[int]:
        return set(self._live.gone(CALL_TIMEOUT_S))

    def exclude(self, rank: int) -> None:
        """The driver learnt that `rank` is dead: stop waiting for it."""
        self._live.exclude(rank, CALL_TIMEOUT_S)

    def counters(self) -> dict[str, int]:
        """The engine's counters (optireduce.counters.COUNTERS), then the transport's
        (rx/tx datagrams, not_member, wrong_sender, ...) and the impairment's."""
        return dict(self._live.counters(CALL_TIMEOUT_S))

    def resync(self) -> None:
        """The next L ops take their exponents from the reliable exchange (in-band
        agreement only; every rank must call this at the same op)."""
        self.exponents.resync(self.next_op)

    def set_t_b(self, t_b_us: int) -> None:
        """A calibrated hard bound for every later phase."""
        self.p = self.p.replace(t_b_us=int(t_b_us))
        self._live.set_t_b(int(t_b_us), CALL_TIMEOUT_S)

    def set_impairment(self, spec: ImpairmentSpec) -> None:
        """Change the engine's impairment from the next datagram on."""
        self._live.set_impairment(spec, CALL_TIMEOUT_S)
        self.impairment = spec

    @contextlib.contextmanager
    def reliable(self) -> Iterator[None]:
        """The same delays without loss or duplication, e.g. for warm-up ops."""
        if self.impairment is None:
            yield
            return
        self._live.set_impairment(self.impairment.reliable(), CALL_TIMEOUT_S)
        try:
            yield
        finally:
            self._live.set_impairment(self.impairment, CALL_TIMEOUT_S)

    def calibrate(self, x: np.ndarray, ops: int = 5) -> int:
        """t_B from warm-up ops over the reliable path, as the host backends do
        (deadline.calibrate_t_b; the max over the ranks, capped by the configured t_B)."""
        d: list[int] = []
        for k in range(ops + 1):
            with self.reliable():
                _, st = self.allreduce(x)
            if k:  # the first op pays for set-up and start skew: not a sample
                d += phase_times(st)
        t_b = min(self.p.t_b_us, self.agree([calibrate_t_b(d)])[0])
        self.set_t_b(t_b)
        return t_b

    def allreduce(
        self, x: ArrayLike, out: ArrayLike | None = None
    ) -> tuple[ArrayLike, list[OpStats]]:
        """Mean over the world of x (any length and shape; a numpy array or a CPU torch
        tensor). The result has x's type and shape; with `out` (same size, float32,
        contiguous; may be x) it is written there in place."""
        if type(x).__module__.startswith("torch"):
            import torch

            src = x.detach()
            if src.dtype != torch.float32 or not src.is_contiguous() or src.device.type != "cpu":
                src = src.to("cpu", torch.float32).contiguous()
            if out is None:
                res = torch.empty_like(src)
            else:
                res = out
            stats = self._run(src.numpy().reshape(-1), writable_out(res))
            if out is None and res.dtype != x.dtype:
                return res.to(x.dtype).view_as(x), stats
            return res.view_as(x) if out is None else res, stats
        xa = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        res = np.empty(xa.size, np.float32) if out is None else out
        stats = self._run(xa, writable_out(res))
        return (res.reshape(np.shape(x)) if out is None else res), stats

    def set_trace(self, on: bool = True) -> None:
        """Keep (or stop keeping) a trace of every UBT datagram the engine sends and
        receives: for loss attribution (take_trace)."""
        self._live.set_trace(on, TRACE_MAX_ENTRIES, CALL_TIMEOUT_S)

    def take_trace(self) -> dict[str, np.ndarray | int]:
        """The trace so far (then emptied): `sent` and `arrived`, int64 [n, 7] rows of
        TRACE_FIELDS (peer: the destination of a send, the sender of an arrival; delay_us of
        a send: its first copy's injected delay, -1 if every copy was dropped, extra_us the
        late link's share; delay_us of an arrival: the engine's verdict, the index of its drop
        reason in ubt.DROP_REASONS or -1 if accepted), ticks of this engine's clock;
        `origin_us`: its tick 0 on CLOCK_MONOTONIC (time.monotonic_ns() / 1000), so that
        ranks on one host compare; `not_kept`: entries past TRACE_MAX_ENTRIES."""
        sent, arrived, dropped = self._live.take_trace(CALL_TIMEOUT_S)
        best = None
        for _ in range(5):  # the read of both clocks with the shortest gap
            a = time.monotonic_ns()
            tick = self._live.now_us()
            b = time.monotonic_ns()
            if best is None or b - a < best[0]:
                best = (b - a, (a + b) // 2000 - tick)
        assert best is not None

        def rows(v: list) -> np.ndarray:
            return np.array(v, dtype=np.int64).reshape(len(v), len(TRACE_FIELDS))

        return {"sent": rows(sent), "arrived": rows(arrived), "origin_us": int(best[1]),
                "not_kept": int(dropped)}  # fmt: skip

    def close(self) -> None:
        self._live.stop()

    def __enter__(self) -> NativeNic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals

    def _run(self, x: np.ndarray, out: np.ndarray) -> list[OpStats]:
        with self._lock:
            return self._run_locked(x, out)

    def _run_locked(self, x: np.ndarray, out: np.ndarray) -> list[OpStats]:
        if x.size == 0:
            raise ValueError("allreduce: empty input")
        if out.size != x.size:
            raise ValueError(f"allreduce: out has {out.size} elements, x has {x.size}")
        c, live = self.p.c, self._live
        bounds = [(a, min(a + c, x.size)) for a in range(0, x.size, c)]
        first = live.next_op
        props = [_engine.propose_exponent(x[a:b], self._params) for a, b in bounds]
        exps, ahead = self.exponents.plan(props, first, self.agree, x.size)
        stats: list[OpStats] = []
        # Every phase ends by its deadline: an op takes at most 2 t_B plus skew. Past this
        # bound something outside the protocol is wrong: fail, never hang.
        limit = time.monotonic() + len(bounds) * (2 * self.p.t_b_us * 1e-6 + 1.0) + 5.0
        try:
            for k, (a, b) in enumerate(bounds):
                xs, os_ = x[a:b], out[a:b]
                self._held[first + k] = (xs, os_)
                live.submit(first + k, xs, os_, exps[k], ahead[k])
            while len(stats) < len(bounds):
                left = limit - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"allreduce: rank {self.rank} got {len(stats)}/{len(bounds)} ops by the "
                        "bound of 2 t_B per op; is every rank calling allreduce with the same "
                        "length?"
                    )
                for op_id, d in live.wait(min(left, 1.0), len(bounds) - len(stats)):
                    self._held.pop(op_id, None)
                    stats.append(OpStats(**d))
        finally:
            if self._held:  # an error: the thread must let go of these arrays first
                try:
                    live.cancel(CALL_TIMEOUT_S)
                    self._held.clear()
                except RuntimeError:
                    self._leaked.append(self._held)  # never freed while it could write
                    self._held = {}
        stats.sort(key=lambda s: s.op_id)
        return stats
