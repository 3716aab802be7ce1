"""Soak: the job's pieces again and again under rotating faults, every run checked.

Pieces (each run is one of them, under one fault of experiments/faults.py):
- train: the training smoke. `world` spawned processes (torch.multiprocessing, gloo on
  `lo`, a FileStore in the run's folder) train the DDP example's MLP with the OptiReduce
  hook (host/ddp_hook.py; the NIC select_nic picks: native when built) for `steps` steps,
  warm-up and t_B calibration included. Faults: all but sigint.
- sigint: the training command itself, `optireduce train --quick --methods optireduce`,
  in a session of its own, gets SIGINT (its process group: a Ctrl-C) mid-training.
- replay: a trace of each test scenario, mutated (bit flips, truncations, duplicates,
  shuffles), replayed through the model and the native engine: identical frames,
  counters and results.

Every run ends within its fault's bound (faults.OUTCOMES) or is a hang: everything is
killed and the run counted as such. Then it is checked:
- outcome: the fault's documented outcome (exclusions exactly as the fault explains,
  exit codes, replicas equal unless loss was counted, junk counted);
- loss: packets an op missed in a phase that ended `complete` are lost beyond what the
  deadline rules explain (a phase that ends early or at its deadline explains its holes);
- leaks, after the run: processes (this process's descendants, and any process whose
  environment carries the run's mark, orphans included), sockets of this process
  (/proc/self/fd), what is left in the run's TMPDIR (the product's temporary folders;
  torch's inductor cache excepted). /dev/shm entries and network namespaces (`ip netns
  list`) are the whole machine's: those that appeared during a run and are still there
  when the campaign ends are listed by name (`system_leftovers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from optireduce.experiments import faults as F
from optireduce.experiments import soak_workers as W

TRAIN_FAULTS = ("none", "kill", "stall", "cpu", "sockbuf", "junk")
MARK = "OPTIREDUCE_SOAK_RUN"  # in every process a run starts: finds orphans
PREFIX = "optireduce-soak-"
ENV_CAUSE = "environment: the native engine was rebuilt during the run"
# what torch keeps in TMPDIR on purpose, across runs (the inductor's cache): not a leak
CACHES = ("torchinductor_",)
# junk lands in these counters and nowhere else (legitimate traffic never does)
JUNK_REASONS = ("not_member", "wrong_sender", "truncated", "bad_version", "malformed_header",
                "wrong_job", "bad_length", "unknown_rank", "own_rank", "bad_type")  # fmt: skip


@dataclass(frozen=True)
class SoakConfig:
    runs: int = 200  # training-smoke runs (faults rotate), plus the sigint and replay runs
    minutes: float = 15.0  # no run starts after this
    world: int = 3
    steps: int = 12
    warmup: int = 2
    fault_step: int = 6  # the step at which kill, stall and sockbuf strike
    stall_s: float = 2.5  # > the control floor (1 s) > t_B
    seed: int = 0
    sigint_every: int = 10  # one `optireduce train` under SIGINT per this many runs
    replay_every: int = 10  # one mutated replay per this many runs
    collective_every: int = 10  # one collective run (faults in turn) per this many runs
    faults: tuple[str, ...] = TRAIN_FAULTS
    keep_failed: str | None = None  # a failed run's folder (its ranks' stderr, results) goes here

    def __post_init__(self) -> None:
        if self.runs < 1 or self.minutes <= 0 or self.world < 3:
            raise ValueError("soak: need runs >= 1, minutes > 0 and world >= 3")
        if not self.warmup < self.fault_step < self.steps:
            raise ValueError("soak: need warmup < fault_step < steps")
        bad = [f for f in self.faults if f not in TRAIN_FAULTS]
        if bad:
            raise ValueError(f"soak: faults {bad} not among {TRAIN_FAULTS}")


def quick_config(cfg: SoakConfig | None = None) -> SoakConfig:
    """One training run per fault, then one sigint, one replay and one collective run
    (under junk)."""
    from dataclasses import replace

    cfg = cfg or SoakConfig()
    n = len(cfg.faults)
    return replace(cfg, runs=n, sigint_every=n, replay_every=n, collective_every=n,
                   minutes=min(cfg.minutes, 5.0))  # fmt: skip


@dataclass
class RunReport:
    run: int
    piece: str  # train | sigint | replay
    fault: str
    wall_s: float = 0.0
    bound_s: float = 0.0
    bounded_s: float | None = None  # what bound_s limits if not wall_s (sigint: since the signal)
    ok: bool = True
    cause: str = ""  # why not ok (hang, outcome, loss, leak, error)
    detail: str = ""
    hang: bool = False
    unexplained_lost: int = 0  # packets
    lost: int = 0  # packets missing, every rank and op (counted loss)
    leaks: dict[str, list] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)  # what the check looked at


# ---------------------------------------------------------------- the training worker


# ---------------------------------------------------------------- leaks


def _proc_tree() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (d / "stat").read_text()
                out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(root: int) -> set[int]:
    tree = _proc_tree()
    kids: dict[int, list[int]] = {}
    for pid, ppid in tree.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _marked(mark: str) -> set[int]:
    """Processes whose environment carries MARK=mark (orphans too)."""
    return _marked_with(f"{MARK}={mark}\0".encode())


def _marked_with(needle: bytes) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (d / "environ").read_bytes():
                    out.add(int(d.name))
    return out


def _reap_campaign(start: Baseline, grace_s: float = 5.0) -> None:
    """Kill every process this campaign's runs started: its descendants since `start`, and
    the orphans that carry one of its runs' marks ("{our pid}-{run}"); wait until gone."""

    def ours() -> set[int]:
        mine = _marked_with(f"{MARK}={os.getpid()}-".encode())
        return (_descendants(os.getpid()) - start.children) | mine

    end = time.monotonic() + grace_s
    while (left := ours()) and time.monotonic() < end:
        _reap(left)
        time.sleep(0.05)


