"""PyTorch DDP communication hook: OptiReduce for every gradient bucket.

    state = OptiReduceState(warmup_iters=5)
    ddp.register_comm_hook(state, optireduce_hook)

In the style of PowerSGD's hook: a picklable state object keyed by
bucket.index(); reliable warm-up iterations (the same NIC path with the
transport's loss switched off and a generous bound, whose phase times calibrate
t_B = 2 x P95, max over ranks, never below the deadline floor t_c_min_us); then
bounded OptiReduce ops. Default NicParams: t_c_min_us = HOST_T_C_MIN_US, the floor of every
phase's timeout on a host that also computes (docs/results.md, "Lossless on a shared
host"), and progress_ahead (a rank left behind catches up: docs/deadlines.md). Every op runs on one
ordered driver thread per process so that the ranks issue them in the same order. The hook
never raises on loss: above `loss_threshold` it follows `policy`:
  accept  use the estimate as it is;
  skip    zero this bucket's gradient on every rank (the step leaves it alone);
  redo    redo the bucket over the reliable path;
  stop    fail the step with a clear error.
Every rank takes the same decision (the loss is max-reduced first; `accept`
decides nothing and skips that exchange). Control exchanges wait max(t_B,
`control_floor_s`): a rank that misses one is excluded for good. Every
`checksum_every` iterations the replicas compare a parameter checksum over the
control plane; on drift they resync from rank 0 over it too, bounded as every
control exchange (or fail, with resync=False).

Gradients of any floating dtype (bfloat16, float16, float64) run through the op as
float32 and come back in the bucket's dtype. A non-finite entry in any rank's bucket makes
its op's result NaN on every rank (docs/numerics.md 2) and the hook returns the whole bucket
as NaN, so that GradScaler skips the step on every rank as with gloo; BucketStats counts it
(nonfinite_inputs, nonfinite_ops). With a policy other than `accept` the loss decision's
exchange also carries it, so a rank that missed the flag under loss learns it there.

The state pickles (checkpoints) as its configuration (params, policy, thresholds, seed,
impairment, checksum_every, resync, control_floor_s), the calibrated t_B, the iteration
count and the per-step history. The live parts (NIC, transports, control plane, driver
thread) are rebuilt at the first hook call after a restore, with the saved t_B and no
second warm-up. The new NIC numbers its ops from 0 and the random signs are keyed by op
id, so the results agree with an uninterrupted run's within the numerics bound, and bit
for bit only with rht=False.
"""

import atexit
import logging
import queue
import struct
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from optireduce.host.board_nic import board_address, board_requested
from optireduce.host.control import ControlPlane
from optireduce.host.driver import Nic, select_nic
from optireduce.host.model.deadline import calibrate_t_b, phase_times
from optireduce.host.model.impairment import ImpairmentSpec
from optireduce.host.transport import transport_from_store
from optireduce.params import WARMUP_T_B_US, NicParams

log = logging.getLogger("optireduce")
POLICIES = ("accept", "skip", "redo", "stop")
CONTROL_FLOOR_S = 1.0  # least wait of a control exchange: exclusion must mean dead
# Default floor of a phase's timeout (NicParams.t_c_min_us). t_C tracks a phase's typical
# length (~0.3 ms for a 64 KiB op on loopback), far below how long the peers' engine threads
# wait for a core when autograd and other jobs share it: 2-13 % of a 10 M-parameter model's
# entries were cut each step at a 1 us floor, at most 1 % at 10 ms (2 processes, 2 cores).
HOST_T_C_MIN_US = 10_000
RESYNC_FLOOR_BPS = 10e6  # a resync's bound grows by its bytes at this slowest rate


@dataclass
class BucketStats:
    index: int
    elements: int
    mode: str  # warmup | optireduce | redo | skipped
    lost_fraction: float = 0.0  # packets lost / expected: max over ranks (accept: this rank)
    early_timeouts: int = 0
    deadline_timeouts: int = 0
    saturations: int = 0
    exponent: int | None = None  # largest exponent of the bucket's ops (value = int * 2^E)
    nonfinite_inputs: int = 0  # non-finite elements in this rank's gradient
    nonfinite_ops: int = 0  # ops whose result came back NaN (a non-finite input on any rank)


