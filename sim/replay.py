"""Replay a trace through a NIC backend; collect its output frames and counters.

The trace's first host frame (CONFIG) sets the NIC up; START/DATA frames are host
commands, queued at the host port until the op window has room (as a command FIFO
does); every other frame is network input. Ticks come from the trace's
timestamps. After the last frame the NIC's timers run out (every phase ends by its
deadline). A malformed frame is input, counted, never an error; an unreadable
file is an error.

Both backends see the same events at the same ticks: every timer due before an
input fires at its own tick first, and a queued START is taken at the tick the
window opens. Output frames are put in a canonical order, by (tick, frame bytes):
the order of frames within one microsecond is the pipeline's business, not the
protocol's. The `native` backend is the C++ event engine (host/native) behind the
model's interface. The `rtl` backend runs the Verilated NIC core in the C++ harness
(sim/cosim/nic_harness.cpp, docs/cosim.md).
"""

from __future__ import annotations

import json
import struct
import subprocess
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optireduce import host_port, ubt
from optireduce.counters import COUNTERS
from optireduce.frame_checks import ADMISSION_REASONS, admit
from optireduce.host.model.nic_model import EXP_COUNTERS, NicModel
from optireduce.params import NicParams
from optireduce.sim.trace import Frame

_TIMER_STEPS = 1_000_000  # bound on timer firings after the last frame
ALL_NIC_COUNTERS = (*COUNTERS, *ADMISSION_REASONS)  # a replay's `counters`


class ReplayError(RuntimeError):
    """The trace cannot be replayed (no CONFIG frame, unknown backend)."""


@dataclass
class ReplayResult:
    frames: list[Frame] = field(default_factory=list)  # network and host output, by tick
    counters: dict[str, int] = field(default_factory=dict)
    results: dict[int, np.ndarray] = field(default_factory=dict)
    sim: dict[str, int] = field(default_factory=dict)  # rtl: cycles and ticks simulated
    exp_counters: dict[str, int] = field(default_factory=dict)  # EXP_COUNTERS

    def summary(self) -> dict:
        out = {
            "frames_out": len(self.frames),
            "ops_completed": len(self.results),
            "counters": self.counters,
            "exp_counters": self.exp_counters,
        }
        if self.sim:
            out["sim"] = self.sim
        return out


@dataclass
class Events:
    """A trace as NIC inputs: the configuration, then (tick, kind, what) in trace order,
    kind "net" (a frame) or "start" (a host_port.Chunk: op_id, exponent or None for the
    in-band one, float32 chunk, proposal word)."""

    params: NicParams
    rank: int
    world: int
    inputs: list[tuple[int, str, object]]
    host_malformed: int
    peers: list[tuple[int, int]] | None = None  # CONFIG's admission table (None: off)


def events(frames: list[Frame]) -> Events:
    """Parse the host frames of a trace (ReplayError if it has no usable CONFIG)."""
    cfg, peers = None, None
    chunks = host_port.ChunkAssembler()
    inputs: list[tuple[int, str, object]] = []
    host_drops = 0
    for tick, frame in frames:
        if host_port.is_host_frame(frame):
            try:
                f = host_port.parse(frame)
                if f.kind == host_port.CONFIG:
                    c = json.loads(f.payload)
                    cfg = (NicParams(**c["params"]), int(c["rank"]), int(c["world"]))
                    peers = c.get("peers")
                    peers = None if peers is None else [(int(a), int(b)) for a, b in peers]
                elif f.kind in (host_port.START, host_port.DATA):
                    if cfg is None:
                        raise ReplayError("the trace starts an op before its CONFIG frame")
                    whole = chunks.add(f)
                    if whole is not None:
                        inputs.append((tick, "start", whole))
                else:
                    host_drops += 1  # results are the NIC's output, not input
            except (ValueError, KeyError, TypeError):
                host_drops += 1
        elif cfg is None:
            raise ReplayError("the trace has network frames before its CONFIG frame")
        else:
            inputs.append((tick, "net", frame))
    if cfg is None:
        raise ReplayError("the trace has no CONFIG frame")
    return Events(*cfg, inputs, host_drops, peers)