def _sockets() -> set[str]:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:"):
                out.add(link)
    return out


def _netns() -> set[str]:
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def _shm() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/dev/shm"))
    return set()


@dataclass
class Baseline:
    sockets: set[str]
    netns: set[str]
    shm: set[str]
    children: set[int]

    @classmethod
    def now(cls) -> Baseline:
        return cls(_sockets(), _netns(), _shm(), _descendants(os.getpid()))


def leaks(before: Baseline, mark: str, tmp: Path, grace_s: float = 5.0) -> dict[str, list]:
    """What the run left behind. Processes get `grace_s` to go (an exit in progress)."""
    end = time.monotonic() + grace_s
    while True:
        procs = (_descendants(os.getpid()) - before.children) | _marked(mark)
        if not procs or time.monotonic() > end:
            break
        time.sleep(0.1)
    out: dict[str, list] = {}
    if procs:
        out["processes"] = sorted(f"{p} {_cmdline(p)}" for p in procs)
    if socks := sorted(_sockets() - before.sockets):
        out["sockets"] = socks
    left = (
        sorted(p.name for p in tmp.iterdir() if not p.name.startswith(CACHES))
        if tmp.exists()
        else []
    )
    if left:
        out["tmp"] = left
    return out


def appeared(before: Baseline) -> dict[str, list]:
    """/dev/shm entries and network namespaces that appeared during the run. They are the
    machine's, not only ours (other jobs make them too): the campaign reports those still
    there at its end, by name, instead of charging them to a run."""
    out = {}
    if shm := sorted(_shm() - before.shm):
        out["shm"] = shm
    if ns := sorted(_netns() - before.netns):
        out["netns"] = ns
    return out


def _engine_stamp() -> tuple[int, int] | None:
    """(inode, mtime) of the native engine's shared object: a rebuild replaces it under
    the running workers, which then crash (SIGBUS, SIGSEGV) through no fault of theirs."""
    import importlib.util

    with contextlib.suppress(ImportError, AttributeError, OSError, ValueError):
        spec = importlib.util.find_spec("optireduce.host.native._engine")
        st = os.stat(spec.origin)
        return st.st_ino, st.st_mtime_ns
    return None


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    return "?"