@dataclass
class StepStats:
    iteration: int
    buckets: list[BucketStats] = field(default_factory=list)
    resynced: bool = False
    faults: list[int] = field(default_factory=list)  # ranks found gone during this step

    @property
    def lost_fraction(self) -> float:
        return max((b.lost_fraction for b in self.buckets), default=0.0)


class OptiReduceState:
    __slots__ = (
        "_agree",
        "_ck_params",
        "_control",
        "_driver",
        "_group",
        "_nic",
        "_warm_phases",
        "checksum_every",
        "control_floor_s",
        "history",
        "impairment",
        "iteration",
        "loss_threshold",
        "params",
        "policy",
        "resync",
        "seed",
        "step",
        "t_b_us",
        "warmup_iters",
    )

    def __init__(
        self,
        params: NicParams | None = None,
        *,
        warmup_iters: int = 5,
        loss_threshold: float = 0.05,
        policy: str = "accept",
        checksum_every: int = 50,
        resync: bool = True,
        impairment: ImpairmentSpec | None = None,
        seed: int = 0,
        t_b_us: int | None = None,
        control_floor_s: float = CONTROL_FLOOR_S,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"OptiReduceState.policy={policy!r}: must be one of {POLICIES}")
        if warmup_iters < 1:
            raise ValueError("OptiReduceState.warmup_iters must be >= 1 (it calibrates t_B)")
        if not 0 <= loss_threshold <= 1:
            raise ValueError(f"OptiReduceState.loss_threshold={loss_threshold}: not in [0, 1]")
        self.params = params or NicParams(t_c_min_us=HOST_T_C_MIN_US, progress_ahead=True)
        self.warmup_iters, self.loss_threshold, self.policy = warmup_iters, loss_threshold, policy
        self.checksum_every, self.resync = checksum_every, resync
        self.impairment, self.seed = impairment, seed
        self.t_b_us = t_b_us  # None: calibrate from the warm-up
        # Least wait of a control exchange. Exclusion is for good, so it must mean dead,
        # not slow: a process descheduled on a shared host (or a co-simulated NIC, far
        # slower than its simulated microseconds) can miss t_B without being dead.
        self.control_floor_s = control_floor_s
        self.iteration = 0
        self.step = StepStats(0)
        self.history: list[StepStats] = []
        self._nic: Nic | None = None
        self._driver: _Driver | None = None
        self._group = None
        self._control = None
        self._warm_phases: list[int] = []
        self._ck_params: list[torch.Tensor] = []

    # Picklable for checkpoints: the live parts are rebuilt on first use.
    def __getstate__(self) -> dict:
        return {s: getattr(self, s) for s in self.__slots__ if not s.startswith("_")}

    def __setstate__(self, d: dict) -> None:
        for s in self.__slots__:
            setattr(self, s, d.get(s))
        self._warm_phases, self._ck_params = [], []

    def _start(self) -> None:
        """First op: a private gloo group (reliable redo and resync only), the UDP data
        transport, the bounded control plane and the driver thread."""
        rank, world = dist.get_rank(), dist.get_world_size()
        self._group = dist.new_group(backend="gloo")
        store = dist.distributed_c10d._get_default_store()
        # a board rank's peers send to its NIC, at the NIC's build addressing
        board = board_address(rank, self.params) if board_requested() else None
        transport = transport_from_store(store, rank, world, impairment=self.impairment,
                                         seed=self.seed * 1000 + rank, publish=board)  # fmt: skip
        # the injected impairment hits control traffic as data (the reliable layer resends)
        self._control = ControlPlane(rank, world, store, timeout_s=WARMUP_T_B_US * 1e-6,
                                     impairment=self.impairment,
                                     seed=self.seed * 1000 + world + rank)  # fmt: skip

        def agree(proposals: list[int]) -> list[int]:
            out = self._control.max_ints(proposals, self._bound())
            self._note_gone()
            return out

        self._agree = agree
        p = self.params.replace(t_b_us=self.params.warmup_t_b_us)
        self._nic = select_nic(p, rank, world, transport=transport, agree=agree)
        if self.iteration >= self.warmup_iters and self.t_b_us is not None:
            self._nic.set_t_b(self.t_b_us)  # a state restored past its warm-up
        self._driver = _Driver()
        # a process that ends without close() (an exception, Ctrl-C) still stops the NIC's
        # threads before the interpreter goes
        atexit.register(self.close)
        # the line to read on a cluster: which NIC, which addresses (docs/cluster.md)
        log.info("optireduce rank %d/%d: %s NIC, data %s, control %s; peers %s; %s", rank,
                 world, self._nic.backend, _addr(transport.peers[rank]),
                 _addr(self._control.transport.address),
                 " ".join(_addr(a) for a in transport.peers),
                 "keyed (OPTIREDUCE_KEY_FILE)" if transport.key else "unkeyed")  # fmt: skip

    @property
    def nic(self) -> Nic:
        """This rank's NIC, built on first use (collective: every rank at the same point,
        as the hook's first call does)."""
        if self._driver is None:
            self._start()
        return self._nic

    def _calibrate(self) -> None:
        """End of warm-up: t_B = configured, or calibrate_t_b of the warm-up phases (max of
        the ranks)."""
        if self.t_b_us is None:  # at least the floor: T lies in [t_c_min, t_B]
            cal = self._agree([calibrate_t_b(self._warm_phases)])[0]
            # and at most what the NIC's clock allows (tick_bits: 1.05 s on the 25F)
            self.t_b_us = min(max(cal, self.params.t_c_min_us), (1 << self.params.t_b_bits) - 1)
        self._nic.set_t_b(self.t_b_us)

    def _bound(self) -> float:
        """How long a control exchange waits for a peer: t_B (warm-up: its generous bound)."""
        t_b = self.t_b_us if self.iteration >= self.warmup_iters else WARMUP_T_B_US
        return max(t_b * 1e-6, self.control_floor_s or 0.0)

    def _note_gone(self) -> None:
        """Peers that missed a control exchange are dead to the NIC too; say so once."""
        for r in sorted(self._control.gone - self._nic.gone):
            self._nic.exclude(r)
            self.step.faults.append(r)
            log.error("optireduce: rank %d missed a bounded exchange; excluded from now on", r)

    @property
    def faults(self) -> list[int]:
        """Ranks found dead or stalled so far."""
        return sorted(self._control.gone) if self._control else []

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._driver is not None:
            self._driver.close()
        if self._nic is not None:
            self._nic.close()
        if self._control is not None:
            self._control.close()
        self._driver = self._nic = self._control = None