def replay(
    frames: list[Frame],
    backend: str | type = "model",
    *,
    backpressure: int = 0,
    overlap: bool = False,
    host_gap: int = 0,
) -> ReplayResult:
    """Replay `frames` through the model, the RTL, or another event model: a class with
    NicModel's constructor and event interface (the command line passes the native engine's
    NativeNicModel for `--backend native`: the toolchain does not import the runtime).
    backpressure=k (rtl only): the core's outputs are ready one cycle in k + 1, at random,
    to exercise flow control. overlap (rtl only): an input waits only until the events
    before it have had their effects, not for an op's encode, readouts or outputs (the
    harness's `events_idle`), so peers' frames and ticks come while an op encodes, as in
    a live run; the frames' ticks then say when they left, not when the model sent them
    (compare with `differences(..., ticks=False)`). host_gap (rtl only): idle cycles
    after each host_i word, a slower host link: with overlap, phases may end while their
    op still encodes."""
    if isinstance(backend, str) and backend not in ("model", "rtl"):
        raise ReplayError(f"unknown backend {backend!r}; choose from model, rtl or a model class")
    ev = events(frames)
    if backend == "rtl":
        res = _replay_rtl(ev, backpressure=backpressure, overlap=overlap, host_gap=host_gap)
    else:
        res = _replay_model(ev, NicModel if backend == "model" else backend)
    res.counters["host_malformed"] = ev.host_malformed
    res.frames.sort(key=lambda e: (e[0], e[1]))
    return res


def _replay_model(ev: Events, model: type) -> ReplayResult:
    res = ReplayResult()
    nic = model(ev.params, ev.rank, ev.world)
    pending: deque = deque()  # whole chunks waiting for room in the op window

    def step(now: int) -> None:
        """Collect the outputs; start queued ops while the window has room."""
        while True:
            for tx in nic.poll_tx():
                res.frames.append((tx.time_us, tx.frame))
            for r in nic.poll_results():
                res.results[r.op_id] = r.data
                words = host_port.stats_words(r.stats, nic.p.tick_bits)
                res.frames += _host_frames(r.op_id, r.data, words, now)
            if not (pending and pending[0][0] < nic.base + nic.p.ops_in_flight):
                return
            c = pending.popleft()
            kw = {"next_proposal": ubt.proposal_of(c.proposal)} if c.proposal else {}
            nic.start_op(now, c.op_id, c.data, c.exponent, **kw)

    def timers_until(limit: float) -> None:
        """Fire each timer due at or before `limit` at its own tick, in order."""
        for _ in range(_TIMER_STEPS):
            t = nic.next_timer()
            if t is None or t > limit:
                return
            nic.advance(t)
            step(t)
        raise ReplayError(f"the model's timers did not run out in {_TIMER_STEPS} steps")

    admitted = dict.fromkeys(ADMISSION_REASONS, 0)
    for tick, kind, what in ev.inputs:
        timers_until(tick)
        if kind == "net" and ev.peers is not None:
            parsed = ubt.parse_frame(what, port=ev.params.udp_port, rank=ev.rank,
                                     inband=ev.params.exp_inband)  # fmt: skip
            if reason := admit(what, parsed, ev.peers):
                admitted[reason] += 1  # the transport's drop: the NIC never sees it
                continue
        if kind == "net":
            nic.receive(tick, what)
        else:
            pending.append(what)
        step(tick)
    timers_until(float("inf"))
    res.counters = {**nic.counters, **admitted}
    res.exp_counters = dict(nic.exp_counters)
    return res


def _host_frames(op_id: int, data: np.ndarray, stats: list[int], tick: int) -> list[Frame]:
    """An op's RESULT fragments and its STATS frame, as the host sees them."""
    exponent = host_port.stats_from_words(stats)["exponent"]
    out = [(tick, f) for f in host_port.chunk_frames(host_port.RESULT, op_id, data, exponent)]
    return [*out, (tick, host_port.stats_frame(stats))]


# ---- rtl: the record files of the C++ harness (docs/cosim.md) ----------------------------
MAGIC = b"ORCR"
REC = struct.Struct("<BQI")  # type, tick, length
REC_CSR_WRITE, REC_NET, REC_START, REC_CSR_READ, REC_HOST, REC_LIMITS, REC_SUMMARY = range(1, 8)