def _reap(pids: set[int]) -> None:
    """Kill what a failed run left (after it was counted)."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGCONT)
            os.kill(p, signal.SIGKILL)


# ---------------------------------------------------------------- the runs


@contextlib.contextmanager
def _run_env(mark: str, tmp: Path):
    """Children started inside inherit the run's mark and TMPDIR."""
    old = {k: os.environ.get(k) for k in (MARK, "TMPDIR")}
    os.environ[MARK], os.environ["TMPDIR"] = mark, str(tmp)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ranks_run(cfg: SoakConfig, rep: RunReport, run_dir: Path, mark: str, tmp: Path) -> None:
    """A run of `world` spawned ranks (train or collective) under its fault."""
    import torch.multiprocessing as mp

    fault = rep.fault
    victim = cfg.world - 1 - (rep.run // len(cfg.faults)) % cfg.world  # each rank in turn
    target = W.train_worker if rep.piece == "train" else W.collective_worker
    spec = {"fault": fault, "victim": victim, "steps": cfg.steps, "warmup": cfg.warmup,
            "fault_step": cfg.fault_step, "seed": cfg.seed + rep.run}  # fmt: skip
    ctx = mp.get_context("spawn")
    hogs = F.CpuHogs() if fault == "cpu" else contextlib.nullcontext()
    junk = staller = sent = None
    t0 = time.monotonic()
    with _run_env(mark, tmp), hogs:
        procs = [ctx.Process(target=target, args=(r, cfg.world, str(run_dir), spec))
                 for r in range(cfg.world)]  # fmt: skip
        for p in procs:
            p.start()
        while any(p.is_alive() for p in procs):
            if time.monotonic() - t0 > rep.bound_s:
                rep.hang = True
                break
            if fault == "junk" and junk is None:
                addrs = [run_dir / f"addr{r}.json" for r in range(cfg.world)]
                if all(a.exists() for a in addrs):
                    got = [json.loads(a.read_text()) for a in addrs]
                    junk = F.JunkSender([tuple(g["data"]) for g in got],
                                        [tuple(g["control"]) for g in got], job_id=1,
                                        seed=rep.run).start()  # fmt: skip
                    (run_dir / "junk_started").touch()
            trained = [(run_dir / f"trained{r}").exists() for r in range(cfg.world)]
            if fault == "junk" and junk is not None and sent is None and all(trained):
                sent = junk.stop()
                (run_dir / "junk_stopped").touch()
            if fault == "stall" and staller is None and _stopped(procs[victim].pid):
                # it stopped itself mid-op: it goes on after stall_s
                staller = threading.Timer(cfg.stall_s, os.kill, (procs[victim].pid, signal.SIGCONT))
                staller.start()  # fmt: skip
            time.sleep(0.05)
        if rep.hang:
            for p in procs:
                if p.is_alive():
                    _reap({p.pid})
        for p in procs:
            p.join(timeout=10)
        if staller is not None:
            staller.join()
        if junk is not None and sent is None:
            sent = junk.stop()
    rep.wall_s = time.monotonic() - t0
    if rep.hang:
        rep.ok, rep.cause = False, "hang"
        rep.detail = f"past {rep.bound_s:.0f} s; steps {_steps(run_dir, cfg.world)}"
        return
    _check_ranks(cfg, rep, run_dir, [p.exitcode for p in procs], victim, sent,
                 junk.raw_error if junk else None)  # fmt: skip


def _stopped(pid: int) -> bool:
    """Is `pid` stopped by a signal (state T in /proc)?"""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    return False


def _steps(run_dir: Path, world: int) -> list:
    out = []
    for r in range(world):
        with contextlib.suppress(OSError):
            out.append(W.step_file(str(run_dir), r).read_text())
    return out


def _fail(rep: RunReport, cause: str, detail: str) -> None:
    if rep.ok:  # the first failure names the run
        rep.ok, rep.cause, rep.detail = False, cause, detail


def _check_ranks(cfg: SoakConfig, rep: RunReport, run_dir: Path, codes: list, victim: int,
                 sent: dict | None, raw_error: str | None) -> None:  # fmt: skip
    fault = rep.fault
    results: dict[int, dict] = {}
    for r in range(cfg.world):
        f = run_dir / f"result{r}.json"
        if f.exists():
            results[r] = json.loads(f.read_text())
    killed = fault == "kill"
    want_codes = [(-signal.SIGKILL if killed and r == victim else 0) for r in range(cfg.world)]
    rep.facts["exit_codes"] = codes
    if codes != want_codes:
        bad = [r for r in range(cfg.world) if codes[r] != want_codes[r]]
        tail = ""
        for r in bad:
            with contextlib.suppress(OSError):
                tail = (run_dir / f"err{r}.txt").read_text()[-600:]
        _fail(rep, "outcome: exit code", f"exit codes {codes} (want {want_codes}): {tail}")
    survivors = [r for r in range(cfg.world) if not (killed and r == victim)]
    if missing := [r for r in survivors if r not in results]:
        _fail(rep, "outcome: no result", f"ranks {missing} wrote no result")
        return
    # exclusions exactly as the fault explains
    for r in survivors:
        got = results[r]["faults"]
        if fault in ("kill", "stall") and r != victim:
            want: list | None = [victim]
        elif fault == "stall":
            want = None  # the stalled rank: some peers, it finds itself alone
        else:
            want = []
        if (want is None and not got) or (want is not None and got != want):
            _fail(rep, "outcome: exclusion",
                  f"rank {r} excluded {got} (want {'some' if want is None else want})")  # fmt: skip
    rep.facts["backend"] = sorted({results[r]["backend"] for r in survivors})
    rep.facts["t_b_us"] = [results[r]["t_b_us"] for r in survivors]
    rep.facts["step_s_max"] = [round(results[r]["step_s_max"], 3) for r in survivors]
    # loss: counted, and explained by the phase that ended
    for r in survivors:
        for p1e, p1r, p2e, p2r, why1, why2 in results[r]["ops"]:
            rep.lost += (p1e - p1r) + (p2e - p2r)
            if why1 == "complete":
                rep.unexplained_lost += p1e - p1r
            if why2 == "complete":
                rep.unexplained_lost += p2e - p2r
    if rep.unexplained_lost:
        _fail(rep, "loss: unexplained", f"{rep.unexplained_lost} packets missing in phases "
              "that ended complete")  # fmt: skip
    # replicas: equal among the ranks that stayed together, unless loss was counted
    together = [r for r in survivors if not results[r]["faults"] or fault == "kill"]
    sums = {results[r].get("checksum") for r in together if not (fault == "stall" and r == victim)}
    if rep.piece == "train":
        rep.facts["replicas_equal"] = len(sums) == 1
        if len(sums) > 1 and rep.lost == 0:
            _fail(rep, "outcome: replicas differ", f"checksums {sums} without any counted loss")
    else:  # a call whose ops all completed, among the same ranks, is the exact mean
        exact = [c for r in survivors for c in results[r]["calls"] if c["lossless"] and c["stable"]]
        worst = max((c["rel_l2"] for c in exact), default=0.0)
        rep.facts.update(exact_calls=len(exact), worst_exact_rel_l2=worst)
        if worst > W.EXACT_REL_L2:
            _fail(rep, "outcome: wrong result without counted loss",
                  f"relative L2 error {worst:.2e} > {W.EXACT_REL_L2:g}, lossless call")  # fmt: skip
    if fault == "sockbuf":
        rep.facts["granted_buffers"] = results[victim]["granted_buffers"]
        rep.facts["kernel_drops"] = results[victim]["kernel_drops"]
    if fault == "junk":
        _check_junk(rep, results, sent or {}, raw_error)


def _check_junk(rep: RunReport, results: dict, sent: dict, raw_error: str | None) -> None:
    """Every junk datagram a data socket read is dropped and counted; the control plane
    counts what it read (the rest waits unread in its buffer until the socket closes)."""
    facts = {"raw_error": raw_error, "ranks": {}}
    for r, res in results.items():
        d = sent.get(f"data{r}", {"outsider": 0, "spoofed": 0})
        c = sent.get(f"control{r}", {"outsider": 0, "spoofed": 0})
        counted = sum(res["counters"].get(k, 0) for k in JUNK_REASONS)
        ctl = res["control"]
        ctl_counted = ctl["not_member"] + ctl["wrong_sender"] + ctl["foreign"]
        drops = res["kernel_drops"]["data"]
        facts["ranks"][r] = {"data_sent": d, "data_counted": counted, "data_kernel_drops": drops,
                             "control_sent": c, "control_counted": ctl_counted}  # fmt: skip
        total = d["outsider"] + d["spoofed"]
        if counted > total or (drops == 0 and counted < total):
            _fail(rep, "outcome: junk not counted",
                  f"rank {r}: {total} junk datagrams sent to its data socket, {counted} "
                  f"counted as dropped, kernel drops {drops}")  # fmt: skip
        if ctl_counted > c["outsider"] + c["spoofed"]:
            _fail(rep, "outcome: junk miscounted", f"rank {r} control: {ctl_counted} counted, "
                  f"{c['outsider'] + c['spoofed']} sent")  # fmt: skip
    rep.facts["junk"] = facts
    rep.facts["counters"] = {r: res["counters"] for r, res in results.items()}
    rep.facts["control"] = {r: res["control"] for r, res in results.items()}


def ctrl_c_reaches(cmd: list[str]) -> list[str]:
    """cmd run with SIGINT at its default (then Python turns it into KeyboardInterrupt),
    even when this campaign was started with SIGINT ignored (a shell's background job): the
    run is a foreground command under a user's Ctrl-C. A small interpreter resets it and
    execs cmd (no Python between fork and exec in this threaded process)."""
    reset = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "os.execvp(sys.argv[1], sys.argv[1:])")  # fmt: skip
    return [sys.executable, "-c", reset, *cmd]


