"""`optireduce bench collective`: OptiReduce against its baselines, 4 processes on loopback.

All figures come from one run of `world` worker processes (torch.multiprocessing,
spawn; a FileStore in a temporary directory; gloo on `lo`; one thread each):

- **lossless**: throughput on a 16 MiB bucket (4 Mi float32) of the OptiReduce software
  path (the driver's first software backend: `native` when the extension is built, else
  `software`; loopback-sized packets `LOOPBACK_PARAMS`, no impairment, a t_B
  so large that no phase can time out) and of torch's gloo allreduce, both reducing a
  buffer in place (as DDP reduces a bucket: gloo's all_reduce on the tensor, the
  OptiReduce op with out=x), refilled from the input before each op, untimed. Bus-bandwidth
  convention: bucket bytes / op seconds, in GB/s (1e9 bytes/s), from the median op.
- **keyed**: the same 16 MiB op in a keyed job (docs/security.md: every datagram tagged and
  checked) against the unkeyed one, the two in turns op by op; throughput and CPU ratios.
  Every other section runs unkeyed, whatever OPTIREDUCE_KEY_FILE says.
- **sizes**: the same lossless comparison at 1, 16 and 64 MiB (16 MiB is the run above), with
  the CPU seconds per GB of each method: ru_utime + ru_stime of each worker over its timed ops
  (engine threads included), summed over the ranks, per GB of bucket reduced.
- **rss_256mib**: peak resident set per rank while it reduces a 256 MiB bucket, for each method
  (VmHWM of /proc/self/status, reset through /proc/self/clear_refs before each method; the
  process's ru_maxrss when that file cannot be reset), beside the rank's RSS before the
  bucket was allocated.
- **tail_R** for R = P99/P50 of the injected delay (1.5 and 3): per-op latency of
  OptiReduce, the reliable ring and reliable TAR under
  `ImpairmentSpec(median_us=TAIL_MEDIAN_US, p99_ratio=R, loss=0)` on a smaller bucket,
  the algorithms interleaved op by op so that machine noise hits them alike.
  OptiReduce's t_B is calibrated first by `SoftwareNic.calibrate` over the reliable path.
  When OptiReduce runs on the native engine, so do the baselines (host/native/reliable.py:
  the same native transport and impairment, ACKs included, so the comparison is of
  algorithms); otherwise, or if the native module lacks them, the Python ones
  (experiments/baselines.py over host/reliable.py), with one log line saying why. The
  JSON's `baselines` says which ran.

An op's time is the slowest rank's, each rank timing from the gloo barrier that starts
the op to the moment it holds the result. The reliable baselines flush their acks after
the timed part, before the next barrier.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from optireduce import ubt

# 16 KiB datagrams, 1 MiB ops, exponents agreed in-band (no exchange before each call)
# public: the keyed section measures what the tags cost, it protects nothing
BENCH_KEY = hashlib.blake2b(b"optireduce bench key", digest_size=ubt.KEY_LEN).digest()
LOOPBACK_PARAMS = {"p": 4096, "b": 16384, "c": 262144, "exp_inband": True, "progress_ahead": True}
LOSSLESS_ELEMENTS = 4 << 20  # 16 MiB of float32
TAIL_ELEMENTS = 1 << 18  # 1 MiB of float32: one OptiReduce op
TAIL_MEDIAN_US = 2000
TAIL_RATIOS = (1.5, 3.0)
ALGOS = ("optireduce", "reliable_ring", "reliable_tar")


SIZES_MIB = (1, 16, 64)
RSS_ELEMENTS = 64 << 20  # 256 MiB of float32


def _config(quick: bool) -> dict:
    return {
        "lossless_elements": (1 << 20) if quick else LOSSLESS_ELEMENTS,
        "lossless_reps": 2 if quick else 5,
        "sizes_elements": [1 << 16, 1 << 18] if quick else [m << 18 for m in SIZES_MIB],
        "sizes_reps": 2 if quick else 3,
        "rss_elements": (1 << 20) if quick else RSS_ELEMENTS,
        "tail_elements": (1 << 16) if quick else TAIL_ELEMENTS,
        "tail_ops": 5 if quick else 100,
        "tail_median_us": TAIL_MEDIAN_US,
        "tail_ratios": TAIL_RATIOS,
        "params": LOOPBACK_PARAMS,
    }


def _pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q))


def _optireduce_op(nic, x: np.ndarray) -> list:
    return nic.allreduce(x)[1]


class _PythonBaselines:
    """The Python reliable baselines behind the face of NativeReliable."""

    implementation = "python"

    def __init__(self, transport, rank: int, world: int, cfg) -> None:
        from optireduce.host.reliable import ReliableEndpoint

        self.ep, self.rank, self.world = ReliableEndpoint(transport, cfg), rank, world

    def ring_allreduce(self, x: np.ndarray, *, timeout: float) -> np.ndarray:
        from optireduce.experiments.baselines import reliable_ring_allreduce

        return reliable_ring_allreduce(self.ep, self.rank, self.world, x, timeout=timeout)

    def tar_allreduce(self, x: np.ndarray, *, timeout: float) -> np.ndarray:
        from optireduce.experiments.baselines import reliable_tar_allreduce

        return reliable_tar_allreduce(self.ep, self.rank, self.world, x, timeout=timeout)

    @property
    def retransmissions(self) -> int:
        return self.ep.retransmissions

    def flush(self, timeout: float) -> None:
        self.ep.flush(timeout)

    def close(self, timeout: float = 30.0, quiet_s: float | None = None) -> None:
        self.ep.settle(timeout=timeout, quiet_s=quiet_s)


def _baselines(backend: str, transport, rank: int, world: int, datagram_bytes: int):
    """The native reliable baselines when OptiReduce runs native, else the Python ones
    (one log line saying why). Their datagrams are as long as OptiReduce's: the impairment
    delays each datagram, so a method that cut its data into fewer, longer datagrams would
    wait for the maximum of fewer delays."""
    from optireduce.host.reliable import ReliableConfig

    cfg = ReliableConfig(max_datagram=datagram_bytes)
    if backend == "native":
        from optireduce.host.native.reliable import NativeReliable, NativeReliableUnavailable

        try:
            return NativeReliable(rank, world, transport, cfg=cfg), ""
        except NativeReliableUnavailable as e:
            why = str(e)
    else:
        why = f"OptiReduce runs on the {backend} backend, not the native engine"
    logging.getLogger("optireduce").info(
        "optireduce rank %d: Python reliable baselines (%s)", rank, why
    )
    return _PythonBaselines(transport, rank, world, cfg), why


def _cpu_s() -> float:
    """CPU seconds of this process so far (every thread: the engine's too)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _reset_peak_rss() -> bool:
    """Restart VmHWM from the current RSS (Linux >= 4.0); False if it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib(resettable: bool) -> float:
    """Peak RSS since the last reset (VmHWM), or the process's ru_maxrss, in MiB."""
    if resettable:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _worker(rank: int, world: int, tmp: str, cfg: dict, q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from optireduce.experiments.baselines import gloo_allreduce_mean
    from optireduce.host.driver import select_nic, torch_exponent_agreement
    from optireduce.host.model.impairment import ImpairmentSpec
    from optireduce.host.transport import UdpTransport, transport_from_store
    from optireduce.params import NicParams

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()

    def say(msg: str) -> None:
        if rank == 0:
            q.put(msg)

    def slowest(times: list[float]) -> list[float]:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def transport(name: str, spec, seed: int, key: bytes | None = None) -> UdpTransport:
        prefixed = dist.PrefixStore(f"bench/{name}/", store)  # fresh keys per transport
        return transport_from_store(prefixed, rank, world, impairment=spec, seed=seed, key=key)

    def summed(v: float) -> float:
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def timed(fn: Callable[[], object]) -> tuple[float, object]:
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    def in_place(
        op: Callable[[], object],
        src: np.ndarray,
        buf: np.ndarray,
        reps: int,
        seen: Callable[[object], None] = lambda r: None,
    ) -> tuple[list[float], float]:
        """reps + 1 calls of op, which reduces `buf` in place (as DDP reduces a bucket: no
        fresh output to fault in), each after `buf` is refilled from `src` (not timed); the
        first call pays for set-up. (times, CPU seconds) of the others; `seen` gets every
        call's return value."""
        times, cpu = [], 0.0
        for k in range(reps + 1):
            np.copyto(buf, src)
            c0 = _cpu_s()
            dt, got = timed(op)
            seen(got)
            if k:
                times.append(dt)
                cpu += _cpu_s() - c0
        return times, cpu

    rng = np.random.default_rng(1000 + rank)
    res: dict = {}
    agree = torch_exponent_agreement()

    # ---- lossless throughput -----------------------------------------------------------------
    n, reps = cfg["lossless_elements"], cfg["lossless_reps"]
    x = rng.standard_normal(n).astype(np.float32)
    buf = np.empty_like(x)
    buft = torch.from_numpy(buf)  # the same memory
    say(f"lossless: gloo allreduce of {4 * n >> 20} MiB")
    gloo_t, gloo_cpu = in_place(lambda: gloo_allreduce_mean(buft, in_place=True), x, buf, reps)
    r = buf.copy()
    tr = transport("lossless", None, rank)
    # Lossless: a phase ends only when complete (t_C floored at t_B = 5 s), so a rank that
    # the shared cores deschedule for a while costs time, not data.
    p = NicParams(**cfg["params"], t_b_us=5_000_000, t_c_min_us=5_000_000)
    nic = select_nic(p, rank, world, transport=tr, agree=agree)
    say(f"lossless: OptiReduce allreduce of {4 * n >> 20} MiB")
    stats: list = []
    or_t, or_cpu = in_place(lambda: nic.allreduce(buf, out=buf), x, buf, reps,
                            lambda got: stats.extend(got[1]))  # fmt: skip
    lost = sum(s.lost_phase1 + s.lost_phase2 for s in stats)
    out = buf
    gloo_t, or_t = slowest(gloo_t), slowest(or_t)
    gloo_cpu, or_cpu = summed(gloo_cpu), summed(or_cpu)
    res["backend"] = nic.backend
    res["lossless"] = {
        "optireduce_gbps": 4 * n / float(np.median(or_t)) / 1e9,
        "gloo_gbps": 4 * n / float(np.median(gloo_t)) / 1e9,
        "bucket_bytes": 4 * n,
        "ops": reps,
        "optireduce_op_ms": [1e3 * t for t in or_t],
        "gloo_op_ms": [1e3 * t for t in gloo_t],
        "optireduce_params": {**cfg["params"], "t_b_us": p.t_b_us, "t_c_min_us": p.t_c_min_us},
        "optireduce_lost_packets_rank0": lost,
        "optireduce_rel_l2_err_vs_gloo": float(np.linalg.norm(out - r) / np.linalg.norm(r)),
    }
    res["lossless"]["gloo_over_optireduce"] = (
        res["lossless"]["gloo_gbps"] / res["lossless"]["optireduce_gbps"]
    )
    gb = 4 * n * reps / 1e9
    res["lossless"]["optireduce_cpu_s_per_gb"] = or_cpu / gb
    res["lossless"]["gloo_cpu_s_per_gb"] = gloo_cpu / gb

    # ---- a keyed job: what tagging every datagram costs (docs/security.md) -------------------
    say(f"keyed: OptiReduce allreduce of {4 * n >> 20} MiB, keyed and not, in turns")
    keyed_tr = transport("keyed", None, rank, key=BENCH_KEY)
    keyed = select_nic(p, rank, world, transport=keyed_tr, agree=agree)
    kt: dict[str, list[float]] = {"unkeyed": [], "keyed": []}
    kcpu = dict.fromkeys(kt, 0.0)
    for k in range(2 * reps + 1):  # in turns, so that a change of load hits both alike
        for name, knic in (("unkeyed", nic), ("keyed", keyed)):
            np.copyto(buf, x)
            c0 = _cpu_s()
            dt, _ = timed(lambda knic=knic: knic.allreduce(buf, out=buf))
            if k:
                kt[name].append(dt)
                kcpu[name] += _cpu_s() - c0
    keyed_err = float(np.linalg.norm(buf - r) / np.linalg.norm(r))  # its last op's result
    keyed_counters = keyed.counters()
    if keyed.backend != nic.backend:  # the ratio would compare two backends
        raise RuntimeError(f"bench keyed: the keyed op ran on {keyed.backend}, the unkeyed "
                           f"on {nic.backend}")  # fmt: skip
    keyed.close()
    keyed_tr.close()
    kt = {name: slowest(v) for name, v in kt.items()}
    kgb = {name: 4 * n / float(np.median(v)) / 1e9 for name, v in kt.items()}
    kcpu = {name: summed(v) for name, v in kcpu.items()}
    res["keyed"] = {
        "bucket_bytes": 4 * n, "ops": 2 * reps,
        "unkeyed_gbps": kgb["unkeyed"], "keyed_gbps": kgb["keyed"],
        "keyed_over_unkeyed_gbps": kgb["keyed"] / kgb["unkeyed"],
        "keyed_over_unkeyed_cpu": kcpu["keyed"] / kcpu["unkeyed"],
        "keyed_rel_l2_err_vs_gloo": keyed_err,
        "keyed_bad_tag_rank0": keyed_counters.get("bad_tag", 0),
    }  # fmt: skip

    # ---- sizes: throughput and CPU per GB at each bucket size --------------------------------
    def compare(m: int, reps: int) -> dict:
        xm = rng.standard_normal(m).astype(np.float32)
        bm = np.empty_like(xm)
        bmt = torch.from_numpy(bm)
        ops = {"optireduce": lambda: nic.allreduce(bm, out=bm),
               "gloo": lambda: gloo_allreduce_mean(bmt, in_place=True)}  # fmt: skip
        t, cpu = {}, {}
        for algo, op in ops.items():
            t[algo], cpu[algo] = in_place(op, xm, bm, reps)
        part: dict = {"bucket_bytes": 4 * m, "ops": reps}
        for algo in t:
            part[f"{algo}_gbps"] = 4 * m / float(np.median(slowest(t[algo]))) / 1e9
            part[f"{algo}_cpu_s_per_gb"] = summed(cpu[algo]) / (4 * m * reps / 1e9)
        return part

    sizes = {}
    for m in cfg["sizes_elements"]:
        say(f"sizes: {4 * m >> 20} MiB, OptiReduce and gloo")
        if m == n:  # the lossless run above
            sizes[f"{4 * m / 2**20:g}MiB"] = {
                "bucket_bytes": 4 * m, "ops": reps,
                **{k: res["lossless"][k] for k in ("optireduce_gbps", "gloo_gbps",
                                                    "optireduce_cpu_s_per_gb",
                                                    "gloo_cpu_s_per_gb")},
            }  # fmt: skip
        else:
            sizes[f"{4 * m / 2**20:g}MiB"] = compare(m, cfg["sizes_reps"])
    res["sizes"] = sizes

    # ---- peak RSS per rank on a big bucket (ops of C elements, K in flight, any size) -------
    m = cfg["rss_elements"]
    say(f"rss: {4 * m >> 20} MiB bucket, OptiReduce then gloo")
    before = _rss_mib()
    xm = rng.standard_normal(m).astype(np.float32)
    peaks = {}
    resettable = _reset_peak_rss()
    dist.barrier()
    nic.allreduce(xm)
    peaks["optireduce"] = _peak_rss_mib(resettable)
    xmt = torch.from_numpy(xm)
    resettable = resettable and _reset_peak_rss()
    dist.barrier()
    gloo_allreduce_mean(xmt)
    peaks["gloo"] = _peak_rss_mib(resettable)
    nic.close()

    def per_rank(v: float) -> list[float]:
        got = [None] * world
        dist.all_gather_object(got, v)
        return got

    res["rss_256mib"] = {
        "bucket_bytes": 4 * m,
        "rss_before_bucket_mib": per_rank(before),
        "optireduce_peak_rss_mib": per_rank(peaks["optireduce"]),
        "gloo_peak_rss_mib": per_rank(peaks["gloo"]),
        "peak_is_since_reset": resettable,
        "c_x_k_bytes": 4 * p.c * p.ops_in_flight,  # one window of K ops of C float32
    }

    # ---- tail latency under injected delay ---------------------------------------------------
    n, ops = cfg["tail_elements"], cfg["tail_ops"]
    x = rng.standard_normal(n).astype(np.float32)
    for ratio in cfg["tail_ratios"]:
        spec = ImpairmentSpec(median_us=cfg["tail_median_us"], p99_ratio=ratio, loss=0.0)
        key = f"tail_{ratio:g}"
        nic_tr = transport(f"{key}/nic", spec, 7919 * rank + 1)
        rel_tr = transport(f"{key}/rel", spec, 7919 * rank + 2)
        nic = select_nic(NicParams(**cfg["params"], t_b_us=2_000_000), rank, world,
                         transport=nic_tr, agree=agree)  # fmt: skip
        datagram = ubt.HEADER_LEN + 4 * nic.p.p  # every method's datagrams this long
        ep, why = _baselines(nic.backend, rel_tr, rank, world, datagram)
        res["baselines"] = ep.implementation
        res["datagram_bytes"] = datagram
        if why:
            res["baselines_why"] = why
            say(f"{key}: Python reliable baselines ({why})")
        say(f"{key}: calibrating OptiReduce's t_B over the reliable path")
        t_b = nic.calibrate(x, ops=5)
        run = {
            "optireduce": partial(_optireduce_op, nic, x),
            "reliable_ring": partial(ep.ring_allreduce, x, timeout=30),
            "reliable_tar": partial(ep.tar_allreduce, x, timeout=30),
        }
        times: dict[str, list[float]] = {a: [] for a in ALGOS}
        retx = dict.fromkeys(ALGOS, 0)
        stats = []
        for k in range(ops + 1):
            say(f"{key}: op {k}/{ops} of each algorithm")
            for algo in ALGOS:
                before = ep.retransmissions
                dt, out = timed(run[algo])
                if algo == "optireduce":
                    stats += out if k else []
                else:
                    ep.flush(30)  # loss = 0: every ack arrives, so this ends
                    retx[algo] += ep.retransmissions - before
                if k:  # the first op of each pays for set-up
                    times[algo].append(dt)
        part = {}
        for algo in ALGOS:
            ms = [1e3 * t for t in slowest(times[algo])]
            part[algo] = {"p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99),
                          "mean_ms": float(np.mean(ms)), "max_ms": max(ms)}  # fmt: skip
        expected = sum(s.p1_expected + s.p2_expected for s in stats)
        missing = sum(s.lost_phase1 + s.lost_phase2 for s in stats)
        part["optireduce"].update(
            t_b_us=t_b,
            lost_fraction_rank0=missing / max(1, expected),
            deadline_phases_rank0=sum(
                (s.phase1_reason == "deadline") + (s.phase2_reason == "deadline") for s in stats
            ),
        )
        for algo in ("reliable_ring", "reliable_tar"):
            part[algo]["retransmissions_rank0"] = retx[algo]  # spurious: loss = 0
        res[key] = part
        ep.close(timeout=30, quiet_s=0.2)  # settles: peers get their last acks
        nic.close()
        rel_tr.close()
    if rank == 0:
        (Path(tmp) / "result.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def bench_collective(
    world: int = 4,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    timeout_s: float = 1200.0,
) -> dict:
    """Run the workers and return the figures (see the module docstring)."""
    import multiprocessing

    import torch.multiprocessing as mp

    cfg = _config(quick)
    q = multiprocessing.get_context("spawn").SimpleQueue()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="optireduce-bench-") as tmp:
        ctx = mp.start_processes(
            _worker, args=(world, tmp, cfg, q), nprocs=world, join=False, start_method="spawn"
        )
        while not ctx.join(timeout=0.5):
            while not q.empty():
                if progress is not None:
                    progress(q.get())
            if time.monotonic() - t0 > timeout_s:
                for proc in ctx.processes:
                    proc.kill()
                raise TimeoutError(f"bench collective: workers did not finish in {timeout_s} s")
        res = json.loads((Path(tmp) / "result.json").read_text())
    t3 = res["tail_3"]
    out = {
        "world": world,
        "backend": res["backend"],
        "baselines": res["baselines"],
        "datagram_bytes": res["datagram_bytes"],
        **({"baselines_why": res["baselines_why"]} if "baselines_why" in res else {}),
        "lossless": res["lossless"],
        "keyed": res["keyed"],
        "sizes": res["sizes"],
        "rss_256mib": res["rss_256mib"],
        "tail_bucket_bytes": 4 * cfg["tail_elements"],
        "tail_median_us": cfg["tail_median_us"],
        "tail_ops_per_algorithm": cfg["tail_ops"],
        "tail_loss": 0.0,
        **{k: v for k, v in res.items() if k.startswith("tail_")},
        "ratios": {
            "optireduce_p99_over_ring_p99_at_3": t3["optireduce"]["p99_ms"]
            / t3["reliable_ring"]["p99_ms"],
            "optireduce_p99_over_ring_p99_at_3_target": 0.5,
            "optireduce_p99_over_p50_at_3": t3["optireduce"]["p99_ms"] / t3["optireduce"]["p50_ms"],
            "optireduce_p99_over_p50_at_3_target": 1.3,
        },
        "method": (
            "op time = slowest rank, barrier to result; GB/s = bucket bytes / median op s / 1e9; "
            "tail ops interleaved across algorithms; first op of each series not counted"
        ),
        "seconds": time.monotonic() - t0,
    }
    return out
