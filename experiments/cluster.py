"""Cluster simulator (SimPy, virtual time in microseconds): reliable ring, reliable TAR
and OptiReduce on identical link randomness, 8..64 workers.

Network. Every worker has one full-duplex link to a switch: an uplink and a downlink,
both of `gbps`. A packet is serialized on its sender's uplink (FIFO), spends a random
delay in the network, then is serialized on the receiver's downlink (FIFO, so incast
queues). It is handed to the receiver at the first integer tick after its last bit is
in. The link queues run in exact (float) time, so no per-packet rounding accumulates.

Randomness is keyed, not sequential: the fate of a packet (lost or not, its delay) is
a function of (seed, op, src, dst, seq, attempt) only, where seq counts the packets
src sends to dst in that op (every phase or step, in send order) and attempt the
retransmissions. The k-th packet from 3 to 4 in op 17 has the same delay whatever the
algorithm and whenever it is sent, so the algorithms are compared on identical links.
(host/model/impairment.Impairment draws from one sequential stream, which would make a
packet's delay depend on the order of the other sends; ImpairmentSpec gives the
parameters.)

Delay ("tail" R): lognormal, median m, sigma = ln(R) / z_0.99 (ImpairmentSpec.sigma),
so P99/P50 of one packet's delay is R. "cloud": a lognormal body with P99/P50 = 2 plus,
with probability `spike_prob` per block of `spike_block` consecutive packets of one
(op, src, dst), an extra delay for the whole block (a congestion episode), Pareto with
scale `spike_scale` x m and shape `spike_shape` (heavy tail: infinite variance),
capped at `spike_cap` x m. See docs/results.md for the resulting quantiles.

Algorithms:
- reliable_ring: reduce-scatter then allgather, 2(N-1) steps; a worker sends step s+1
  as soon as step s's chunk is complete. A lost packet is resent by its sender
  rto_us x 2^attempt after it left (an idealized reliable transport: acks are free and
  never lost, no spurious retransmissions).
- reliable_tar: transpose allreduce with OptiReduce's packetization: packet i belongs
  to rank i mod N; scatter to the owners, each owner waits for all of its slots, then
  sends the sums to every rank, which waits for all of them. Same retransmissions.
- optireduce: N host/model/nic_model.NicModel instances driven as virtual_cluster does
  (frames, timers at next_timer()). The shared exponent costs what the hook pays for it
  (host/exponent_plan.py), on the same links: with `exponents="inband"` (the hook's
  setting on host NICs) the first L = exp_lead_eff ops, and the L ops after an op that
  saturated a rank's in-band prediction, start only once a reliable all-gather of the
  proposals (one small control frame from every rank to every other, resent when lost,
  serialized on the uplinks with the data) has reached the rank; every other op takes
  its exponent from the proposals carried L ops ahead in the data packets, at no extra
  cost. With `exponents="exchange"` (the co-simulated gateware's setting) every op waits
  for that all-gather. Its frames draw their fate from their own key space, so the data
  packets keep their keyed delays.
  t_B is calibrated as the driver does: `warmup` lossless ops on the same links (the
  first is not counted), t_B = 2 x P95 of each rank's phase durations, max over ranks.
- optireduce_no_early: the same with alpha_q8 = 256 (alpha = 1): the idle gap equals T,
  so the idle early timeout can end a phase before its deadline only if every packet
  came in before the phase began. The "peers gone" early end stays: it is knowledge
  (a peer sent a later op), not a timeout. LAST flags are unchanged.
- optireduce_no_rht: NicParams(rht=False).

Ops run back to back: op k+1 is ready on every worker at the same tick, compute_us
after the last worker had op k's result (an exchange, where one is needed, starts
then). An op's latency is from that tick to the last worker's result. entries_lost is
the fraction of gradient entries whose reduced packet a worker missed (contributor
count 0 in its gather buffer), averaged over workers and ops; the reliable baselines
lose nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
import simpy

from optireduce import ubt
from optireduce.host.exponent_plan import ExponentPlan
from optireduce.host.model.deadline import calibrate_t_b, phase_times
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.model.nic_model import NicModel
from optireduce.host.model.packetizer import gather_order, scatter_order
from optireduce.host.model.quantize import agree_exponent, propose_exponent
from optireduce.params import NicParams

ALGOS = (
    "reliable_ring",
    "reliable_tar",
    "optireduce",
    "optireduce_no_early",
    "optireduce_no_rht",
)
TARGETS = {
    "optireduce_p99_over_ring_p99": 0.5,
    "optireduce_p99_over_p50": 1.3,
    "entries_lost": 0.01,
}

# Paper-like sizes that run in reasonable time in Python: P = 1024 elements (4 KiB
# payload, a jumbo frame), B = 4096, one op = one 1 MiB bucket (C = 262144 elements).
DEFAULT_P, DEFAULT_B, DEFAULT_BUCKET = 1024, 4096, 1 << 20
NIC_FIELDS = ("p", "b")  # the NicParams fields a ClusterConfig carries (c, n_max: derived)
EXPONENTS = ("inband", "exchange")  # how OptiReduce agrees each op's exponent
CONTROL_OP_KEY = -2_000_000  # control frames of op k draw from key CONTROL_OP_KEY - k
# one control frame: L2-L4 headers, the reliable layer's 32-byte header, an 8-byte
# exchange sequence number and one 8-byte value per agreed op (host/control.py)
CONTROL_HEADER_BYTES = 32 + 8


# ---- keyed randomness ----------------------------------------------------------------
_M64 = (1 << 64) - 1
_GOLD = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    """splitmix64 finalizer on a Python int."""
    x = (x + _GOLD) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(_GOLD)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _unit(h: np.ndarray, stream: int) -> np.ndarray:
    """Uniform in (0, 1) from hash h and a stream number."""
    v = _mix_np(h ^ np.uint64(_mix(stream)))
    return ((v >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


@dataclass(frozen=True)
class LinkSpec:
    """Every link of the cluster: bandwidth, delay distribution and loss."""

    gbps: float = 10.0
    median_us: float = 100.0
    p99_ratio: float = 3.0  # P99/P50 of the lognormal (body, for "cloud")
    loss: float = 0.0
    spike_prob: float = 0.0  # per block of spike_block packets of one (op, src, dst)
    spike_scale: float = 0.0  # Pareto scale, in medians
    spike_shape: float = 1.5
    spike_cap: float = 100.0  # in medians
    spike_block: int = 16
    name: str = ""

    @property
    def impairment(self) -> ImpairmentSpec:
        return ImpairmentSpec(median_us=self.median_us, p99_ratio=self.p99_ratio, loss=self.loss)


def link_spec(
    tail: str | float, median_us: float = 100.0, loss: float = 0.0, gbps: float = 10.0
) -> LinkSpec:
    """'1.5', '3', any ratio >= 1, or 'cloud' (lognormal P99/P50 = 2 plus Pareto spikes)."""
    if str(tail) == "cloud":
        return LinkSpec(
            gbps, median_us, 2.0, loss, spike_prob=0.002, spike_scale=10.0, name="cloud"
        )
    r = float(tail)
    if r < 1:
        raise ValueError(f"tail={tail!r}: a P99/P50 ratio >= 1, or 'cloud'")
    return LinkSpec(gbps, median_us, r, loss, name=f"lognormal P99/P50={r:g}")


class LinkDraws:
    """Fate of every packet, as a function of (op, src, dst, seq, attempt) and the seed."""

    def __init__(self, link: LinkSpec, seed: int = 0, record: bool = False) -> None:
        self.link, self.seed = link, seed
        self.sigma = link.impairment.sigma
        self._cache: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.log: dict[tuple[int, int, int, int, int], float] | None = {} if record else None

    def table(self, op: int, src: int, dst: int, attempt: int, n: int) -> tuple[np.ndarray, ...]:
        """(lost: bool[n], delay_us: float[n]) of seqs 0..n-1 (independent of n)."""
        lk = self.link
        base = self.seed & _M64
        for v in (op, src, dst, attempt):
            base = _mix(base ^ (v & _M64))
        seq = np.arange(n, dtype=np.uint64)
        h = _mix_np(seq * np.uint64(_GOLD) ^ np.uint64(base))
        lost = _unit(h, 1) < lk.loss if lk.loss else np.zeros(n, dtype=bool)
        u1, u2 = _unit(h, 2), _unit(h, 3)
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        delay = lk.median_us * np.exp(self.sigma * z)
        if lk.spike_prob:
            hb = _mix_np((seq // np.uint64(lk.spike_block)) * np.uint64(_GOLD) ^ np.uint64(base))
            hb = _mix_np(hb ^ np.uint64(0x5B1CE))
            hit = _unit(hb, 1) < lk.spike_prob
            extra = lk.spike_scale * _unit(hb, 2) ** (-1.0 / lk.spike_shape)
            delay = delay + np.where(hit, np.minimum(extra, lk.spike_cap) * lk.median_us, 0.0)
        return lost, delay

    def fate(self, op: int, src: int, dst: int, seq: int, attempt: int) -> tuple[bool, float]:
        key = (op, src, dst, attempt)
        t = self._cache.get(key)
        if t is None or seq >= len(t[1]):
            n = max(64, seq + 1, 2 * len(t[1]) if t else 0)
            t = self._cache[key] = self.table(op, src, dst, attempt, n)
        lost, d = bool(t[0][seq]), float(t[1][seq])
        if self.log is not None:
            self.log[(op, src, dst, seq, attempt)] = d
        return lost, d

    def forget_before(self, op: int) -> None:
        for k in [k for k in self._cache if k[0] < op]:
            del self._cache[k]

    def quantiles(self, samples: int = 200_000) -> dict[str, float]:
        """Quantiles of one packet's delay (lost packets included), from keyed draws."""
        d = np.concatenate(
            [self.table(-1_000_000 - k, 0, 1, 0, 10_000)[1] for k in range(samples // 10_000)]
        )
        p50, p99, p999 = np.percentile(d, [50, 99, 99.9])
        return {
            "p50_us": round(float(p50), 2),
            "p99_us": round(float(p99), 2),
            "p999_us": round(float(p999), 2),
            "p99_over_p50": round(float(p99 / p50), 3),
        }


# ---- the network -----------------------------------------------------------------------
class Network:
    """Uplink FIFO -> keyed delay -> downlink FIFO -> delivery at an integer tick."""

    def __init__(self, env: simpy.Environment, world: int, link: LinkSpec, draws: LinkDraws,
                 frame_bytes: int, rto_us: int) -> None:  # fmt: skip
        self.env, self.draws, self.rto_us = env, draws, rto_us
        self.frame_bytes = frame_bytes
        self.ser = frame_bytes * 8 / (link.gbps * 1000.0)  # microseconds per frame
        self.up_free = [0.0] * world
        self.down_free = [0.0] * world
        self.seq: dict[tuple[int, int, int], int] = {}
        self.sent = self.lost = self.retransmissions = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _ev: fn())

    def next_seq(self, op: int, src: int, dst: int) -> int:
        k = (op, src, dst)
        s = self.seq.get(k, 0)
        self.seq[k] = s + 1
        return s

    def send(self, src: int, dst: int, op: int, deliver: Callable[[int], None], *,
             when: float | None = None, lossless: bool = False, reliable: bool = False,
             seq: int | None = None, attempt: int = 0, nbytes: int | None = None
             ) -> None:  # fmt: skip
        """Put one frame on src's uplink at `when` (default now). deliver(tick) runs at the
        receiver. reliable: a lost frame is sent again rto_us * 2^attempt after it left.
        nbytes: the frame's length when it is not a data frame's."""
        if seq is None:
            seq = self.next_seq(op, src, dst)
        ser = self.ser if nbytes is None else nbytes * self.ser / self.frame_bytes
        start = max(self.env.now if when is None else when, self.up_free[src])
        end = self.up_free[src] = start + ser
        self.sent += 1
        lost, d = self.draws.fate(op, src, dst, seq, attempt)
        if lost and not lossless:
            self.lost += 1
            if reliable:
                self.retransmissions += 1
                self.at(
                    start + self.rto_us * (1 << attempt),
                    lambda: self.send(
                        src,
                        dst,
                        op,
                        deliver,
                        lossless=lossless,
                        reliable=True,
                        seq=seq,
                        attempt=attempt + 1,
                        nbytes=nbytes,
                    ),
                )
            return
        self.at(end + d, lambda: self._switch(dst, deliver, ser))

    def _switch(self, dst: int, deliver: Callable[[int], None], ser: float) -> None:
        start = max(self.env.now, self.down_free[dst])
        end = self.down_free[dst] = start + ser
        tick = math.ceil(end - 1e-9)
        self.at(tick, lambda: deliver(tick))


# ---- configuration and results --------------------------------------------------------
@dataclass(frozen=True)
class ClusterConfig:
    workers: int = 8
    link: LinkSpec = field(default_factory=LinkSpec)
    ops: int = 100
    bucket_bytes: int = DEFAULT_BUCKET
    p: int = DEFAULT_P
    b: int = DEFAULT_B
    warmup: int = 5  # OptiReduce calibration ops (+1 not counted, as the driver)
    compute_us: int = 0  # compute time between ops
    rto_us: int = 1000  # reliable baselines' retransmission timeout
    seed: int = 0
    exponents: str = "inband"  # OptiReduce's exponent agreement (EXPONENTS)

    def __post_init__(self) -> None:
        if self.exponents not in EXPONENTS:
            raise ValueError(f"exponents={self.exponents!r}: one of {EXPONENTS}")

    @property
    def n(self) -> int:
        return self.bucket_bytes // 4

    def params(self, algo: str = "optireduce") -> NicParams:
        c = -(-self.n // self.b) * self.b
        p = NicParams(p=self.p, b=self.b, c=c, n_max=max(64, self.workers), t_b_us=10_000_000,
                      exp_inband=self.exponents == "inband")  # fmt: skip
        if algo == "optireduce_no_early":
            p = p.replace(alpha_q8=256)
        elif algo == "optireduce_no_rht":
            p = p.replace(rht=False)
        return p

    def frame_bytes(self) -> int:
        return ubt.L2_L4_LEN + ubt.HEADER_LEN + 4 * self.p

    def settings(self) -> dict:
        d = asdict(self)
        d["link"] = {k: v for k, v in asdict(self.link).items() if v or k in ("loss",)}
        p = self.params()
        d.update(elements=self.n, c=p.c, packets_per_op=p.packets_for(self.n),
                 frame_bytes=self.frame_bytes(), alpha_q8=p.alpha_q8,
                 last_percent=p.last_percent)  # fmt: skip
        return d


@dataclass
class AlgoResult:
    algo: str
    latency_us: list[int]  # per measured op
    entries_lost: list[float]  # per measured op, mean over workers
    contributions_lost: list[float] = field(default_factory=list)  # phase-1 share, OptiReduce
    rel_l2_error: list[float] = field(default_factory=list)  # vs the float64 mean, OptiReduce
    phases: dict[str, int] = field(default_factory=dict)  # complete/early/deadline counts
    exchanges: int = 0  # measured ops that waited for an exponent all-gather
    t_b_us: int = 0
    sent: int = 0
    lost: int = 0
    retransmissions: int = 0
    outputs: list[np.ndarray] | None = None  # concatenated results per worker (keep_outputs)
    delays: dict | None = None  # (op, src, dst, seq, attempt) -> delay (record_delays)

    def summary(self) -> dict:
        lat = np.asarray(self.latency_us, dtype=np.float64) / 1000.0
        p50, p99 = np.percentile(lat, [50, 99])
        out = {
            "p50_ms": round(float(p50), 4),
            "p99_ms": round(float(p99), 4),
            "entries_lost": round(float(np.mean(self.entries_lost)), 6),
            "mean_ms": round(float(lat.mean()), 4),
            "max_ms": round(float(lat.max()), 4),
            "packets_sent": self.sent,
            "packets_dropped": self.lost,
        }
        if self.algo.startswith("reliable"):
            out["retransmissions"] = self.retransmissions
        else:
            out.update(
                t_b_us=self.t_b_us,
                exponent_exchanges=self.exchanges,
                contributions_lost=round(float(np.mean(self.contributions_lost)), 6),
                rel_l2_error=float(f"{np.mean(self.rel_l2_error):.3e}"),
                phases=self.phases,
            )
        return out


def _gradients(cfg: ClusterConfig, k: int) -> list[np.ndarray]:
    rng = np.random.default_rng([cfg.seed, 0x6AAD, k])
    g = rng.standard_normal((cfg.workers, cfg.n), dtype=np.float32)
    return list(g)


# ---- reliable baselines ----------------------------------------------------------------
def _run_reliable(algo: str, cfg: ClusterConfig, record: bool = False) -> AlgoResult:
    env = simpy.Environment()
    world = cfg.workers
    draws = LinkDraws(cfg.link, cfg.seed, record)
    net = Network(env, world, cfg.link, draws, cfg.frame_bytes(), cfg.rto_us)
    n_packets = -(-cfg.n // cfg.p)
    res = AlgoResult(algo, [], [])

    def ring_op(op: int) -> simpy.Event:
        m = -(-cfg.n // (world * cfg.p))  # packets per chunk
        steps = 2 * (world - 1)
        got = [[0] * steps for _ in range(world)]
        ev = [[env.event() for _ in range(steps)] for _ in range(world)]

        def arrive(r: int, s: int) -> None:
            got[r][s] += 1
            if got[r][s] == m:
                ev[r][s].succeed()

        def worker(r: int):
            right = (r + 1) % world
            for s in range(steps):  # send step s's chunk, then wait for the left one's
                for _ in range(m):
                    net.send(r, right, op, lambda _t, s=s: arrive(right, s), reliable=True)
                yield ev[r][s]

        return env.all_of([env.process(worker(r)) for r in range(world)])

    def tar_op(op: int) -> simpy.Event:
        mine = [len(range(r, n_packets, world)) for r in range(world)]
        need1 = [(world - 1) * mine[r] for r in range(world)]
        need2 = [n_packets - mine[r] for r in range(world)]
        got1, got2 = [0] * world, [0] * world
        ev1 = [env.event() for _ in range(world)]
        ev2 = [env.event() for _ in range(world)]

        def arrive(r: int, phase: int) -> None:
            if phase == 1:
                got1[r] += 1
                if got1[r] == need1[r]:
                    ev1[r].succeed()
            else:
                got2[r] += 1
                if got2[r] == need2[r]:
                    ev2[r].succeed()

        def worker(r: int):
            for _i, dst, _last in scatter_order(n_packets, world, r, 1):
                net.send(r, dst, op, lambda _t, d=dst: arrive(d, 1), reliable=True)
            if need1[r]:
                yield ev1[r]
            slots = np.arange(r, n_packets, world)
            for _row, _i, dst, _last in gather_order(slots, world, r, 1):
                net.send(r, dst, op, lambda _t, d=dst: arrive(d, 2), reliable=True)
            if need2[r]:
                yield ev2[r]

        return env.all_of([env.process(worker(r)) for r in range(world)])

    one_op = ring_op if algo == "reliable_ring" else tar_op

    def controller():
        for k in range(cfg.ops):
            start = env.now
            draws.forget_before(k - 1)
            yield one_op(k)
            res.latency_us.append(int(env.now - start))
            res.entries_lost.append(0.0)
            if cfg.compute_us:
                yield env.timeout(cfg.compute_us)

    env.process(controller())
    env.run()
    res.sent, res.lost, res.retransmissions = net.sent, net.lost, net.retransmissions
    res.delays = draws.log
    return res


# ---- OptiReduce on model NICs ----------------------------------------------------------
def _run_optireduce(
    algo: str,
    cfg: ClusterConfig,
    record: bool = False,
    inputs: Sequence[np.ndarray] | None = None,
    keep_outputs: bool = False,
) -> AlgoResult:
    env = simpy.Environment()
    world, p = cfg.workers, cfg.params(algo)
    draws = LinkDraws(cfg.link, cfg.seed, record)
    net = Network(env, world, cfg.link, draws, cfg.frame_bytes(), cfg.rto_us)
    nics = [NicModel(p, r, world) for r in range(world)]
    wakes: list[set[int]] = [set() for _ in range(world)]
    warm = cfg.warmup + 1 if cfg.warmup else 0
    if inputs is not None:
        bounds = [(a, min(a + p.c, len(inputs[0]))) for a in range(0, len(inputs[0]), p.c)]
        n_ops = len(bounds)
    else:
        n_ops = cfg.ops
    res = AlgoResult(algo, [], [])
    outputs: list[list[np.ndarray]] = [[] for _ in range(world)]
    cur = {"op": -1, "pending": 0, "done": None, "stats": []}

    def key(op_id: int) -> int:
        return op_id - warm  # measured op k has key k in every algorithm; warm-up < 0

    def settle(r: int, now: int) -> None:
        nic = nics[r]
        for tx in nic.poll_tx():
            net.send(r, tx.dst, key(tx.op_id), lambda t, d=tx.dst, f=tx.frame: deliver(d, t, f),
                     when=max(tx.time_us, now), lossless=tx.op_id < warm)  # fmt: skip
        for out in nic.poll_results():
            if out.op_id != cur["op"]:
                raise RuntimeError(f"cluster: result of op {out.op_id} during op {cur['op']}")
            cur["stats"].append(out.stats)
            cur["out"].append(out.data)
            if keep_outputs and out.op_id >= warm:
                outputs[r].append(out.data)
            cur["pending"] -= 1
            if cur["pending"] == 0:
                cur["done"].succeed()
        t = nic.next_timer()
        if t is not None and t not in wakes[r]:
            wakes[r].add(t)
            net.at(max(t, now), lambda: wake(r, t))

    def deliver(r: int, tick: int, frame: bytes) -> None:
        nics[r].receive(tick, frame)
        settle(r, tick)

    def wake(r: int, t: int) -> None:
        wakes[r].discard(t)
        now = int(env.now)
        nics[r].advance(now)
        settle(r, now)

    def calibrate(phase_us: list[list[int]]) -> int:
        t_b = min(p.t_b_us, max(calibrate_t_b(d) for d in phase_us))
        for nic in nics:
            nic.set_t_b(t_b)
        return t_b

    plans = [ExponentPlan(p, 0) for _ in range(world)]  # every rank's, as the hook's
    control_bytes = ubt.L2_L4_LEN + CONTROL_HEADER_BYTES + 8

    def exchange(k: int, begin: Callable[[int, int], None]) -> None:
        """The proposals' reliable all-gather (host/control.py): every rank sends one
        control frame to every other; rank r begins op k when it has all of them."""
        heard = [0] * world

        def arrive(q: int, tick: int) -> None:
            heard[q] += 1
            if heard[q] == world - 1:
                begin(q, tick)

        for r in range(world):
            for q in range(world):
                if q != r:
                    net.send(r, q, CONTROL_OP_KEY - k, lambda t, q=q: arrive(q, t),
                             reliable=True, nbytes=control_bytes)  # fmt: skip

    def controller():
        phase_us: list[list[int]] = [[] for _ in range(world)]
        for k in range(warm + n_ops):
            start = int(env.now)
            if k >= warm and inputs is not None:
                a, b = bounds[k - warm]
                data = [np.ascontiguousarray(x[a:b]) for x in inputs]
            else:
                data = _gradients(cfg, k)
            props = [propose_exponent(x, p) for x in data]
            # each rank's plan for this op (one op per call, as one bucket per op): the
            # exponent from the exchange, or None (in-band), and the proposal it carries
            agreed = agree_exponent(props)
            planned = [pl.plan([props[r]], k, lambda _own, e=agreed: [e])
                       for r, pl in enumerate(plans)]  # fmt: skip
            exp = planned[0][0][0]
            cur.update(op=k, pending=world, done=env.event(), stats=[], out=[])
            draws.forget_before(key(k) - 1)

            def begin(r: int, tick: int, k=k, data=data, exp=exp, planned=planned) -> None:
                nics[r].start_op(tick, k, data[r], exp, next_proposal=planned[r][1][0])
                settle(r, tick)

            if exp is None:  # in-band: every NIC agrees from what came in, now
                for r in range(world):
                    nics[r].start_op(start, k, data[r], None, next_proposal=planned[r][1][0])
                for r in range(world):
                    settle(r, start)
            else:
                exchange(k, begin)
                res.exchanges += k >= warm
            yield cur["done"]
            stats = cur["stats"]
            if exp is None and any(s.sat_quantize for s in stats):
                # a prediction too small: the hook's decision exchange sends every rank
                # back to the all-gather for the next L ops
                for pl in plans:
                    pl.resync(k + 1)
            if k < warm:
                if k > 0:
                    for s in stats:
                        phase_us[s.rank] += phase_times([s])
                if k == warm - 1:
                    res.t_b_us = calibrate(phase_us)
            else:
                res.latency_us.append(max(s.end_us for s in stats) - start)
                npk = p.packets_for(len(data[0]))
                res.entries_lost.append(
                    float(np.mean([s.contributor_hist[0] / npk for s in stats]))
                )
                res.contributions_lost.append(
                    float(np.mean([s.lost_phase1 / max(1, s.p1_expected) for s in stats]))
                )
                ref = np.zeros(len(data[0]), dtype=np.float64)
                for x in data:
                    ref += x
                ref /= world
                norm = float(np.linalg.norm(ref)) or 1.0
                res.rel_l2_error.append(
                    float(np.mean([np.linalg.norm(o - ref) / norm for o in cur["out"]]))
                )
                for s in stats:
                    for reason in (s.phase1_reason, s.phase2_reason):
                        res.phases[reason] = res.phases.get(reason, 0) + 1
            if cfg.compute_us:
                yield env.timeout(cfg.compute_us)

    env.process(controller())
    env.run()
    if not warm:
        res.t_b_us = p.t_b_us
    res.sent, res.lost = net.sent, net.lost
    res.delays = draws.log
    if keep_outputs:
        res.outputs = [np.concatenate(o) for o in outputs]
    return res


def run_algorithm(algo: str, cfg: ClusterConfig, *, record_delays: bool = False,
                  inputs: Sequence[np.ndarray] | None = None,
                  keep_outputs: bool = False) -> AlgoResult:  # fmt: skip
    """One algorithm, `cfg.ops` measured ops (OptiReduce: after its warm-up)."""
    if algo not in ALGOS:
        raise ValueError(f"algorithm {algo!r}: one of {ALGOS}")
    if not 2 <= cfg.workers <= 4096:
        raise ValueError(f"workers={cfg.workers}: must be in 2..4096")
    if cfg.ops < 1:
        raise ValueError("ops must be >= 1")
    if algo.startswith("reliable"):
        return _run_reliable(algo, cfg, record_delays)
    return _run_optireduce(algo, cfg, record_delays, inputs, keep_outputs)


def _run_one(args: tuple[str, ClusterConfig]) -> AlgoResult:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return run_algorithm(*args)


def run_cluster(cfg: ClusterConfig, algos: Sequence[str] = ALGOS, jobs: int = 1
                ) -> dict[str, AlgoResult]:  # fmt: skip
    """Every algorithm on the same links (keyed randomness); jobs > 1: one process each."""
    if jobs <= 1 or len(algos) == 1:
        return {a: run_algorithm(a, cfg) for a in algos}
    with ProcessPoolExecutor(max_workers=min(jobs, len(algos))) as ex:
        return dict(zip(algos, ex.map(_run_one, [(a, cfg) for a in algos]), strict=True))


def summarize(cfg: ClusterConfig, results: dict[str, AlgoResult]) -> dict:
    """{ALGO: {p50_ms, p99_ms, entries_lost, ...}, "ratios": ..., "settings": ...}."""
    out: dict = {a: r.summary() for a, r in results.items()}
    if "optireduce" in out and "reliable_ring" in out:
        o, ring = out["optireduce"], out["reliable_ring"]
        ratios = {
            "optireduce_p99_over_ring_p99": round(o["p99_ms"] / ring["p99_ms"], 4),
            "optireduce_p99_over_p50": round(o["p99_ms"] / o["p50_ms"], 4),
            "ring_p99_over_p50": round(ring["p99_ms"] / ring["p50_ms"], 4),
        }
        if "reliable_tar" in out:
            ratios["optireduce_p99_over_tar_p99"] = round(
                o["p99_ms"] / out["reliable_tar"]["p99_ms"], 4
            )
        ratios["targets"] = dict(TARGETS)
        ratios["met"] = {
            "optireduce_p99_over_ring_p99": ratios["optireduce_p99_over_ring_p99"]
            <= TARGETS["optireduce_p99_over_ring_p99"],
            "optireduce_p99_over_p50": ratios["optireduce_p99_over_p50"]
            <= TARGETS["optireduce_p99_over_p50"],
            "entries_lost": o["entries_lost"] <= TARGETS["entries_lost"],
        }
        out["ratios"] = ratios
    s = cfg.settings()
    s["link_delay"] = LinkDraws(cfg.link, cfg.seed).quantiles()
    out["settings"] = s
    return out