def _sigint_run(cfg: SoakConfig, rep: RunReport, run_dir: Path, mark: str, tmp: Path) -> None:
    """`optireduce train` (2 processes, optireduce only) in its own session; SIGINT to its
    group once its workers have trained 5 steps (the first progress file); it must exit
    non-zero, saying so, within the bound."""
    out = run_dir / "out"
    cmd = [
        sys.executable,
        "-m",
        "optireduce.cli",
        "train",
        "--world",
        "2",
        "--steps",
        "60",
        "--methods",
        "optireduce",
        "--seed",
        str(cfg.seed + rep.run),
        "-o",
        str(out),
    ]
    progress = out / "raw" / "optireduce" / "progress"
    t0 = time.monotonic()
    with _run_env(mark, tmp), open(run_dir / "stderr.txt", "w") as err:
        proc = subprocess.Popen(ctrl_c_reaches(cmd), stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)  # fmt: skip
        sent_at = None
        while proc.poll() is None:
            now = time.monotonic()
            if sent_at is None and (progress.exists() or now - t0 > 60):
                os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C: the whole foreground group
                sent_at = now
            if sent_at is not None and now - sent_at > rep.bound_s:
                rep.hang = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                break
            time.sleep(0.05)
    rep.wall_s = time.monotonic() - t0
    rep.bounded_s = None if sent_at is None else time.monotonic() - sent_at
    stderr = (run_dir / "stderr.txt").read_text()
    rep.facts.update(
        exit_code=proc.returncode,
        signalled=sent_at is not None,
        exit_after_sigint_s=rep.bounded_s,
        last_line=stderr.strip().splitlines()[-1][:200] if stderr.strip() else "",
    )
    if rep.hang:
        rep.ok, rep.cause = False, "hang"
        rep.detail = f"still running {rep.bound_s:.0f} s after SIGINT: {stderr[-600:]}"
    elif sent_at is None:
        _fail(rep, "outcome: finished before SIGINT", "the run ended before training began")
    elif proc.returncode != 130 or "optireduce train: interrupted" not in stderr:
        _fail(rep, "outcome: unclear error", f"exit {proc.returncode}: {stderr[-400:]}")
    elif "leaked" in stderr:  # nanobind's report of objects alive at exit: not closed
        _fail(rep, "outcome: not closed", stderr[stderr.index("leaked") - 20 :][:300])