def _describe(t: int, f: bytes) -> str:
    if host_port.is_host_frame(f):
        h = host_port.parse(f)
        return f"tick {t}: host {host_port.KINDS[h.kind]} op {h.op_id} offset {h.offset}"
    return f"tick {t}: network frame of {len(f)} bytes {f[:64].hex()}"


def differences(
    a: ReplayResult, b: ReplayResult, limit: int = 8, *, ticks: bool = True
) -> list[str]:
    """What differs between two replays (empty: identical): output frames byte for byte
    at their ticks (`ticks=False`: the frames alone, as a multiset), in the canonical
    order; counters; results bit for bit."""
    fa, fb = a.frames, b.frames
    if not ticks:
        fa, fb = ([(0, f) for f in sorted(f for _, f in x)] for x in (fa, fb))
    bad = [
        f"frame {k}: {_describe(*x)} != {_describe(*y)}"
        for k, (x, y) in enumerate(zip(fa, fb, strict=False))
        if x != y
    ][:limit]
    if len(a.frames) != len(b.frames):
        bad.append(f"{len(a.frames)} frames != {len(b.frames)}")
    for ca, cb in ((a.counters, b.counters), (a.exp_counters, b.exp_counters)):
        bad += [
            f"counter {k}: {ca.get(k)} != {cb.get(k)}"
            for k in sorted(set(ca) | set(cb))
            if ca.get(k) != cb.get(k)
        ]
    if sorted(a.results) != sorted(b.results):
        bad.append(f"ops completed {sorted(a.results)} != {sorted(b.results)}")
    bad += [
        f"op {op}: results differ"
        for op, x in b.results.items()
        if op in a.results and not np.array_equal(a.results[op].view(np.uint32), x.view(np.uint32))
    ]
    return bad


