"""NativeNicModel: the native event engine behind NicModel's Python API.

Same methods, same arguments, same return types (Tx, OpResult with OpStats), so that
every user of the model (trace replay, the virtual cluster, the driver) can take either.
The work is done in C++ (host/native/src/engine.cpp) without the GIL; this class only
converts what crosses the boundary. One difference, on purpose: an OpResult's stats are a
snapshot taken at poll_results(), where the model hands out its live OpStats object (which
goes on counting late frames of the op until the op leaves the window).
"""

from __future__ import annotations

import numpy as np

from optireduce import ubt
from optireduce.counters import COUNTERS
from optireduce.host.model.nic_model import InbandExponent, OpResult, Tx, check_world
from optireduce.host.native import _engine, why
from optireduce.op_stats import OpStats
from optireduce.params import NicParams


class NativeError(ImportError):
    """The native engine is not built or does not import."""


class _TcView:
    """One phase's t_C as NicModel.tc shows it (the driver sets `.p` after calibrating t_B)."""

    def __init__(self, nic: NativeNicModel, phase: int) -> None:
        self._nic, self._phase = nic, phase

    @property
    def tc(self) -> int:
        return self._nic._e.tc(self._phase)

    @property
    def p(self) -> NicParams:
        return self._nic.p

    @p.setter
    def p(self, value: NicParams) -> None:
        self._nic.p = value


class NativeNicModel:
    """One NIC: NicModel's event interface, run by the native engine."""

    def __init__(
        self,
        p: NicParams,
        rank: int,
        world: int,
        *,
        addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
        first_op: int = 0,
    ) -> None:
        if _engine is None:
            raise NativeError(why)
        check_world(p, rank, world)
        self._p, self.rank, self.world, self.addressing = p, rank, world, addressing
        self._e = _engine.Engine(
            p, rank, world, addressing.mac_base, addressing.ip_base, first_op=first_op
        )
        self.tc = (_TcView(self, 1), _TcView(self, 2))

    # ---- configuration -----------------------------------------------------------
    @property
    def p(self) -> NicParams:
        return self._p

    @p.setter
    def p(self, value: NicParams) -> None:
        """Only t_B may change on a running NIC (the driver's calibration)."""
        if value.replace(t_b_us=self._p.t_b_us) != self._p:
            raise ValueError("NativeNicModel.p: only t_b_us may change after creation")
        self._e.set_t_b(value.t_b_us)
        self._p = value

    def set_t_b(self, t_b_us: int) -> None:
        """A new hard bound for every phase from now on (calibration): the agreed timeouts
        and the t_C estimators' clamp follow it."""
        self.p = self._p.replace(t_b_us=int(t_b_us))

    # ---- host port ---------------------------------------------------------------
    def start_op(
        self,
        now: int,
        op_id: int,
        data: np.ndarray,
        exponent: int | None,
        *,
        next_proposal: int | None = None,
    ) -> None:
        """Begin op op_id with this worker's chunk (float32) and the agreed exponent
        (None: the in-band one), as NicModel.start_op."""
        if not isinstance(data, np.ndarray) or data.dtype != np.float32 or data.ndim != 1:
            raise TypeError("start_op: data must be a 1-D numpy float32 array")
        self._e.start_op(
            int(now), int(op_id), np.ascontiguousarray(data),
            None if exponent is None else int(exponent),
            None if next_proposal is None else int(next_proposal),
        )  # fmt: skip

    def inband_exponent(self, op_id: int) -> InbandExponent:
        """NicModel.inband_exponent."""
        exp, missing, unknown = self._e.inband_exponent(int(op_id))
        return InbandExponent(exp, tuple(missing), tuple(unknown))

    def put_proposal(self, op_id: int, rank: int, proposal: int | None) -> None:
        """NicModel.put_proposal."""
        self._e.put_proposal(int(op_id), int(rank), None if proposal is None else int(proposal))

    def poll_results(self) -> list[OpResult]:
        return [OpResult(op_id, data, OpStats(**st)) for op_id, data, st in self._e.poll_results()]

    # ---- network port ------------------------------------------------------------
    def receive(self, now: int, frame: bytes) -> None:
        """One Ethernet frame from the network port."""
        self._e.receive(int(now), bytes(frame))

    def receive_datagram(self, now: int, datagram: bytes) -> None:
        """One UBT datagram (the UDP payload), for transports that strip L2-L4."""
        self._e.receive_datagram(int(now), bytes(datagram))

    def poll_tx(self) -> list[Tx]:
        return [Tx(*t) for t in self._e.poll_tx()]

    # ---- time --------------------------------------------------------------------
    def next_timer(self) -> int | None:
        """Earliest tick at which a phase may end without another arrival."""
        return self._e.next_timer()

    def advance(self, now: int) -> None:
        """Fire every timer due at or before `now`, earliest first."""
        self._e.advance(int(now))

    def exclude(self, now: int, rank: int) -> None:
        """The driver learnt that `rank` is dead: stop waiting for it, now and later."""
        self._e.exclude(int(now), int(rank))

    # ---- state -------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """A snapshot of the counters, by the model's names (COUNTERS order)."""
        c = self._e.counters()
        return {k: c[k] for k in COUNTERS}

    @property
    def exp_counters(self) -> dict[str, int]:
        """A snapshot of NicModel.exp_counters."""
        return dict(self._e.exp_counters())

    @property
    def base(self) -> int:
        return self._e.base

    @property
    def last_started(self) -> int:
        return self._e.last_started

    @property
    def gone(self) -> set[int]:
        return set(self._e.gone())

    @property
    def tc_table(self) -> np.ndarray:
        return np.array(
            [[self._e.tc_table(ph, r) for r in range(self.world)] for ph in (1, 2)],
            dtype=np.int64,
        )
