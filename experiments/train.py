"""Time-to-accuracy: DDP with the OptiReduce hook against plain DDP on
gloo, real processes on loopback, under the same injected tail.

Task: the loss-tolerance experiment's (`optireduce.experiments.loss_tolerance`: scikit-learn's
digits, shipped in the package; the MLP 64-32-10 on one flat parameter vector, its
initial weights, shards and minibatch order; SGD with momentum). Here the workers are
`world` processes (experiments/workers.py: forked from a server with torch imported;
FileStore; gloo on `lo`; one thread each) training one `DistributedDataParallel` model,
for a fixed number of steps.

The tail, one injection for every method:
- **a straggling rank**: in step t one rank r, drawn uniformly, starts its step d[t] late:
  it sleeps d[t] before its forward pass, whatever the method. d[t] is lognormal with
  median `straggler_median_ms` and P99/P50 = `tail` (seeded by the config only, so every
  method gets the same array). Everything rank r does in that step is late by
  construction: its compute, its data, and its control traffic (OptiReduce's exponent
  agreement, loss decision, replica checksum and resync). A reliable collective (gloo)
  waits for it; OptiReduce's deadlines decide what of it arrives in time.
- **per-packet delay**, on every transport we own: each datagram of OptiReduce's data
  and of its control plane gets a lognormal delay of median `packet_median_us` and the
  same P99/P50 (`host/model/impairment.py`; the hook's `impairment` covers both). gloo's
  TCP cannot be impaired from here (no netem on these machines), which favours gloo.

Op latency: OptiReduce's from the NICs' statistics (start of the op to its result, at
each rank); gloo's from a comm hook around torch's own allreduce hook (hand-off of the
bucket to its result, at each rank). Both include the wait for a straggler.

Before training, every OptiReduce rank runs one lossless check op on fixed inputs; the
parent compares each result with `simulate_allreduce` bit for bit (`verify_bit_exact`).
With `cosim_rank`, that rank's NIC is the co-simulated RTL (the driver's `sim` backend):
its harness owns its socket, so its sends carry no per-packet delay, and the straggler is
drawn from the other ranks (for both methods: the co-simulated rank is already the
slowest); `cosim_bit_exact` is its check.

Measured: every `eval_every` steps rank 0 keeps (step, wall seconds since the start,
its parameters); after the run the parent evaluates them on the held-out test split.
Time-to-accuracy is the first kept time whose accuracy reaches `target_acc`; final
accuracy is at the last step; entries lost is the fraction of reduced packets the NICs
missed (phase-2 loss: the entries a rank decoded without their sum), over every rank
and op of the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from optireduce.experiments import loss_tolerance as lt
from optireduce.host.model.impairment import ImpairmentSpec

METHODS = ("gloo", "optireduce")
SCHEDULES = ("cosine", "constant")
MODELS = ("digits", "large")  # the digits MLP, or experiments/large_model.py's 10 M MLP
# where the workers run: processes on this host's loopback, or each rank on a host of its
# own (experiments/netns.py: namespaces on a bridge, links shaped to 1 Gbit/s)
CLUSTERS = ("local", "netns")
# The NicParams fields a TrainConfig carries (n_max follows the world; the hook calibrates t_B).
NIC_FIELDS = ("p", "b", "c", "ops_in_flight", "t_c_min_us", "tc_dev_mult", "tc_gain_shift",
              "tc_sample", "estimator")  # fmt: skip
# OpStats fields kept per op: when each phase started and ended, and the T in force
OP_FIELDS = ("op_id", "start_us", "phase1_end_us", "end_us", "phase1_timeout_us",
             "phase2_timeout_us")  # fmt: skip
# With a co-simulated rank, control exchanges wait at least this long: the simulator is
# ~100x slower than its simulated time, and t_B would declare the rank dead.
COSIM_CONTROL_FLOOR_S = 5.0


@dataclass(frozen=True)
class TrainConfig:
    world: int = 4
    steps: int = 150
    batch: int = 32  # per worker
    lr: float = 0.1
    momentum: float = 0.9
    schedule: str = "cosine"  # learning rate over the steps: "cosine" (to 0) or "constant"
    eval_every: int = 5
    target_acc: float = 0.93
    seed: int = 0
    model: str = "digits"  # MODELS; large_config() gives "large" its own defaults
    large_width: int = 3072  # the large model's hidden width (3072: 10.3 M parameters)
    tail: float = 3.0  # P99/P50 of both the straggler and the per-packet delays
    straggler_median_ms: float = 20.0
    packet_median_us: float = 200.0
    p: int = 256  # NicParams of the hook: 2410 parameters are one op of 12 packets
    b: int = 1024
    c: int = 16384
    ops_in_flight: int = 2  # K
    # Floor of t_C, and with a straggler every step the deadline itself: the phases that
    # wait for it end by their deadline and sample t_C = T, its own phases give no sample,
    # so T sits on the floor. At 2 ms, 3-5 % of the entries were lost to our own processing
    # (the ranks' compute starting a few ms apart on 2 loaded cores); at 4 ms 1-3 %, time to
    # accuracy reached in 3 runs of 3 against 1 of 4 (measured by loss_attribution).
    t_c_min_us: int = 4000
    tc_dev_mult: int = 0  # t_C = mean + mult * deviation: the typical completion, not a tail
    tc_sample: str = "duration"  # t_C sample of a deadline-ended phase (NicParams)
    # t_C's EWMA gain 2^-shift. The warm-up's phases wait for every straggler, so t_C
    # leaves it far above the bounded phases' completions; at TCP's 1/8 it took about
    # 100 of the 150 steps to come down, at 1/4 about 50 (docs/results.md).
    tc_gain_shift: int = 2
    estimator: str = "unbiased"  # decode of missing reduced packets (NicParams)
    warmup_iters: int = 5
    checksum_every: int = 10
    control_floor_s: float | None = None  # least wait of a control exchange (None: the hook's)
    policy: str = "accept"
    methods: tuple[str, ...] = METHODS
    cosim_rank: int | None = None  # optireduce: this rank's NIC is the co-simulated RTL
    cluster: str = "local"  # CLUSTERS
    boards: tuple[int, ...] = ()  # optireduce, netns: these ranks' NICs are virtual boards
    test_size: int = 450
    timeout_s: float = 600.0  # per method: the workers are killed past it

    def __post_init__(self) -> None:
        if self.world < 2 or self.steps < 2 or self.eval_every < 1:
            raise ValueError("train: need world >= 2, steps >= 2 and eval_every >= 1")
        if not 0 < self.target_acc <= 1:
            raise ValueError(f"train: target_acc={self.target_acc}: not in (0, 1]")
        if self.cosim_rank is not None and not 0 <= self.cosim_rank < self.world:
            raise ValueError(f"train: cosim_rank={self.cosim_rank} is not a rank")
        object.__setattr__(self, "boards", tuple(sorted(set(self.boards))))  # frozen
        if any(not 0 <= b < self.world for b in self.boards):
            raise ValueError(f"train: boards={self.boards}: not ranks")
        if self.boards and (self.cluster != "netns" or self.cosim_rank is not None):
            raise ValueError("train: virtual boards need --cluster netns (and no cosim rank)")
        self.nic_params()  # its own checks, before any process starts
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train: schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.model not in MODELS:
            raise ValueError(f"train: model {self.model!r} is not one of {MODELS}")
        if self.cluster not in CLUSTERS:
            raise ValueError(f"train: cluster {self.cluster!r} is not one of {CLUSTERS}")
        for m in self.methods:
            if m not in METHODS:
                raise ValueError(f"train: method {m!r} is not one of {','.join(METHODS)}")

    def nic_params(self):
        """The NICs' parameters as the hook starts them: with the warm-up t_B (a virtual
        board's build takes its t_C's first value from it, as the model does)."""
        from optireduce.params import WARMUP_T_B_US, NicParams

        # in-band exponents and progress_ahead on host backends; the gateware (co-simulated
        # or a virtual board) agrees by exchange and has no progress_ahead
        host = self.cosim_rank is None and not self.boards
        return NicParams(n_max=max(8, self.world), exp_inband=host, progress_ahead=host,
                         t_b_us=WARMUP_T_B_US,
                         **{k: getattr(self, k) for k in NIC_FIELDS})  # fmt: skip


def straggler_delays(cfg: TrainConfig) -> np.ndarray:
    """[steps, world] seconds: each step one rank, drawn uniformly, straggles by a delay
    drawn from the lognormal; the others by 0. Depends on the config only, never on the
    method."""
    spec = ImpairmentSpec(median_us=cfg.straggler_median_ms * 1e3, p99_ratio=cfg.tail)
    rng = np.random.default_rng([cfg.seed, 7])
    if cfg.cosim_rank is None:
        who = rng.integers(0, cfg.world, cfg.steps)
    else:  # the co-simulated rank is the slowest already; its socket is not impaired
        who = rng.integers(0, cfg.world - 1, cfg.steps)
        who += who >= cfg.cosim_rank
    d = spec.median_us * 1e-6 * np.exp(spec.sigma * rng.standard_normal(cfg.steps))
    out = np.zeros((cfg.steps, cfg.world))
    out[np.arange(cfg.steps), who] = d
    return out


# `--model large`: 10.3 M parameters, communication-bound at 4 workers (docs/results.md).
# Packets of 1024 elements (4 KiB datagrams on loopback) and 64 K-element ops; a deadline
# floor above the shared host's scheduling tail (host/ddp_hook.py HOST_T_C_MIN_US) and a
# straggler of the step's own scale (median 100 ms against a lossless step of ~0.2-0.4 s).
LARGE = {
    "model": "large", "steps": 150, "batch": 16, "lr": 0.1, "target_acc": 0.75,
    "eval_every": 15, "straggler_median_ms": 100.0, "p": 1024, "b": 16384, "c": 65536,
    "t_c_min_us": 10_000, "checksum_every": 25, "control_floor_s": 30.0,
}  # fmt: skip
# Why a 30 s control floor: a rank answers a control exchange only while it waits in one
# itself, and a 41 MB step keeps a rank in its bucket's ops for 1-2 s on the 2 loaded
# cores: at the hook's 1 s floor every rank had excluded every other by step 7 (measured).


def large_config(**overrides) -> TrainConfig:
    """The large model's TrainConfig: LARGE, then `overrides`."""
    return TrainConfig(**{**LARGE, **overrides})


