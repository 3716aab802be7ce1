"""The driver: one `Nic` interface, a backend chosen at run time, AllReduce of any length.

Backends, best first: `board` (an FPGA NIC), `sim` (the Verilated RTL, live),
`native` (the C++ engine over UDP, host/native) and `software` (the bit-exact Python
model over UDP). select_nic() takes the best one that is available and logs one line
saying which and why the others were passed over (for `native`: why the extension did
not load); `sim` only when asked for (prefer=, or OPTIREDUCE_NIC=sim:
host/cosim_nic.py). All of them give the same results bit for bit.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, Union

import numpy as np

from optireduce import ubt
from optireduce.counters import COUNTERS
from optireduce.host.exponent_plan import ExponentAgreement, ExponentPlan
from optireduce.host.model.deadline import calibrate_t_b, phase_times
from optireduce.host.model.fwht import fwht_blocks
from optireduce.host.model.nic_model import NicModel, OpResult
from optireduce.host.model.quantize import propose_exponent
from optireduce.host.transport import UdpTransport
from optireduce.op_stats import OpStats
from optireduce.params import NicParams

if TYPE_CHECKING:
    import torch

log = logging.getLogger("optireduce")
ArrayLike = Union[np.ndarray, "torch.Tensor"]  # a CPU tensor comes back as a tensor


def writable_out(a: ArrayLike) -> np.ndarray:
    """allreduce's `out` (a contiguous float32 array or CPU tensor) as a flat numpy view;
    TypeError if it is not one, or read-only."""
    v = a.detach().numpy() if type(a).__module__.startswith("torch") else a
    if not (isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous):
        raise TypeError("allreduce: out must be a contiguous float32 CPU array or tensor")
    if not v.flags.writeable:
        raise TypeError("allreduce: out is read-only")
    return v.reshape(-1)


def _into(out: ArrayLike, res: np.ndarray) -> ArrayLike:
    """Copy the result into `out` (writable_out, of the result's size); return `out`."""
    v = writable_out(out)
    if v.size != res.size:
        raise TypeError("allreduce: out must be a contiguous float32 array of x's size")
    np.copyto(v, res.reshape(-1))
    return out


class Nic(Protocol):
    backend: str
    gone: set[int]  # peers excluded: nothing more is awaited from them

    def allreduce(
        self, x: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[OpStats]]: ...

    def exclude(self, rank: int) -> None: ...

    def counters(self) -> dict[str, int]: ...

    def resync(self) -> None: ...

    def close(self) -> None: ...


class BackendUnavailable(RuntimeError):
    """This backend cannot run here; the message says why."""


def torch_exponent_agreement(group=None) -> ExponentAgreement:
    """Max of every rank's proposals through torch.distributed (one small reliable op)."""
    import torch
    import torch.distributed as dist

    def agree(proposals: list[int]) -> list[int]:
        t = torch.tensor(proposals, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return [int(v) for v in t.tolist()]

    return agree


class HostNic:
    """What the host-driven backends share: the rank's place in the world, its transport
    and exponent agreement, the array-in/array-out `allreduce` with its op loop, and the
    t_B calibration. A backend supplies `_open` (its own set-up, run once the fields are
    in), `set_t_b`, and the op loop's primitives: `_room` (may this op start now?),
    `_start` (hand the NIC one chunk) and `_poll` (wait a little; the results that came).
    """

    # Seconds added to the bound of 2 t_B + 1 s per op (a backend's start-up, say).
    wait_slack_s = 5.0

    def __init__(
        self,
        p: NicParams,
        rank: int,
        world: int,
        transport: UdpTransport,
        agree: ExponentAgreement,
    ) -> None:
        self.p, self.rank, self.world = p, rank, world
        self.transport, self.agree = transport, agree
        self.next_op = 0
        self.exponents = ExponentPlan(p, self.next_op)
        self._open()

    def _open(self) -> None:
        raise NotImplementedError

    def allreduce(
        self, x: ArrayLike, out: ArrayLike | None = None
    ) -> tuple[ArrayLike, list[OpStats]]:
        """Mean over the world of x (any length; a numpy array or a CPU torch tensor, of
        any shape: the result has x's type and shape); K ops in flight. With `out` (x's
        size, float32, contiguous; may be x) the result is written there and returned."""
        if type(x).__module__.startswith("torch"):
            import torch

            res, stats = self._allreduce(x.detach().cpu().numpy())
            if out is None:
                return torch.from_numpy(res).to(x.dtype).view_as(x), stats
        else:
            res, stats = self._allreduce(np.asarray(x))
            if out is None:
                return res.reshape(np.shape(x)), stats
        return _into(out, res), stats

    def _allreduce(self, x: np.ndarray) -> tuple[np.ndarray, list[OpStats]]:
        """The op loop: x in chunks of at most C elements, one op each, K in flight."""
        x = np.ascontiguousarray(x, dtype=np.float32).ravel()
        if x.size == 0:
            raise ValueError("allreduce: empty input")
        p = self.p
        bounds = [(a, min(a + p.c, x.size)) for a in range(0, x.size, p.c)]
        first, ops = self.next_op, len(bounds)
        props = [propose_exponent(x[a:b], p) for a, b in bounds]
        exps, ahead = self.exponents.plan(props, first, self.agree, x.size)
        results: dict[int, np.ndarray] = {}
        stats: list[OpStats] = []
        started = 0
        limit = self._limit(ops)
        while len(results) < ops:
            while started < ops and self._room(first + started, first + len(results)):
                a, b = bounds[started]
                self._start(first + started, x[a:b], exps[started], ahead[started])
                started += 1
            try:
                done = self._poll(limit)
            except TimeoutError as e:
                raise self._late(len(results), ops) from e
            for res in done:
                results[res.op_id - first] = res.data
                stats.append(res.stats)
            if len(results) < ops and time.monotonic() > limit:
                raise self._late(len(results), ops)
        self.next_op = first + ops
        stats.sort(key=lambda s: s.op_id)
        return np.concatenate([results[k] for k in range(ops)]), stats

    def _limit(self, ops: int) -> float:
        """When (time.monotonic()) a call of `ops` ops is late. Every phase ends by its
        deadline, so an op takes at most 2 t_B plus skew; past this bound something
        outside the protocol is wrong: fail, never hang. A backend whose deadlines run
        on another clock bounds the call on that clock (SimNic)."""
        return time.monotonic() + ops * (2 * self.p.t_b_us * 1e-6 + 1.0) + self.wait_slack_s

    def _late(self, got: int, ops: int) -> TimeoutError:
        return TimeoutError(
            f"allreduce: {self.backend} rank {self.rank} got {got}/{ops} ops by the bound "
            "of 2 t_B per op; is every rank calling allreduce with the same length?"
        )

    def _room(self, op_id: int, done: int) -> bool:
        """May op `op_id` start now? `done`: this call's first op id plus the number of
        its results back so far."""
        raise NotImplementedError

    def _start(
        self, op_id: int, chunk: np.ndarray, exponent: int | None, ahead: int | None
    ) -> None:
        """Start one op: exponent None = in-band; ahead: its proposal for op + lead."""
        raise NotImplementedError

    def resync(self) -> None:
        """The next L ops take their exponents from the reliable exchange (in-band
        agreement only; every rank must call this at the same op)."""
        self.exponents.resync(self.next_op)

    def _poll(self, deadline: float) -> list[OpResult]:
        """Wait a little (never past `deadline`, time.monotonic(); TimeoutError there);
        the results that came."""
        raise NotImplementedError

    def calibrate(self, x: np.ndarray, ops: int = 5) -> int:
        """t_B calibrated (host/model/deadline.py calibrate_t_b) from warm-up ops over the
        reliable path (the transport's delays without its loss), run with the configured
        t_B: the max over the ranks, capped by the configured t_B."""
        d = []
        for k in range(ops + 1):
            with self.transport.reliable():
                _, st = self.allreduce(x)
            if k == 0:
                continue  # the first op pays for set-up and start skew: not a sample
            d += phase_times(st)
        t_b = min(self.p.t_b_us, self.agree([calibrate_t_b(d)])[0])  # the slowest rank's view
        self.set_t_b(t_b)
        return t_b


class SoftwareNic(HostNic):
    """The model NIC on a real UDP transport, its ticks from the wall clock."""

    backend = "software"

    def _open(self) -> None:
        p = self.p
        self.nic = NicModel(p, self.rank, self.world)
        fwht_blocks(np.zeros(p.b, dtype=np.int64), p.b)  # compile (or load) the kernel now
        self._t0 = time.monotonic()

    def now_us(self) -> int:
        return int((time.monotonic() - self._t0) * 1e6)

    @property
    def gone(self) -> set[int]:
        return self.nic.gone

    def exclude(self, rank: int) -> None:
        """The driver learnt that `rank` is dead: stop waiting for it."""
        self.nic.exclude(self.now_us(), rank)

    def counters(self) -> dict[str, int]:
        """The model's counters, then the transport's (datagrams, admission drops), then
        how the ops' exponents were chosen (EXP_COUNTERS)."""
        return {**self.nic.counters, **self.transport.counters(), **self.nic.exp_counters}

    def set_t_b(self, t_b_us: int) -> None:
        """A calibrated hard bound for every later phase."""
        self.nic.set_t_b(t_b_us)
        self.p = self.nic.p

    def _room(self, op_id: int, done: int) -> bool:
        return op_id < self.nic.base + self.p.ops_in_flight  # the model's window

    def _start(
        self, op_id: int, chunk: np.ndarray, exponent: int | None, ahead: int | None
    ) -> None:
        self.nic.start_op(self.now_us(), op_id, chunk, exponent, next_proposal=ahead)

    def _poll(self, deadline: float) -> list[OpResult]:
        nic = self.nic
        self._flush()
        t = nic.next_timer()
        wait = 0.002 if t is None else min(max(0, t - self.now_us()) * 1e-6, 0.002)
        for d in self.transport.recv(wait):
            nic.receive_datagram(self.now_us(), d)
        nic.advance(self.now_us())
        self._flush()
        return nic.poll_results()

    def _flush(self) -> None:
        for tx in self.nic.poll_tx():
            self.transport.send(tx.dst, tx.frame[ubt.L2_L4_LEN :])

    def close(self) -> None:
        self.transport.close()


class LocalNic:
    """World 1: the mean of one rank is its own input, so nothing goes on the network (a
    one-process `torchrun` smoke run trains unchanged). Same face as the other backends."""

    backend = "local"

    def __init__(self, p: NicParams, rank: int, transport: UdpTransport) -> None:
        self.p, self.rank, self.world, self.transport = p, rank, 1, transport
        self.gone: set[int] = set()
        self.next_op = 0

    def allreduce(
        self, x: ArrayLike, out: ArrayLike | None = None
    ) -> tuple[ArrayLike, list[OpStats]]:
        torch_in = type(x).__module__.startswith("torch")
        n = x.numel() if torch_in else int(np.size(x))
        if n == 0:
            raise ValueError("allreduce: empty input")
        res = x.detach().clone() if torch_in else np.array(x, dtype=np.float32)
        out = res if out is None else _into(out, res.numpy() if torch_in else res)
        first, self.next_op = self.next_op, self.next_op + -(-n // self.p.c)
        stats = [
            OpStats(k, self.rank, 1, min(self.p.c, n - (k - first) * self.p.c), 0,
                    phase1_reason="complete", phase2_reason="complete")
            for k in range(first, self.next_op)
        ]  # fmt: skip
        return out, stats

    def exclude(self, rank: int) -> None:
        raise ValueError(f"exclude: world 1 has no rank {rank} to exclude")

    def counters(self) -> dict[str, int]:
        return {**dict.fromkeys(COUNTERS, 0), **self.transport.counters()}

    def set_t_b(self, t_b_us: int) -> None:
        self.p = self.p.replace(t_b_us=int(t_b_us))

    def calibrate(self, x: np.ndarray, ops: int = 5) -> int:
        return self.p.t_b_us

    def resync(self) -> None:
        pass

    def close(self) -> None:
        self.transport.close()


def _board(p: NicParams, rank: int, world: int, transport: UdpTransport,
           agree: ExponentAgreement) -> Nic:  # fmt: skip
    """BackendUnavailable only when no board was asked for: a board named by
    OPTIREDUCE_BOARD_IFNAME that fails raises (the rank published the board's address)."""
    from optireduce.host.board_nic import BoardNic

    return BoardNic(p, rank, world, transport, agree)


def _sim(p: NicParams, rank: int, world: int, transport: UdpTransport,
         agree: ExponentAgreement) -> Nic:  # fmt: skip
    from optireduce.host.cosim_nic import SimNic

    return SimNic(p, rank, world, transport, agree)


def _native(p: NicParams, rank: int, world: int, transport: UdpTransport,
            agree: ExponentAgreement) -> Nic:  # fmt: skip
    from optireduce.host.native.nic import NativeNic, NativeUnavailable

    try:
        return NativeNic(p, rank, world, transport, agree)
    except NativeUnavailable as e:
        raise BackendUnavailable(str(e)) from e


def default_backends() -> tuple[str, ...]:
    """board, native, then software; the co-simulation only when asked for, e.g. with the
    environment OPTIREDUCE_NIC=sim (a comma list; software is always the last resort)."""
    env = [b.strip() for b in os.environ.get("OPTIREDUCE_NIC", "").split(",") if b.strip()]
    return (*env, "software") if env else ("board", "native", "software")


def select_nic(
    p: NicParams,
    rank: int,
    world: int,
    *,
    transport: UdpTransport,
    agree: ExponentAgreement,
    prefer: Sequence[str] | None = None,
) -> Nic:
    """The best available backend (of `prefer`, default default_backends()), with one
    log line saying which and why."""
    if world == 1:
        log.info("optireduce rank %d: world 1, the local NIC (each bucket is its own mean)", rank)
        return LocalNic(p, rank, transport)
    reasons = []
    for name in dict.fromkeys(prefer or default_backends()):
        try:
            if name == "board":
                nic = _board(p, rank, world, transport, agree)
            elif name == "sim":
                nic = _sim(p, rank, world, transport, agree)
            elif name == "native":
                nic = _native(p, rank, world, transport, agree)
            elif name == "software":
                nic = SoftwareNic(p, rank, world, transport, agree)
            else:
                raise ValueError(f"select_nic: unknown backend {name!r}")
        except BackendUnavailable as e:
            reasons.append(f"{name}: {e}")
            continue
        why = "; ".join(reasons) if reasons else "requested"
        if getattr(nic, "found", None):
            why = f"{nic.found}; {why}"
        log.info("optireduce rank %d: using the %s NIC (%s)", rank, name, why)
        return nic
    raise BackendUnavailable("no backend available: " + "; ".join(reasons))