def _replay_run(cfg: SoakConfig, rep: RunReport) -> None:
    """Every scenario's trace, mutated, through the model and the native engine."""
    from optireduce.host.native.engine import NativeNicModel
    from optireduce.sim.replay import differences, replay
    from optireduce.sim.trace import SCENARIOS, make_trace
    from optireduce.sim.trace_mutate import mutate

    t0 = time.monotonic()
    dropped = 0
    for k, scenario in enumerate(SCENARIOS):
        frames = mutate(make_trace(scenario, cfg.seed + rep.run), seed=rep.run * 100 + k)
        a, b = replay(frames, "model"), replay(frames, NativeNicModel)
        dropped += sum(a.counters.get(r, 0) for r in JUNK_REASONS)
        if bad := differences(a, b):
            _fail(rep, "outcome: replay differs", f"{scenario}: {'; '.join(bad[:3])}")
        if time.monotonic() - t0 > rep.bound_s:
            rep.hang = True
            _fail(rep, "hang", f"replay past {rep.bound_s} s")
            break
    rep.wall_s = time.monotonic() - t0
    rep.facts.update(scenarios=len(SCENARIOS), malformed_dropped=dropped)


# ---------------------------------------------------------------- the campaign


def schedule(cfg: SoakConfig) -> list[tuple[str, str]]:
    """(piece, fault) of every run, in order: training runs with the faults in turn, a
    sigint run and a replay run every so often."""
    out = []
    for k in range(cfg.runs):
        out.append(("train", cfg.faults[k % len(cfg.faults)]))
        if cfg.sigint_every and (k + 1) % cfg.sigint_every == 0:
            out.append(("sigint", "sigint"))
        if cfg.replay_every and (k + 1) % cfg.replay_every == 0:
            out.append(("replay", "junk"))
        if cfg.collective_every and (k + 1) % cfg.collective_every == 0:
            j = (k + 1) // cfg.collective_every - 1
            out.append(("collective", cfg.faults[-1 - j % len(cfg.faults)]))  # junk first
    return out


