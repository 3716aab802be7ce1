"""N model NICs on a virtual network, in virtual time: simulate_allreduce().

The network is lossless unless told otherwise: every frame leaves its sender's
link after the ones before it (serialization at link_gbps) and arrives latency_us
later. Drops are injected at random (drop_rate, seeded) or exactly (lost).
The shared exponent of each op is agreed as the max of the workers' proposals
(the driver's tiny reliable exchange, instantaneous here). With NicParams.exp_inband
only the first `lead` ops (exp_lead_eff) are agreed that way; every later op takes the
NICs' in-band agreement (each op carries its senders' proposals for op + lead).
host_delay_us makes hosts slow: a reliable exchange then waits for the last of them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from optireduce.host.model import deadline
from optireduce.host.model.impairment import Impairment, ImpairmentSpec
from optireduce.host.model.nic_model import NicModel, Tx
from optireduce.host.model.quantize import agree_exponent, propose_exponent
from optireduce.op_stats import OpStats
from optireduce.params import NicParams


@dataclass
class ClusterStats:
    """Statistics of one simulate_allreduce call (every op of every worker)."""

    world: int
    n: int
    per_worker: list[list[OpStats]]  # [rank][op]
    counters: list[dict[str, int]]  # each NIC's counters at the end
    injected: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0})  # drops by phase
    elapsed_us: int = 0  # virtual time when the last worker had its last result
    t_b_us: int = 0  # the hard bound the NICs ran with
    exp_counters: list[dict[str, int]] = field(default_factory=list)  # each NIC's, at the end

    @property
    def exp_disagreements(self) -> int:
        """Ops whose workers did not all use the same exponent."""
        return sum(len({ops[k].exponent for ops in self.per_worker}) > 1 for k in range(self.ops))

    def _sum(self, name: str) -> int:
        return sum(getattr(s, name) for ops in self.per_worker for s in ops)

    @property
    def ops(self) -> int:
        return len(self.per_worker[0])

    @property
    def lost_phase1(self) -> int:
        return self._sum("lost_phase1")

    @property
    def lost_phase2(self) -> int:
        return self._sum("lost_phase2")

    @property
    def packets_lost(self) -> int:
        return self.lost_phase1 + self.lost_phase2

    @property
    def saturations(self) -> int:
        return self._sum("saturations")

    def timeouts(self, reason: str) -> int:
        return sum(
            (s.phase1_reason == reason) + (s.phase2_reason == reason)
            for ops in self.per_worker
            for s in ops
        )

    @property
    def contributor_hist(self) -> list[int]:
        return np.sum([s.contributor_hist for ops in self.per_worker for s in ops], axis=0).tolist()

    def summary(self) -> dict:
        return {
            "world": self.world,
            "n": self.n,
            "ops": self.ops,
            "lost_phase1": self.lost_phase1,
            "lost_phase2": self.lost_phase2,
            "injected_phase1": self.injected[1],
            "injected_phase2": self.injected[2],
            "saturations": self.saturations,
            "complete_phases": self.timeouts("complete"),
            "early_timeouts": self.timeouts("early"),
            "deadline_timeouts": self.timeouts("deadline"),
            "contributor_hist": self.contributor_hist,
            "elapsed_us": self.elapsed_us,
            "t_b_us": self.t_b_us,
        }


def _check_inputs(inputs: Sequence[np.ndarray], p: NicParams) -> int:
    if len(inputs) < 2:
        raise ValueError(f"simulate_allreduce: need at least 2 workers, got {len(inputs)}")
    if len(inputs) > p.n_max:
        raise ValueError(f"simulate_allreduce: {len(inputs)} workers > n_max={p.n_max}")
    n = None
    for r, x in enumerate(inputs):
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
            raise TypeError(f"simulate_allreduce: inputs[{r}] must be a 1-D float32 array")
        if n is None:
            n = len(x)
        elif len(x) != n:
            raise ValueError(f"simulate_allreduce: inputs[{r}] has {len(x)} elements, not {n}")
    if not n:
        raise ValueError("simulate_allreduce: inputs are empty")
    return n


def _check_lost(lost: Iterable[tuple[int, int, int, int]], world: int) -> set:
    out = set()
    for t in lost:
        if len(t) != 4 or t[0] not in (1, 2):
            raise ValueError(f"lost: {t!r} is not (phase 1|2, src, dst, packet_index)")
        if not (0 <= t[1] < world and 0 <= t[2] < world and t[3] >= 0):
            raise ValueError(f"lost: {t!r} names a rank outside 0..{world - 1}")
        if t[1] == t[2]:
            raise ValueError(f"lost: {t!r}: a rank sends itself nothing over the network")
        out.add(tuple(int(v) for v in t))
    return out


def simulate_allreduce(
    inputs: Sequence[np.ndarray],
    *,
    params: NicParams | None = None,
    drop_rate: float = 0.0,
    seed: int = 0,
    lost: Iterable[tuple[int, int, int, int]] | None = None,
    latency_us: int = 5,
    link_gbps: float = 10.0,
    calibrate: bool = True,
    impairment: ImpairmentSpec | None = None,
    host_delay_us: Sequence[int] | None = None,
) -> tuple[list[np.ndarray], ClusterStats]:
    """AllReduce (mean) of `inputs` through N model NICs; returns (outputs, stats).

    lost: (phase, src, dst, packet_index) tuples dropped in every op (phase 1 =
    scatter, 2 = gather). Inputs longer than params.c run as several ops, K in flight.
    calibrate: first set t_B as the driver does, from reliable warm-up ops
    (calibrate_t_b): t_B = min(params.t_b_us, 2 x P95 of the warm-up phases);
    False keeps params.t_b_us.
    impairment: per-packet extra delay, loss, duplication and reordering on every
    link (host/model/impairment.py), seeded from `seed`.
    host_delay_us: per rank, the ticks its host takes to hand the NIC an op once the NIC
    has room (a straggler). An op whose exponent is a reliable exchange starts everywhere
    when the last host is ready; an in-band op (exp_inband, op >= K) starts when its own
    host is. None: every host is ready at once (no exchange wait, as before).
    """
    p = params or NicParams()
    n = _check_inputs(inputs, p)
    world = len(inputs)
    if not 0.0 <= drop_rate < 1.0:
        raise ValueError(f"drop_rate={drop_rate}: must be in [0, 1)")
    if latency_us < 0 or link_gbps <= 0:
        raise ValueError("latency_us must be >= 0 and link_gbps > 0")
    lost_set = _check_lost(lost or (), world)
    if host_delay_us is not None:
        host_delay_us = [int(d) for d in host_delay_us]
        if len(host_delay_us) != world or min(host_delay_us) < 0:
            raise ValueError(f"host_delay_us: {world} ticks >= 0, one per worker")
    if calibrate:
        reliable = impairment.reliable() if impairment else None
        p = p.replace(t_b_us=calibrate_t_b(inputs, p, latency_us, link_gbps, reliable))
    return _run(inputs, n, p, drop_rate, seed, lost_set, latency_us, link_gbps, impairment,
                host_delay_us=host_delay_us)  # fmt: skip


def calibrate_t_b(
    inputs: Sequence[np.ndarray],
    p: NicParams,
    latency_us: int = 5,
    link_gbps: float = 10.0,
    impairment: ImpairmentSpec | None = None,
) -> int:
    """t_B from a warm-up on this virtual network: deadline.calibrate_t_b of the phases
    of the first K chunks run over the reliable (lossless) network with the configured
    t_B, every worker's phases together, capped by the configured t_B."""
    m = min(len(inputs[0]), p.ops_in_flight * p.c)
    warm = [np.ascontiguousarray(x[:m]) for x in inputs]
    _, st = _run(warm, m, p, 0.0, 0, set(), latency_us, link_gbps, impairment)
    d = deadline.phase_times(s for ops in st.per_worker for s in ops)
    return min(p.t_b_us, deadline.calibrate_t_b(d))