class _Driver:
    """One thread per process runs every op, in submission order."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="optireduce-driver")
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, fut = item
            try:
                fut.set_result(fn())
            except Exception as e:  # surfaces in the training loop, never hangs it
                fut.set_exception(e)

    def submit(self, fn) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self.q.put((fn, fut))
        return fut

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=10)


def _addr(a: tuple[str, int]) -> str:
    return f"{a[0]}:{a[1]}"


def _to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
    """The bucket on the host: a CUDA bucket is copied to pinned memory without stalling
    the autograd thread; the driver thread waits for the returned event before reading."""
    if tensor.device.type != "cuda":
        return tensor.detach().cpu(), None  # a CPU bucket: itself, no copy
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor.detach(), non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(tensor.device))
    return host, done


def _to_bucket(out, tensor: torch.Tensor) -> torch.Tensor:
    """The result (numpy float32) as a tensor of the bucket's dtype, shape and device; a
    CUDA bucket gets it through pinned memory (a synchronous copy: DDP reads the result
    on its own stream as soon as the future completes)."""
    res = torch.from_numpy(out).to(tensor.dtype).view_as(tensor)
    if tensor.device.type != "cuda":
        return res.to(tensor.device)  # a CPU bucket: no copy
    pinned = torch.empty(res.shape, dtype=res.dtype, pin_memory=True)
    pinned.copy_(res)
    with torch.cuda.device(tensor.device):
        return pinned.to(tensor.device)


def _reliable_mean(tensor: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(tensor, group=group)
    return tensor.div_(dist.get_world_size())


def _checksum(bucket_params: list[torch.Tensor]) -> float:
    return float(sum(p.detach().double().sum().item() for p in bucket_params))


def optireduce_hook(
    state: "OptiReduceState", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    tensor = bucket.buffer()
    idx = bucket.index()
    if state._driver is None:
        state._start()
    warm = state.iteration < state.warmup_iters
    checking = state.checksum_every and state.iteration % state.checksum_every == 0
    params = list(bucket.parameters()) if checking else []
    last = bucket.is_last()
    host, copied = _to_host(tensor)

    def run() -> torch.Tensor:
        nic = state._nic
        if copied is not None:
            copied.synchronize()
        x = host.numpy() if host.dtype == torch.float32 else host.float().numpy()
        if warm:
            with nic.transport.reliable():
                out, stats = nic.allreduce(x)
            if state.iteration > 0 or state.warmup_iters == 1:  # iteration 0 pays the JIT
                state._warm_phases += phase_times(stats)
            state.step.buckets.append(BucketStats(
                idx, tensor.numel(), "warmup", exponent=max(s.exponent for s in stats),
                nonfinite_inputs=sum(s.nonfinite for s in stats),
                nonfinite_ops=sum(s.nonfinite_result for s in stats),
            ))  # fmt: skip
            if last and state.iteration == state.warmup_iters - 1:
                state._calibrate()
            _end_bucket(state, bucket)
            result = _to_bucket(out, tensor)
            if any(s.nonfinite_result or s.nonfinite for s in stats):
                result.fill_(float("nan"))  # the whole bucket, as after the warm-up
            return result
        # in place: the bucket's own memory (or its host copy) takes the result, no fresh
        # pages per call; `redo` keeps the input for the reliable path
        out, stats = nic.allreduce(x, out=x) if state.policy != "redo" else nic.allreduce(x)
        expected = sum(s.p1_expected + s.p2_expected for s in stats)
        lost = sum(s.lost_phase1 + s.lost_phase2 for s in stats)
        ppm = [lost * 1_000_000 // max(1, expected)]  # parts per million
        # the own input too: a NIC that does not carry the flag (the gateware today) still
        # reports what its quantizer saw
        nonfinite = int(any(s.nonfinite_result or s.nonfinite for s in stats))
        if state.policy != "accept":
            # one decision on every rank: the max of the loss fractions. `accept` decides
            # nothing, so it spares the step this exchange and keeps its own fraction.
            # With in-band exponents the same exchange says whether a rank saturated (a
            # prediction too small): then every rank goes back to the exchange at once.
            # It also tells every rank whether some rank's result was non-finite (one that
            # missed the flag under loss learns it here).
            saturated = sum(s.sat_quantize for s in stats if not s.nonfinite)  # inf: no
            ppm, saturated, nonfinite = state._control.max_ints([ppm[0], saturated, nonfinite],
                                                                state._bound())  # fmt: skip
            ppm = [ppm]
            state._note_gone()
            if saturated and nic.p.exp_inband:
                nic.resync()
        b = BucketStats(
            idx, tensor.numel(), "optireduce", ppm[0] / 1e6,
            sum((s.phase1_reason == "early") + (s.phase2_reason == "early") for s in stats),
            sum((s.phase1_reason == "deadline") + (s.phase2_reason == "deadline") for s in stats),
            sum(s.saturations for s in stats), max(s.exponent for s in stats),
            sum(s.nonfinite for s in stats), sum(s.nonfinite_result for s in stats),
        )  # fmt: skip
        result = _to_bucket(out, tensor)
        if nonfinite:
            # NaN throughout the bucket, whatever the loss: `skip` must not make it zeros,
            # and every rank returns the same bits
            result.fill_(float("nan"))
        elif b.lost_fraction > state.loss_threshold:
            if state.policy == "skip":
                result.zero_()
                b.mode = "skipped"
            elif state.policy == "redo" and not state.faults:
                result = _reliable_mean(tensor.clone(), state._group)
                b.mode = "redo"
            elif state.policy == "redo":  # a dead peer would block gloo: skip instead
                result.zero_()
                b.mode = "skipped"
            elif state.policy == "stop":
                raise RuntimeError(
                    f"optireduce: bucket {idx} lost {b.lost_fraction:.1%} of its packets "
                    f"(threshold {state.loss_threshold:.1%}, policy 'stop')"
                )
        state.step.buckets.append(b)
        state._ck_params += params
        if last and state._ck_params:
            # The last bucket's gradients are the last ones autograd computes: no
            # parameter is read by backward any more, so a resync here is safe.
            _check_replicas(state, state._ck_params)
            state._ck_params = []
        _end_bucket(state, bucket)
        return result

    return state._driver.submit(run)


def _check_replicas(state: OptiReduceState, params: list[torch.Tensor]) -> None:
    """Compare a checksum of every parameter; resync them from rank 0 on drift."""
    got = state._control.allgather(struct.pack("!d", _checksum(params)), state._bound())
    state._note_gone()
    every = [struct.unpack("!d", g)[0] for g in got if g is not None]
    if len({g for g in got if g is not None}) == 1:  # the bits: a NaN checksum equals itself
        return
    if not state.resync:
        raise RuntimeError(f"optireduce: replicas drifted apart (parameter checksums {every})")
    if 0 in state._control.gone:
        log.error("optireduce: replicas differ (%s) and rank 0 is gone: no resync", every)
        return
    # rank 0's parameters over the bounded control plane, not gloo: a gloo broadcast
    # would wait for a peer that died or stalled since the checksum exchange
    host = [p.detach().cpu().contiguous() for p in params]
    nbytes = sum(h.numel() * h.element_size() for h in host)
    # the bytes of any dtype (numpy has no bfloat16)
    mine = (b"".join(h.reshape(-1).view(torch.uint8).numpy().tobytes() for h in host)
            if dist.get_rank() == 0 else b"")  # fmt: skip
    got = state._control.broadcast(mine, 0, state._bound() + nbytes / RESYNC_FLOOR_BPS)
    state._note_gone()
    if got is None or len(got) != nbytes:
        log.error("optireduce: replicas differ (%s); rank 0's parameters did not come in "
                  "time: no resync", every)  # fmt: skip
        return
    if dist.get_rank() != 0:
        off = 0
        with torch.no_grad():
            for p, h in zip(params, host, strict=True):
                n = h.numel() * h.element_size()
                src = torch.frombuffer(bytearray(got[off : off + n]), dtype=h.dtype)
                p.copy_(src.view_as(p))
                off += n
    first = not any(s.resynced for s in state.history)
    state.step.resynced = True
    # Under loss each rank decodes with its own losses, so drift is expected: one line
    # on rank 0 the first time; StepStats.resynced counts every one.
    level = logging.WARNING if dist.get_rank() == 0 and first else logging.DEBUG
    log.log(level, "optireduce: replicas drifted; resynced every parameter from rank 0 "
            "(expected under loss: ranks decode their own losses; later resyncs are "
            "counted in StepStats.resynced, not logged)")  # fmt: skip


def _end_bucket(state: OptiReduceState, bucket: dist.GradBucket) -> None:
    if bucket.is_last():
        state.history.append(state.step)
        state.iteration += 1
        state.step = StepStats(state.iteration)