def _large_task(cfg: TrainConfig):
    from optireduce.experiments.large_model import LargeTask

    return LargeTask(width=cfg.large_width)


def n_params(cfg: TrainConfig) -> int:
    return _large_task(cfg).n_params() if cfg.model == "large" else lt.n_params()


def verification_inputs(cfg: TrainConfig) -> list[np.ndarray]:
    """One vector per rank for the lossless check op run before training: the gradient's
    size (the digits MLP), or one op's (the large model: the NIC's first op runs at
    t_C's initial value, the warm-up bound, so nothing is cut)."""
    rng = np.random.default_rng([cfg.seed, 11])
    n = min(n_params(cfg), cfg.c) if cfg.model == "large" else lt.n_params()
    return [rng.standard_normal(n).astype(np.float32) for _ in range(cfg.world)]


def _model_and_data(cfg: TrainConfig, rank: int) -> tuple:
    """(the torch model, [(x, y) of each step] of this rank), made before the timed loop."""
    import torch

    if cfg.model == "large":
        task = _large_task(cfg)
        data = [task.batch(cfg.seed, t, rank, cfg.batch) for t in range(cfg.steps)]
        return task.model(cfg.seed), [tuple(map(torch.from_numpy, d)) for d in data]
    xtr, ytr, _, _ = lt.load_data(cfg.test_size)
    xtr_t, ytr_t = torch.from_numpy(xtr), torch.from_numpy(ytr)
    batches = torch.from_numpy(_batches(cfg)[:, rank])
    _, logits = lt._model()

    class FlatMlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.theta = torch.nn.Parameter(torch.from_numpy(lt._init(cfg.seed)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return logits(self.theta, x)

    return FlatMlp(), [(xtr_t[i], ytr_t[i]) for i in batches]


def _batches(cfg: TrainConfig) -> np.ndarray:
    """[steps, world, batch] train indices: the loss-tolerance experiment's shards."""
    ltc = lt.LossToleranceConfig(workers=cfg.world, steps=cfg.steps, batch=cfg.batch)
    n_train = len(lt.load_data(cfg.test_size)[1])
    return lt._batches(ltc, cfg.seed, n_train)


def _worker(rank: int, cfg: TrainConfig, method: str, out: str, hosts: list[str]) -> None:
    import faulthandler

    faulthandler.enable()  # a worker killed by a signal leaves its Python stacks on stderr
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if hosts:  # a host of its own: gloo and OptiReduce on its namespace's interface
        from optireduce.experiments.netns import IFNAME, enter

        enter(hosts[rank])
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["OPTIREDUCE_IFNAME"] = IFNAME
        if cfg.boards:  # every rank at the NIC's addressing; a board rank drives its board
            from optireduce.experiments.netns import BOARD_HOST_IF
            from optireduce.host.board_nic import BOARD_IFNAME_VAR

            os.environ["OPTIREDUCE_PORT"] = str(cfg.nic_params().udp_port)
            if rank in cfg.boards:
                os.environ[BOARD_IFNAME_VAR] = BOARD_HOST_IF
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/store", rank=rank, world_size=cfg.world
    )
    from optireduce.experiments.large_model import flat

    delays = straggler_delays(cfg)[:, rank]
    model, data = _model_and_data(cfg, rank)
    ddp = DDP(model)
    state = None
    ops: list = []
    op_step: list[int] = []  # the training step of each recorded op
    hand_off: list[tuple[int, int]] = []
    hook_called: list[int] = []
    step_begin: list[int] = []
    step_now = [0]
    if method == "optireduce":
        from optireduce import OptiReduceState, optireduce_hook
        from optireduce.host.ddp_hook import CONTROL_FLOOR_S

        sim = rank == cfg.cosim_rank or rank in cfg.boards  # sends on the wire itself
        if rank == cfg.cosim_rank:
            os.environ["OPTIREDUCE_NIC"] = "sim"  # the driver's backend choice (host/driver.py)
        spec = ImpairmentSpec(median_us=cfg.packet_median_us, p99_ratio=cfg.tail)
        state = OptiReduceState(
            cfg.nic_params(), warmup_iters=cfg.warmup_iters, policy=cfg.policy,
            checksum_every=cfg.checksum_every, impairment=None if sim else spec, seed=cfg.seed,
            control_floor_s=cfg.control_floor_s or (
                COSIM_CONTROL_FLOOR_S if cfg.cosim_rank is not None or cfg.boards
                else CONTROL_FLOOR_S),
        )  # fmt: skip

        def timed_hook(st, bucket):  # when DDP hands the bucket over, for the evidence
            hook_called.append(time.monotonic_ns() // 1000)
            return optireduce_hook(st, bucket)

        ddp.register_comm_hook(state, timed_hook)
        # Build the NIC now (every rank, same point) to keep every op's statistics.
        nic = state.nic
        dist.barrier()  # a co-simulated NIC may build its harness first: minutes, not t_B
        # Op 0: a lossless check (no loss, t_B of the warm-up: every phase completes); the
        # parent compares every rank's result with simulate_allreduce bit for bit.
        with nic.transport.reliable():
            verify, _ = nic.allreduce(verification_inputs(cfg)[rank])
        counters = nic.counters()
        rx_verify = counters["rx_gather"]  # the check op's: not part of the training run
        allreduce = nic.allreduce

        def recording(x, out=None):
            t_call = time.monotonic_ns() // 1000
            res, st = allreduce(x, out=out)
            ops.extend(st)
            op_step.extend([step_now[0]] * len(st))
            # the hand-off on CLOCK_MONOTONIC: the hook's thread calls, gets the result back
            hand_off.extend([(t_call, time.monotonic_ns() // 1000)] * len(st))
            return res, st

        nic.allreduce = recording
        if hasattr(nic, "set_trace"):  # the native engine: every datagram, for loss_split
            nic.set_trace(True)
    else:
        # gloo's own allreduce, timed from the bucket's hand-off to its result (this rank)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed_allreduce(pg, bucket):
            t_start = time.perf_counter()

            def done(fut):
                ops.append(time.perf_counter() - t_start)
                return fut.value()

            return allreduce_hook(pg, bucket).then(done)

        ddp.register_comm_hook(None, timed_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps)
        if cfg.schedule == "cosine" else torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0)
    )  # fmt: skip
    # the large model's copies (41 MB each) are kept by rank 0 only
    keep = cfg.model == "digits" or rank == 0
    kept_steps, kept_times, kept_theta = [0], [0.0], [flat(model)]
    if cfg.model == "large" and state is not None and hasattr(state.nic, "set_trace"):
        state.nic.set_trace(False)  # a per-datagram trace of 41 MB steps: GBs to analyse
    dist.barrier()
    t0 = time.perf_counter()
    for t in range(cfg.steps):
        step_now[0] = t
        if delays[t]:  # the straggler, any method: its step, data and control start late
            time.sleep(delays[t])
        step_begin.append(time.monotonic_ns() // 1000)  # its compute starts
        x, y = data[t]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        sched.step()
        if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.steps:
            kept_times.append(time.perf_counter() - t0)
            kept_steps.append(t + 1)
            if keep:
                kept_theta.append(flat(model))
            if rank == 0:
                Path(out, "progress").write_text(str(t + 1))
    final = flat(model)
    res = {"steps": kept_steps, "times": kept_times,
           "final_sha": np.array(hashlib.sha256(final.tobytes()).hexdigest())}  # fmt: skip
    if cfg.model == "digits":
        res["theta"], res["final_theta"] = np.stack(kept_theta), final
    else:  # evaluated here, after the timed loop: no 41 MB copies on disk
        from optireduce.experiments.large_model import accuracy as large_accuracy
        from optireduce.experiments.large_model import load_flat

        xte, yte = _large_task(cfg).test_set()
        res["final_acc"] = np.array(large_accuracy(model, xte, yte))
        if rank == 0:
            accs = []
            for th in kept_theta:
                load_flat(model, th)
                accs.append(large_accuracy(model, xte, yte))
            res["acc"] = np.array(accs)
    if state is None:
        res["op_ms"] = 1e3 * np.array(ops)
    else:
        nic = state.nic
        res["p2_expected"] = np.array([s.p2_expected for s in ops])
        res["p2_received"] = np.array([s.p2_received for s in ops])
        res["p1_expected"] = np.array([s.p1_expected for s in ops])
        res["p1_received"] = np.array([s.p1_received for s in ops])
        res["n_packets"] = np.array([cfg.nic_params().packets_for(s.n) for s in ops])  # padded
        res["op_ms"] = np.array([s.elapsed_us / 1e3 for s in ops])
        res["op_step"] = np.array(op_step, dtype=np.int64)
        res["op_hand_off_us"] = np.array(hand_off, dtype=np.int64).reshape(len(ops), 2)
        res["step_begin_us"] = np.array(step_begin, dtype=np.int64)
        res["hook_called_us"] = np.array(hook_called, dtype=np.int64)  # one per bucket
        # per op and sender: reduced packets missing ([] from the gateware: -1, unknown)
        res["p2_missing_from"] = np.array(
            [s.p2_missing_from or [-1] * cfg.world for s in ops], dtype=np.int64
        ).reshape(len(ops), cfg.world)
        for f in OP_FIELDS:  # the deadlines in force, for the loss attribution
            res[f] = np.array([getattr(s, f) for s in ops], dtype=np.int64)
        res["p1_missing_from"] = np.array(
            [s.p1_missing_from or [-1] * cfg.world for s in ops], dtype=np.int64
        ).reshape(len(ops), cfg.world)
        if hasattr(nic, "take_trace"):
            tr = nic.take_trace()
            res["trace_sent"], res["trace_arrived"] = tr["sent"], tr["arrived"]
            res["trace_origin_us"] = np.array(tr["origin_us"])
            res["trace_not_kept"] = np.array(tr["not_kept"])
        res["deadline_phases"] = np.array(
            [(s.phase1_reason == "deadline") + (s.phase2_reason == "deadline") for s in ops]
        )
        counters = nic.counters()
        res["rx_gather"] = np.array(counters["rx_gather"] - rx_verify)
        res["verify"] = verify
        res["backend"] = np.array(nic.backend)
        if rank in cfg.boards:  # its board's data address
            from optireduce.host.board_nic import board_address

            res["address"] = np.array(board_address(rank, cfg.nic_params())[0])
        else:
            res["address"] = np.array(nic.transport.address[0])  # OptiReduce's data address
        # -1: not calibrated (a run shorter than the warm-up)
        res["t_b_us"] = np.array(-1 if state.t_b_us is None else state.t_b_us)
        res["step_lost"] = np.array([s.lost_fraction for s in state.history])
        res["resyncs"] = np.array(sum(s.resynced for s in state.history))
        res["faults"] = np.array(state.faults, dtype=np.int64)  # ranks this one excluded
        res["counters"] = np.array(json.dumps(nic.counters()))
    np.savez(f"{out}/rank{rank}.npz", **res)
    dist.barrier()
    if state is not None:  # after the barrier: peers may still be delivering this step's packets
        state.close()
    del ddp
    dist.destroy_process_group()


def _spawn(cfg: TrainConfig, method: str, out: str, tick: Callable[[int], None],
           hosts: list[str]) -> None:  # fmt: skip
    """cfg.world workers (rank r in namespace hosts[r], if any); every wait bounded (all are
    killed past cfg.timeout_s)."""
    from optireduce.experiments.workers import start_workers

    ctx = start_workers(_worker, (cfg, method, out, hosts), cfg.world)
    deadline = time.monotonic() + cfg.timeout_s
    progress = Path(out, "progress")
    while not ctx.join(timeout=0.5):
        if progress.exists():
            txt = progress.read_text()
            if txt:
                tick(int(txt))
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            raise TimeoutError(
                f"train: {method} workers did not finish within {cfg.timeout_s} s "
                "(raise TrainConfig.timeout_s on a slower machine)"
            )
    tick(cfg.steps)


def accuracy(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of the MLP with flat parameters theta (the model's own logits)."""
    import torch

    _, logits = lt._model()
    with torch.no_grad():
        pred = logits(torch.from_numpy(np.asarray(theta, dtype=np.float32)), torch.from_numpy(x))
    return float((pred.argmax(1).numpy() == y).mean())


def run_method(
    cfg: TrainConfig, method: str, work: str, tick: Callable[[int], None] = lambda s: None
) -> dict:
    """Train with one method; the summary plus the curve and the raw per-rank results."""
    # absolute: the FileStore's file:// URL would read a relative path's first folder as a host
    out = Path(work, method).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("store", "progress", *(f"rank{r}.npz" for r in range(cfg.world))):
        (out / stale).unlink(missing_ok=True)  # a FileStore left over would break rendezvous
    if cfg.cluster == "netns":  # new namespaces per method, removed whatever happens
        from optireduce.experiments.netns import NetnsCluster

        boards = cfg.boards if method == "optireduce" else ()
        exe = None
        if boards:  # built before the namespaces: the first build takes a minute or more
            from optireduce.sim.cosim_build import board_harness_path

            exe = str(board_harness_path(cfg.nic_params()))
        with NetnsCluster(cfg.world, boards=boards) as net:
            for b in boards:
                net.start_board(b, exe, stats=str(out / f"board{b}.json"))
            _spawn(cfg, method, str(out), tick, net.ns)
    else:
        _spawn(cfg, method, str(out), tick, [])
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(cfg.world)]
    _, _, xte, yte = lt.load_data(cfg.test_size)
    r0 = ranks[0]
    if cfg.model == "large":  # evaluated by the workers (experiments/large_model.py)
        accs = [float(a) for a in r0["acc"]]
    else:
        accs = [accuracy(th, xte, yte) for th in r0["theta"]]
    times = [float(v) for v in r0["times"]]
    tta = next((tm for tm, a in zip(times, accs, strict=True) if a >= cfg.target_acc), None)
    summary: dict = {"tta_s": tta, "final_acc": accs[-1], "entries_lost": 0.0}
    summary["params"] = n_params(cfg)
    # every rank ends with the same parameters, bit for bit
    summary["replicas_equal"] = len({str(r["final_sha"]) for r in ranks}) == 1
    summary["wall_s"] = times[-1]
    summary["step_ms"] = 1e3 * times[-1] / cfg.steps
    if method == "optireduce":
        missed = sum(int((r["p2_expected"] - r["p2_received"]).sum()) for r in ranks)
        packets = sum(int(r["n_packets"].sum()) for r in ranks)
        summary["entries_lost"] = missed / packets
        summary["contributions_lost"] = sum(
            int((r["p1_expected"] - r["p1_received"]).sum()) for r in ranks
        ) / max(1, sum(int(r["p1_expected"].sum()) for r in ranks))
        summary.update(loss_split(cfg, ranks))
        summary["deadline_phases"] = int(sum(r["deadline_phases"].sum() for r in ranks))
        summary["t_b_us"] = int(r0["t_b_us"]) if r0["t_b_us"] >= 0 else None
        summary["resyncs"] = int(r0["resyncs"])
        # (rank, excluded rank): a rank that missed a bounded control exchange
        summary["exclusions"] = [[i, int(g)] for i, r in enumerate(ranks) for g in r["faults"]]
        summary["backends"] = [str(r["backend"]) for r in ranks]
        summary["addresses"] = [str(r["address"]) for r in ranks]
        # The check op against the model on the virtual cluster: same inputs, op 0,
        # lossless, the warm-up's NicParams (t_B changes no result bit, only timing).
        from optireduce.host.model.virtual_cluster import simulate_allreduce

        ref, _ = simulate_allreduce(verification_inputs(cfg), params=cfg.nic_params(),
                                    calibrate=False)  # fmt: skip
        summary["verify_bit_exact"] = [
            bool(np.array_equal(r["verify"].view(np.uint32), ref[i].view(np.uint32)))
            for i, r in enumerate(ranks)
        ]
        c = cfg.cosim_rank
        summary["cosim_bit_exact"] = (
            summary["verify_bit_exact"][c] if c is not None and ranks[c]["backend"] == "sim"
            else None
        )  # fmt: skip
        if cfg.boards:  # each virtual board's figures, written as the namespaces went down
            summary["boards"] = {b: json.loads((out / f"board{b}.json").read_text())
                                 for b in cfg.boards
                                 if (out / f"board{b}.json").exists()}  # fmt: skip
    op_ms = np.concatenate([r["op_ms"] for r in ranks])  # every rank's ops
    summary["op_p50_ms"] = float(np.percentile(op_ms, 50))
    summary["op_p99_ms"] = float(np.percentile(op_ms, 99))
    summary["final_acc_per_rank"] = [
        float(r["final_acc"]) if cfg.model == "large" else accuracy(r["final_theta"], xte, yte)
        for r in ranks
    ]
    curve = {"steps": [int(s) for s in r0["steps"]], "times": times, "acc": accs}
    return {"summary": summary, "curve": curve, "ranks": ranks}


def loss_split(cfg: TrainConfig, ranks: list[dict]) -> dict:
    """The entries lost, split two ways; per step and overall, as fractions of the reduced
    packets (the denominator of `entries_lost`).

    By cause (`loss_attribution`, exact; native engines, which trace their datagrams):
    `straggler` (the step's late link alone made the packet late: by design), `delay` (the
    injected per-packet delay alone did) and `processing` (in time but for our own
    processing: ours), with the worst step of the last and the evidence (`loss_causes`).
    By sender (every backend that says who sent what): `from_straggler`, the step's
    straggler's packets, and `from_others`, an upper bound on processing losses; ops whose
    NIC cannot say by sender (the gateware) are `unattributed_ops`."""
    delays = straggler_delays(cfg)
    straggler = np.where(delays.max(axis=1) > 0, delays.argmax(axis=1), -1)
    by_straggler = np.zeros(cfg.steps)
    by_other = np.zeros(cfg.steps)
    packets = np.zeros(cfg.steps)
    unattributed = 0
    for r in ranks:
        for step, miss, n in zip(r["op_step"], r["p2_missing_from"], r["n_packets"], strict=True):
            packets[step] += n
            if miss[0] < 0:
                unattributed += 1
                continue
            s = straggler[step]
            late = int(miss[s]) if s >= 0 else 0
            by_straggler[step] += late
            by_other[step] += int(miss.sum()) - late
    frac = np.divide(by_other, packets, out=np.zeros_like(packets), where=packets > 0)
    frac_s = np.divide(by_straggler, packets, out=np.zeros_like(packets), where=packets > 0)
    total = max(1.0, float(packets.sum()))
    out = {
        "entries_lost_from_straggler": float(by_straggler.sum()) / total,
        "entries_lost_from_others": float(by_other.sum()) / total,
        "step_entries_lost_from_straggler": frac_s.tolist(),
        "step_entries_lost_from_others": frac.tolist(),
        "entries_lost_from_others_max_step": float(frac.max(initial=0.0)),
        "unattributed_ops": unattributed,
    }
    step = np.asarray(ranks[0]["op_step"])
    # the replay runs one op after the other: a step of several ops (chunks in flight) is
    # beyond it, and so is a rank that kept no trace
    one_op = len(step) == cfg.steps and (step == np.arange(cfg.steps)).all()
    if not unattributed and one_op and all(len(r.get("trace_sent", ())) for r in ranks):
        from optireduce.experiments.loss_attribution import split_by_step

        sleep = (1e6 * delays[step].T).astype(np.int64)  # the straggler sleeps before its step
        if any((r["trace_sent"][:, 6] > 0).any() for r in ranks):
            sleep[:] = 0  # it does not: its delay is on its link (the trace's extra_us)
        out.update(split_by_step(ranks, cfg.world, cfg.steps, sleep, synced_ops(cfg, step),
                                 cfg.nic_params().rx_window))  # fmt: skip
    return out


def synced_ops(cfg: TrainConfig, op_step: np.ndarray) -> np.ndarray:
    """Per op: every rank left a blocking exchange together before it: the warm-up's
    reliable ops (each waits for every packet) and the replica checksum at the end of every
    `checksum_every`-th step after the warm-up."""
    prev = np.asarray(op_step) - 1
    every = max(1, cfg.checksum_every)
    return (prev < cfg.warmup_iters) | ((prev >= cfg.warmup_iters) & (prev % every == 0))


def run_train(
    cfg: TrainConfig,
    work: str | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> tuple[dict, dict]:
    """Every method of cfg in turn (never two at once: they would share the cores).

    Returns ({METHOD: summary}, {METHOD: curve}) plus "ratios" and "settings" entries in
    the first.
    """
    results, curves = {}, {}
    with tempfile.TemporaryDirectory(prefix="optireduce-train-") as tmp:
        for m in cfg.methods:
            tick = (lambda s, m=m: progress(m, s)) if progress else (lambda s: None)
            r = run_method(cfg, m, work or tmp, tick)
            results[m], curves[m] = r["summary"], r["curve"]
    out: dict = dict(results)
    if "gloo" in results and "optireduce" in results:
        g, o = results["gloo"], results["optireduce"]
        out["ratios"] = {
            "tta_optireduce_over_gloo": (o["tta_s"] / g["tta_s"])
            if o["tta_s"] and g["tta_s"]
            else None,
            "tta_target": 0.6,
            "final_acc_gap_points": 100 * (g["final_acc"] - o["final_acc"]),
            "final_acc_gap_target": 0.5,
        }
    settings = asdict(cfg)
    settings["n_params"] = n_params(cfg)
    settings["straggler_mean_ms"] = float(1e3 * straggler_delays(cfg).max(axis=1).mean())
    out["settings"] = settings
    return out, curves


def run_seeds(
    cfg: TrainConfig,
    seeds: list[int],
    work: str | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> tuple[dict, dict]:
    """run_train for every seed (the seed draws the stragglers, the packet delays, the
    initial weights and the minibatches); returns (summary, {seed: curves}).

    The summary has run_train's form with the mean over seeds of every number (None
    when a seed missed the target, with `*_reached` = how many did); the ratios' mean,
    min and max (over the seeds that have one) and the mean absolute accuracy gap; the
    checks of every seed (`verify_bit_exact` and `cosim_bit_exact` must hold in all,
    `exclusions` per seed); and every seed's own summary under "per_seed".
    `progress(method, steps done over all seeds)`."""
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"train: seeds {seeds}: need distinct seeds >= 0")
    runs, curves = {}, {}
    for k, seed in enumerate(seeds):
        tick = (lambda m, st, k=k: progress(m, k * cfg.steps + st)) if progress else None
        sub = str(Path(work, f"seed{seed}")) if work else None
        runs[seed], curves[seed] = run_train(replace(cfg, seed=seed), sub, tick)
    per = [runs[s] for s in seeds]

    def spread(into: dict, key: str, vals: list) -> None:
        got = [v for v in vals if v is not None]
        into[key] = float(np.mean(vals)) if len(got) == len(vals) else None
        if len(got) < len(vals):
            into[f"{key}_reached"] = len(got)
        if got:
            into[f"{key}_min"], into[f"{key}_max"] = min(got), max(got)

    out: dict = {}
    for m in cfg.methods:
        out[m] = {}
        for key, v in per[0][m].items():
            if key == "tta_s":
                spread(out[m], key, [r[m][key] for r in per])
            elif isinstance(v, int | float) and not isinstance(v, bool):
                out[m][key] = float(np.mean([r[m][key] for r in per]))
        if m == "optireduce":
            out[m]["verify_bit_exact"] = all(all(r[m]["verify_bit_exact"]) for r in per)
            flags = [r[m]["cosim_bit_exact"] for r in per]
            out[m]["cosim_bit_exact"] = None if None in flags else all(flags)
            out[m]["exclusions"] = {str(s): runs[s][m]["exclusions"] for s in seeds}
    if "ratios" in per[0]:
        out["ratios"] = dict(per[0]["ratios"])
        for key in ("tta_optireduce_over_gloo", "final_acc_gap_points"):
            spread(out["ratios"], key, [r["ratios"][key] for r in per])
        gaps = [abs(r["ratios"]["final_acc_gap_points"]) for r in per]
        out["ratios"]["final_acc_gap_points_abs_mean"] = float(np.mean(gaps))
    out["per_seed"] = {str(s): {k: v for k, v in runs[s].items() if k != "settings"}
                       for s in seeds}  # fmt: skip
    out["settings"] = {**per[0]["settings"], "seed": None, "seeds": list(seeds)}
    return out, curves


def plot(summary: dict, curves: dict, path: str) -> None:
    """Accuracy against wall time per method; `curves` is {method: curve} (one seed) or
    {seed: {method: curve}} (run_seeds: one thin line per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(curves.values()) if "per_seed" in summary else [curves]
    o = summary.get("optireduce", {})
    split = "per_seed" not in summary and "step_entries_lost_processing" in o
    if split:  # one run: its per-step losses, by cause, below the curves
        fig, (ax, lx) = plt.subplots(2, 1, figsize=(7, 6.4), height_ratios=(2.2, 1))
        steps = np.arange(1, len(o["step_entries_lost_processing"]) + 1)
        for key, color, label in (
            ("straggler", "tab:red", "lost: the straggler was late (by design)"),
            ("delay", "tab:orange", "lost: the per-packet delay (by design)"),
            ("processing", "tab:blue", "lost: our processing missed the deadline"),
        ):
            lx.plot(steps, [100 * v for v in o[f"step_entries_lost_{key}"]], lw=0.8,
                    color=color, label=label)  # fmt: skip
        lx.set_xlabel("training step")
        lx.set_ylabel("entries lost (%)")
        lx.legend(fontsize=7, loc="upper right")
        lx.grid(alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"gloo": "tab:orange", "optireduce": "tab:blue", "optireduce_rtl": "tab:green"}
    for k, run in enumerate(runs):
        for m, c in run.items():
            label = None
            if k == 0:
                s = summary[m]
                tta = "not reached" if s["tta_s"] is None else f"{s['tta_s']:.1f} s"
                label = f"{m}: time to target {tta}, final {100 * s['final_acc']:.1f} %"
                if len(runs) > 1:
                    label += f" (mean of {len(runs)} seeds)"
            one = len(runs) == 1
            ax.plot(c["times"], [100 * a for a in c["acc"]], "o-", ms=3 if one else 1,
                    lw=1.5 if one else 0.8, color=colors.get(m), label=label)  # fmt: skip
        if len(runs) == 1:
            for m in run:
                if summary[m]["tta_s"] is not None:
                    ax.axvline(summary[m]["tta_s"], color=colors.get(m), ls=":", alpha=0.7)
    st = summary["settings"]
    ax.axhline(100 * st["target_acc"], color="k", ls="--", lw=1, label="target")
    ax.set_ylim(max(0, 100 * st["target_acc"] - 30), 100)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy, rank 0 (%)")
    seeds = st.get("seeds") or [st.get("seed", 0)]
    seeds = f"seed{'s' * (len(seeds) > 1)} {','.join(map(str, seeds))}"
    ax.set_title(
        f"digits MLP, {st['world']} processes, {st['steps']} steps, {seeds}; straggler "
        f"median {st['straggler_median_ms']:g} ms, P99/P50 {st['tail']:g}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(summary: dict, curves: dict, out_dir: str) -> tuple[Path, Path]:
    """DIR/train.json (summary and curves) and DIR/train.png next to it."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    js, png = d / "train.json", d / "train.png"
    js.write_text(json.dumps({**summary, "curves": curves}, indent=2))
    plot(summary, curves, str(png))
    return js, png