def _run(
    inputs: Sequence[np.ndarray],
    n: int,
    p: NicParams,
    drop_rate: float,
    seed: int,
    lost_set: set,
    latency_us: int,
    link_gbps: float,
    impairment: ImpairmentSpec | None = None,
    tap: Callable[[str, int, int, object], None] | None = None,
    host_delay_us: Sequence[int] | None = None,
) -> tuple[list[np.ndarray], ClusterStats]:
    """The event loop. tap(kind, tick, rank, what) sees every host command ("start":
    (op_id, data, exponent)) and every delivered frame ("frame": bytes), for traces."""
    world = len(inputs)
    rng = np.random.default_rng(seed)
    imp = Impairment(impairment, seed + 0x5EED) if impairment else None

    bounds = [(s, min(s + p.c, n)) for s in range(0, n, p.c)]
    props = [[propose_exponent(x[a:b], p) for a, b in bounds] for x in inputs]  # [rank][op]
    exps = [agree_exponent([pr[k] for pr in props]) for k in range(len(bounds))]
    k_in = p.exp_lead_eff  # ops before this one have no in-band proposals
    nics = [NicModel(p, r, world) for r in range(world)]
    stats = ClusterStats(world, n, [[] for _ in range(world)], [], t_b_us=p.t_b_us)
    results: list[dict[int, np.ndarray]] = [{} for _ in range(world)]
    next_op = [0] * world
    link_free = [0] * world
    # (t, seq, kind, rank, what): kind 0 a frame arrives, 1 a timer, 2 the host starts op `what`
    events: list[tuple[int, int, int, int, bytes | int | None]] = []
    ready: dict[int, dict[int, int]] = {}  # op -> {rank: tick its host is ready} (exchange)
    scheduled = [False] * world  # the rank's next op has a start event pending
    seq = 0
    wakes: list[set[int]] = [set() for _ in range(world)]

    def push(t: int, kind: int, rank: int, frame: bytes | int | None = None) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, rank, frame))
        seq += 1

    def send(tx: Tx, src: int) -> None:
        ser = math.ceil(len(tx.frame) * 8 / (link_gbps * 1000.0))
        start = max(tx.time_us, link_free[src])
        link_free[src] = start + ser
        dropped = (tx.phase, src, tx.dst, tx.pkt_index) in lost_set
        if drop_rate > 0.0 and rng.random() < drop_rate:
            dropped = True
        delays = imp.fates() if imp and not dropped else [0.0]
        if dropped or not delays:
            stats.injected[tx.phase] += 1
            return
        for d in delays:
            push(start + ser + latency_us + round(d), 0, tx.dst, tx.frame)

    def start(r: int, k: int, now: int) -> None:
        a, b = bounds[k]
        chunk = np.ascontiguousarray(inputs[r][a:b])
        inband = p.exp_inband and k >= k_in
        nxt = props[r][k + k_in] if p.exp_inband and k + k_in < len(bounds) else None
        exp = nics[r].inband_exponent(k).exponent if inband else exps[k]
        if tap is not None:
            tap("start", now, r, (k, chunk, exp))
        nics[r].start_op(now, k, chunk, None if inband else exp, next_proposal=nxt)
        next_op[r] += 1

    def start_ops(r: int, now: int) -> None:
        while next_op[r] < len(bounds) and next_op[r] < nics[r].base + p.ops_in_flight:
            k = next_op[r]
            if host_delay_us is None:
                start(r, k, now)
                continue
            if scheduled[r]:
                return
            scheduled[r] = True
            t = now + host_delay_us[r]
            if p.exp_inband and k >= k_in:
                push(t, 2, r, k)
                return
            ready.setdefault(k, {})[r] = t
            if len(ready[k]) == world:  # the reliable exchange ends with its last member
                t_all = max(ready.pop(k).values())
                for q in range(world):
                    push(t_all, 2, q, k)
            return

    def settle(r: int, now: int) -> None:
        nic = nics[r]
        while True:
            for tx in nic.poll_tx():
                send(tx, r)
            done = nic.poll_results()
            for res in done:
                results[r][res.op_id] = res.data
                stats.per_worker[r].append(res.stats)
            if not done:
                break
            start_ops(r, now)
        t = nic.next_timer()
        if t is not None and t not in wakes[r]:
            wakes[r].add(t)
            push(max(t, now), 1, r)

    for r in range(world):
        start_ops(r, 0)
        settle(r, 0)
    slack = 20 * impairment.median_us * impairment.p99_ratio if impairment else 0
    slack += len(bounds) * max(host_delay_us or [0])
    horizon = int(
        len(bounds) * 2 * (p.t_b_us + latency_us + 1) + 16 * world * p.packets_for(n) + slack + 1000
    )
    now = 0
    while events:
        now, _, kind, r, frame = heapq.heappop(events)
        if now > horizon:
            raise RuntimeError(f"simulate_allreduce: no end by t={horizon} us (a model bug)")
        if kind == 0:
            if tap is not None:
                tap("frame", now, r, frame)
            nics[r].receive(now, frame)
        elif kind == 2:
            scheduled[r] = False
            start(r, frame, now)
            start_ops(r, now)
        else:
            wakes[r].discard(now)
            nics[r].advance(now)
        settle(r, now)
    missing = [r for r in range(world) if len(results[r]) != len(bounds)]
    if missing:
        raise RuntimeError(f"simulate_allreduce: workers {missing} did not finish (a model bug)")
    stats.elapsed_us = max(s.end_us for ops in stats.per_worker for s in ops)
    stats.counters = [dict(nic.counters) for nic in nics]
    stats.exp_counters = [dict(getattr(nic, "exp_counters", {})) for nic in nics]
    for ops in stats.per_worker:
        ops.sort(key=lambda s: s.op_id)
    outputs = [np.concatenate([results[r][k] for k in range(len(bounds))]) for r in range(world)]
    return outputs, stats
