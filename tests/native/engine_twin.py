"""Test helpers: a rank run by NicModel and NativeNicModel side by side, and a small lossy
cluster of such ranks. Every output of the two is compared at every step."""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque

import numpy as np

from optireduce import ubt
from optireduce.host.model.nic_model import NicModel, OpResult
from optireduce.host.model.quantize import agree_exponent, propose_exponent
from optireduce.host.native.engine import NativeNicModel
from optireduce.params import NicParams


def same_results(a: list[OpResult], b: list[OpResult]) -> None:
    assert [r.op_id for r in a] == [r.op_id for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.data.dtype == y.data.dtype == np.float32
        np.testing.assert_array_equal(x.data.view(np.uint32), y.data.view(np.uint32))
        assert dataclasses.asdict(x.stats) == dataclasses.asdict(y.stats), x.op_id


class Twin:
    """One rank: the model and the native engine, fed the same events."""

    def __init__(self, p: NicParams, rank: int, world: int, first_op: int = 0) -> None:
        self.model = NicModel(p, rank, world, first_op=first_op)
        self.native = NativeNicModel(p, rank, world, first_op=first_op)
        self.results: list[OpResult] = []

    def call(self, name: str, *args: object, **kw: object) -> None:
        """The same call on both; both raise the same error (type and message), or neither."""
        errors = []
        for nic in (self.model, self.native):
            try:
                getattr(nic, name)(*args, **kw)
                errors.append(None)
            except (ValueError, TypeError) as e:
                errors.append((type(e), str(e) if isinstance(e, ValueError) else ""))
        assert errors[0] == errors[1], (name, errors)

    def inband(self, op_id: int):
        """inband_exponent of both, compared."""
        a = self.model.inband_exponent(op_id)
        assert a == self.native.inband_exponent(op_id), op_id
        return a

    def collect(self) -> list:
        """Compare everything the two show; returns the model's Tx frames."""
        m, n = self.model, self.native
        tx = m.poll_tx()
        assert tx == n.poll_tx()
        res = m.poll_results()
        same_results(res, n.poll_results())
        self.results += res
        assert m.counters == n.counters
        assert m.exp_counters == n.exp_counters
        assert (m.base, m.last_started, m.next_timer()) == (n.base, n.last_started, n.next_timer())
        assert m.tc_table.tolist() == n.tc_table.tolist()
        return tx


@dataclasses.dataclass
class Plan:
    """One lossy run of a cluster, all of its randomness drawn up front."""

    params: NicParams
    world: int
    lens: list[int]  # elements of each op
    seed: int
    loss: float = 0.0
    dup: float = 0.0
    max_delay: int = 50  # per-frame delay 1..max_delay ticks: reordering
    start_gap: int = 30  # op k starts near tick k * start_gap
    datagram: float = 0.0  # share of frames handed over as bare UBT datagrams
    mutate: float = 0.0  # share of frames that also arrive corrupted
    dead: int | None = None  # a rank that stops at dead_at
    dead_at: int = 0
    detect: int = 0  # ticks until the others exclude it (None: never)
    mismatch: str | None = None  # rank 1 starts op 0 with another "exponent" or "length"
    first_op: int = 0  # id of the first op
    retune_at: int | None = None  # tick at which every rank's t_B becomes retune_t_b
    retune_t_b: int = 1
    data: str = "normal"  # "nonfinite": some inf/NaN; "saturate": an exponent 3 too small
    no_proposal: float = 0.0  # exp_inband: share of ops whose host gives no next proposal
    fetch: float = 0.0  # exp_inband: share of missing proposals fetched (put_proposal)
    slow: int | None = None  # a rank whose host starts every op slow_by ticks late, with
    slow_by: int = 0  # data 16 times larger (its proposals are the largest)


def _corrupt(frame: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(frame)
    kind = int(rng.integers(0, 4))
    if kind == 0:
        for pos in rng.integers(0, 8 * len(b), int(rng.integers(1, 4))):
            b[pos // 8] ^= 1 << (pos % 8)
        return bytes(b)
    if kind == 1:
        return bytes(b[: int(rng.integers(0, len(b)))])
    if kind == 2:
        return bytes(rng.integers(0, 256, int(rng.integers(1, 120)), dtype=np.uint8))
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)
    field = ("op_id", "job_id", "sender", "pkt_index", "version", "exponent",
             "reserved")[int(rng.integers(7))]  # fmt: skip
    value = {
        "reserved": int(rng.choice([0, 1, 0x8001, 0x7F01, 0x0100, int(rng.integers(0, 2**16))])),
        "op_id": (h.op_id + int(rng.integers(-3, 6))) % 2**32,
        "job_id": h.job_id ^ 1,
        "sender": int(rng.integers(0, 10)),
        "pkt_index": h.pkt_index + int(rng.integers(1, 64)),
        "version": 2,
        "exponent": (h.exponent + 1) if h.exponent < 127 else 0,
    }[field]
    dst = int.from_bytes(frame[0:6], "big") - ubt.DEFAULT_ADDRESSING.mac_base
    payload = frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :]
    return ubt.build_frame(h._replace(**{field: value}), payload, src=h.sender, dst=dst,
                           port=int.from_bytes(frame[36:38], "big"))  # fmt: skip


def run_cluster(plan: Plan, max_steps: int = 200_000) -> list[Twin]:
    """Run the plan; every rank's model and native engine are compared after every event."""
    p, world = plan.params, plan.world
    rng = np.random.default_rng(plan.seed)
    nodes = [Twin(p, r, world, plan.first_op) for r in range(world)]
    xs = [[rng.standard_normal(n).astype(np.float32) * 4 for n in plan.lens] for _ in range(world)]
    if plan.slow is not None:
        xs[plan.slow] = [x * np.float32(16) for x in xs[plan.slow]]
    exps = [agree_exponent([propose_exponent(xs[r][k], p) for r in range(world)])
            for k in range(len(plan.lens))]  # fmt: skip
    props = [[propose_exponent(xs[r][k], p) for k in range(len(plan.lens))] for r in range(world)]
    if plan.data == "saturate":  # quantizer, transform and output saturate
        exps = [max(e - 3, -128) for e in exps]
        props = [[max(e - 3, -128) for e in pr] for pr in props]
    lead = p.exp_lead_eff
    silent = {(r, k) for r in range(world) for k in range(len(plan.lens))
              if rng.random() < plan.no_proposal}  # fmt: skip

    def next_proposal(r: int, k: int) -> int | None:
        if not p.exp_inband or k + lead >= len(plan.lens) or (r, k) in silent:
            return None
        return props[r][k + lead]

    if plan.data == "nonfinite":  # flagged, carried, and non-finite results everywhere
        for r in range(world):
            x = xs[r][-1]
            x[rng.integers(0, len(x), 2)] = rng.choice([np.inf, -np.inf, np.nan], 2)
    events: list[tuple] = []  # (tick, seq, kind, rank, what)
    seq = 0

    def push(t: int, kind: str, rank: int, what: object) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, rank, what))
        seq += 1

    for r in range(world):
        for k in range(len(plan.lens)):
            exp, x = exps[k], xs[r][k]
            if r == 1 and k == 0 and plan.mismatch == "exponent":
                exp = exp + 1 if exp < 127 else exp - 1
            if r == 1 and k == 0 and plan.mismatch == "length":
                x = x[:-1] if len(x) > 1 else np.append(x, np.float32(1))
            what = (plan.first_op + k, x, exp, next_proposal(r, k))
            late = plan.slow_by if r == plan.slow else 0
            push(k * plan.start_gap + late + int(rng.integers(0, 20)), "start", r, what)
        if plan.retune_at is not None:
            push(plan.retune_at, "set_t_b", r, plan.retune_t_b)
    if plan.dead is not None and plan.detect is not None:
        for r in range(world):
            if r != plan.dead:
                push(plan.dead_at + plan.detect, "exclude", r, plan.dead)
    pending: list[deque] = [deque() for _ in range(world)]

    def alive(r: int, t: int) -> bool:
        return plan.dead is None or r != plan.dead or t < plan.dead_at

    def step(r: int, now: int) -> None:
        while True:
            for tx in nodes[r].collect():
                if not alive(r, tx.time_us) or rng.random() < plan.loss:
                    continue
                copies = 2 if rng.random() < plan.dup else 1
                for _ in range(copies):
                    push(tx.time_us + int(rng.integers(1, plan.max_delay + 1)), "net", tx.dst,
                         tx.frame)  # fmt: skip
                if rng.random() < plan.mutate:
                    push(tx.time_us + int(rng.integers(1, plan.max_delay + 1)), "net", tx.dst,
                         _corrupt(tx.frame, rng))  # fmt: skip
            nic = nodes[r].model
            if not (pending[r] and pending[r][0][0] < nic.base + p.ops_in_flight):
                return
            op_id, data, exp, nxt = pending[r].popleft()
            k = op_id - plan.first_op
            if p.exp_inband and k >= lead:
                inb = nodes[r].inband(op_id)
                if inb.missing and rng.random() < plan.fetch:  # the host asks the peers
                    for q in inb.missing:
                        silent_q = (q, k - lead) in silent
                        nodes[r].call("put_proposal", op_id, q, None if silent_q else props[q][k])
                    inb = nodes[r].inband(op_id)
                if inb.exponent is not None:
                    exp = None  # else: someone had no proposal, the hosts exchange
            nodes[r].call("start_op", now, op_id, data, exp, next_proposal=nxt)

    for _ in range(max_steps):
        timers = [(t, r) for r in range(world) if (t := nodes[r].model.next_timer()) is not None
                  and alive(r, t)]  # fmt: skip
        t_timer, r_timer = min(timers) if timers else (None, None)
        if events and (t_timer is None or events[0][0] < t_timer):
            t, _, kind, r, what = heapq.heappop(events)
            if not alive(r, t):
                continue
            if kind == "start":
                pending[r].append(what)
            elif kind == "exclude":
                nodes[r].call("exclude", t, what)
            elif kind == "set_t_b":
                nodes[r].call("set_t_b", what)
            elif rng.random() < plan.datagram:
                nodes[r].call("receive_datagram", t, what[ubt.L2_L4_LEN :])
            else:
                nodes[r].call("receive", t, what)
            step(r, t)
        elif t_timer is not None:
            nodes[r_timer].call("advance", t_timer)
            step(r_timer, t_timer)
        else:
            return nodes
    raise AssertionError(f"the cluster did not settle in {max_steps} steps")


def allreduce_on_model_and_engine(monkeypatch, xs: list, **kw) -> tuple:
    """virtual_cluster.simulate_allreduce(xs, **kw) on NicModel ranks, then on the engine's
    (NativeNicModel in its place): every rank's result has the same bits. Returns (model
    results, model stats, engine results, engine stats)."""
    import optireduce.host.model.virtual_cluster as vc

    want, ws = vc.simulate_allreduce(xs, **kw)
    monkeypatch.setattr(vc, "NicModel", NativeNicModel)
    got, gs = vc.simulate_allreduce(xs, **kw)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    return want, ws, got, gs