def run_one(cfg: SoakConfig, k: int, piece: str, fault: str, base: Path) -> RunReport:
    bound = {"replay": 120.0}.get(piece, F.OUTCOMES[fault].bound_s)
    rep = RunReport(k, piece, fault, bound_s=bound)
    mark = f"{os.getpid()}-{k}"
    run_dir = Path(tempfile.mkdtemp(prefix=f"run{k}-", dir=base))
    tmp = run_dir / "tmp"
    tmp.mkdir()
    before = Baseline.now()
    engine = _engine_stamp()
    rep.facts["engine_rebuilt"] = False
    try:
        if piece in ("train", "collective"):
            _ranks_run(cfg, rep, run_dir, mark, tmp)
        elif piece == "sigint":
            _sigint_run(cfg, rep, run_dir, mark, tmp)
        else:
            _replay_run(cfg, rep)
    except Exception as e:  # a campaign reports, it does not stop
        _fail(rep, "error", f"{type(e).__name__}: {e}")
    rep.leaks = leaks(before, mark, tmp)
    rep.facts["appeared"] = appeared(before)
    if rep.leaks:
        _fail(rep, "leak", json.dumps(rep.leaks)[:400])
        _reap({int(p.split()[0]) for p in rep.leaks.get("processes", [])})
    rep.facts["engine_rebuilt"] = _engine_stamp() != engine
    crashed = {-signal.SIGBUS, -signal.SIGSEGV} & set(rep.facts.get("exit_codes", []))
    if _engine_stamp() != engine and not rep.ok and crashed:
        # someone rebuilt the engine (make install) under the run and a worker crashed
        # in it: not the product's. Any other failure stays the product's.
        rep.detail = f"{rep.cause}: {rep.detail}"
        rep.cause = ENV_CAUSE
    if not rep.ok and cfg.keep_failed:  # the evidence, for whoever looks into it
        shutil.copytree(run_dir, Path(cfg.keep_failed, run_dir.name), ignore=_no_tmp,
                        dirs_exist_ok=True)  # fmt: skip
        rep.facts["kept"] = str(Path(cfg.keep_failed, run_dir.name))
    shutil.rmtree(run_dir, ignore_errors=True)
    return rep


def _no_tmp(folder: str, names: list[str]) -> list[str]:
    return ["tmp"] if Path(folder).name.startswith("run") else []