def config_writes(
    p: NicParams, rank: int, world: int, peers: list[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """(offset, value) of every configuration register for this NIC, from hw/csr.py;
    `peers` turns admission on with that table."""
    from optireduce.hw.csr import register_map

    given: dict[str, int] = {"rank": rank, "world": world}
    if peers is not None:
        given["admit"] = 1
        for r, (ip, port) in enumerate(peers):
            given[f"peer_ip{r}"], given[f"peer_port{r}"] = ip, port
    out = []
    for blk in register_map(p):
        for r in blk.regs:
            if r.kind == "config":
                v = given.get(r.name, r.reset)
                out.append((r.offset, int(v) & 0xFFFF_FFFF))
    return out


def counter_offsets(p: NicParams, names: tuple[str, ...] = COUNTERS) -> dict[str, int]:
    """The register offset of each counter in `names` (COUNTERS, or EXP_COUNTERS)."""
    from optireduce.hw.csr import register_map

    regs = {r.name: r.offset for blk in register_map(p) for r in blk.regs if r.kind == "counter"}
    return {name: regs[name] for name in names}


def cmd_bits(exponent: int | None, proposal: int = 0) -> int:
    """host_cmd's bits from 64 on (hw/nic_core.py host_cmd_layout): the exponent, inband
    (exponent None: the NIC's agreed one), the proposal word. The harness's START carries
    them as one u32."""
    return ((exponent or 0) & 0xFF) | (exponent is None) << 8 | (proposal & 0xFFFF) << 9


def write_records(
    path: Path, ev: Events, *, backpressure: int = 0, overlap: bool = False, host_gap: int = 0
) -> None:
    p = ev.params
    recs: list[tuple[int, int, bytes]] = []
    starts = sum(1 for _, k, _ in ev.inputs if k == "start")
    # After the last input every op ends by its deadlines: 2 t_B per op, queued ops
    # one after another, with room to spare.
    extra = (starts + 2) * 4 * p.t_b_us + 10_000
    idle_bound = 200 * p.c + 200_000  # cycles: an op's whole datapath, many times over
    limits = struct.pack("<QQII", extra, idle_bound, backpressure, int(overlap) | host_gap << 8)
    recs.append((REC_LIMITS, 0, limits))
    recs += [(REC_CSR_WRITE, 0, struct.pack("<II", a, v)) for a, v in
             config_writes(p, ev.rank, ev.world, ev.peers)]  # fmt: skip
    for tick, kind, what in ev.inputs:
        if kind == "net":
            recs.append((REC_NET, tick, bytes(what)))
        else:
            bits = cmd_bits(what.exponent, what.proposal)
            head = struct.pack("<III", what.op_id, len(what.data), bits)
            recs.append((REC_START, tick, head + np.asarray(what.data, "<f4").tobytes()))
    offsets = {**counter_offsets(p, ALL_NIC_COUNTERS), **counter_offsets(p, EXP_COUNTERS)}
    recs += [(REC_CSR_READ, 0, struct.pack("<I", a)) for a in offsets.values()]
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", 1))
        for typ, tick, data in recs:
            f.write(REC.pack(typ, tick, len(data)) + data)


def read_records(path: Path) -> list[tuple[int, int, bytes]]:
    buf = Path(path).read_bytes()
    if buf[:4] != MAGIC:
        raise ReplayError(f"{path}: not a harness record file")
    out, off = [], 8
    while off < len(buf):
        typ, tick, n = REC.unpack_from(buf, off)
        off += REC.size
        out.append((typ, tick, buf[off : off + n]))
        off += n
    return out


def host_record(words: list[int], world: int) -> tuple[int, np.ndarray, list[int]]:
    """One op's host_o words (its head, results, STATS record): (op_id, float32 results,
    STATS record). The head must be the record's first words."""
    head, nstats = len(host_port.HEAD_FIELDS), len(host_port.STATS_FIELDS) + world + 1
    n = len(words) - head - nstats
    if n < 1:
        raise ReplayError(f"host_o record of {len(words)} words: shorter than its STATS")
    stats = [int(w) for w in words[head + n :]]
    d = host_port.stats_from_words(stats)
    if d["n"] != n:
        raise ReplayError(f"host_o record: {n} result words, STATS says n={d['n']}")
    if [int(w) for w in words[:head]] != stats[:head]:
        raise ReplayError(f"host_o record: head {words[:head]}, STATS says {stats[:head]}")
    return d["op_id"], np.asarray(words[head : head + n], dtype=np.uint32).view(np.float32), stats


def _replay_rtl(
    ev: Events,
    *,
    backpressure: int = 0,
    overlap: bool = False,
    host_gap: int = 0,
    timeout_s: float = 600,
) -> ReplayResult:
    from optireduce.sim.cosim_build import harness_path
    from optireduce.sim.toolchain import ToolchainError

    try:
        exe = harness_path(ev.params)
    except ToolchainError as e:
        raise ReplayError(f"the rtl backend needs Verilator: {e}") from e
    res = ReplayResult()
    both = {
        **counter_offsets(ev.params, ALL_NIC_COUNTERS),
        **counter_offsets(ev.params, EXP_COUNTERS),
    }
    offsets = {v: k for k, v in both.items()}
    with tempfile.TemporaryDirectory(prefix="optireduce-replay-") as tmp:
        rin, rout = Path(tmp) / "in.rec", Path(tmp) / "out.rec"
        write_records(rin, ev, backpressure=backpressure, overlap=overlap, host_gap=host_gap)
        try:
            r = subprocess.run([str(exe), "replay", str(rin), str(rout)], capture_output=True,
                               text=True, timeout=timeout_s, check=False)  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise ReplayError(f"the rtl harness did not finish within {timeout_s} s") from e
        if r.returncode != 0:
            raise ReplayError(f"the rtl harness failed: {r.stderr.strip()[-2000:]}")
        for typ, tick, data in read_records(rout):
            if typ == REC_NET:
                res.frames.append((tick, data))
            elif typ == REC_HOST:
                words = np.frombuffer(data, "<u4").tolist()
                op_id, x, stats = host_record(words, ev.world)
                res.results[op_id] = x
                res.frames += _host_frames(op_id, x, stats, tick)
            elif typ == REC_CSR_READ:
                addr, value = struct.unpack("<II", data)
                res.counters[offsets[addr]] = value
            elif typ == REC_SUMMARY:
                keys = ("cycles", "ticks", "core_now", "ops_started", "ops_done")
                res.sim = dict(zip(keys, struct.unpack("<5Q", data), strict=True))
    res.exp_counters = {k: res.counters[k] for k in EXP_COUNTERS}
    res.counters = {k: res.counters[k] for k in ALL_NIC_COUNTERS}
    return res