def run_soak(cfg: SoakConfig, progress: Callable[[RunReport, int], None] | None = None) -> dict:
    """The campaign: every run of schedule(cfg) until cfg.minutes; the report."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # spawn's helper lives as long as we do: not a run's
    plan = schedule(cfg)
    t0 = time.monotonic()
    reports: list[RunReport] = []
    base = Path(tempfile.mkdtemp(prefix=PREFIX))
    start = Baseline.now()
    try:
        for k, (piece, fault) in enumerate(plan):
            if time.monotonic() - t0 > 60 * cfg.minutes:
                break
            rep = run_one(cfg, k, piece, fault, base)
            reports.append(rep)
            if progress:
                progress(rep, len(plan))
    except BaseException:  # Ctrl-C or an error mid-run: no rank may outlive the campaign
        _reap_campaign(start)
        raise
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = summarize(cfg, reports, time.monotonic() - t0, len(plan))
    now = {"shm": _shm(), "netns": _netns()}
    out["system_leftovers"] = {
        k: sorted({n for r in reports for n in r.facts.get("appeared", {}).get(k, [])}
                  & (now[k] - getattr(start, k)))
        for k in now
    }  # fmt: skip
    return out


def summarize(cfg: SoakConfig, reports: list[RunReport], wall_s: float, planned: int) -> dict:
    by_fault: dict[str, dict] = {}
    for r in reports:
        key = {"train": r.fault, "collective": f"collective/{r.fault}"}.get(r.piece, r.piece)
        d = by_fault.setdefault(key, {"runs": 0, "ok": 0, "failed": 0, "max_s": 0.0,
                                      "bound_s": r.bound_s, "lost_packets": 0})  # fmt: skip
        d["runs"] += 1
        d["ok" if r.ok else "failed"] += 1
        d["max_s"] = round(max(d["max_s"], r.wall_s if r.bounded_s is None else r.bounded_s), 1)
        d["lost_packets"] += r.lost
    leak_kinds = Counter(k for r in reports for k in r.leaks)
    train = [r for r in reports if r.piece == "train"]
    return {
        "runs": len(reports),
        "planned": planned,
        "wall_s": round(wall_s, 1),
        "train_runs": len(train),
        "train_failures": sum(not r.ok for r in train),
        "failures": sum(not r.ok for r in reports),
        "unexplained_failures": sum(not r.ok and r.cause != ENV_CAUSE for r in reports),
        "train_unexplained_failures": sum(not r.ok and r.cause != ENV_CAUSE for r in train),
        "failures_by_cause": dict(Counter(r.cause for r in reports if not r.ok)),
        "hangs": sum(r.hang for r in reports),
        "entries_lost_unexplained": sum(r.unexplained_lost for r in reports),
        "leaks": sum(bool(r.leaks) for r in reports),
        "leaks_by_kind": {k: leak_kinds.get(k, 0) for k in ("processes", "sockets", "tmp")},
        "by_fault": by_fault,
        "outcomes": {f: {"what": o.what, "bound_s": o.bound_s} for f, o in F.OUTCOMES.items()},
        "failed_runs": [asdict(r) for r in reports if not r.ok],
        "settings": asdict(cfg),
    }


def plot(report: dict, path: str) -> None:
    """Runs per fault kind: ok and failed, with the longest run against its bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(report["by_fault"])
    labels = [k.replace("collective/", "coll. ") for k in kinds]
    ok = np.array([report["by_fault"][k]["ok"] for k in kinds])
    bad = np.array([report["by_fault"][k]["failed"] for k in kinds])
    x = np.arange(len(kinds))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    a.bar(x, ok, color="tab:green", label="documented outcome")
    a.bar(x, bad, bottom=ok, color="tab:red", label="failed")
    for i, (o, f) in enumerate(zip(ok, bad, strict=True)):
        a.text(i, o + f, f"{o}/{o + f}", ha="center", va="bottom", fontsize=7)
    a.set_ylabel("runs")
    a.set_ylim(0, 1.3 * max(1, int((ok + bad).max())))
    a.set_title("outcome per fault kind", fontsize=9)
    a.legend(fontsize=8, loc="upper right")
    mx = [report["by_fault"][k]["max_s"] for k in kinds]
    bound = [report["by_fault"][k]["bound_s"] for k in kinds]
    b.bar(x - 0.2, mx, 0.4, color="tab:blue", label="longest run")
    b.bar(x + 0.2, bound, 0.4, color="tab:gray", alpha=0.5, label="bound")
    b.set_ylabel("seconds")
    b.set_ylim(0, 1.3 * max(bound))
    b.set_title("longest run against its bound", fontsize=9)
    b.legend(fontsize=8, loc="upper right")
    for ax in (a, b):
        ax.set_xticks(x, labels, rotation=40, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"soak: {report['runs']} runs in {report['wall_s'] / 60:.1f} min, "
                 f"{report['failures']} failed, {report['hangs']} hangs, "
                 f"{report['leaks']} with leaks", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
