"""The processes of the soak campaign's runs (experiments/soak.py): spawned, one per rank.

Both pieces share `_Rank`: a gloo group on a FileStore in the run's folder (bounded
waits), the OptiReduce hook's state and NIC (host/ddp_hook.py: select_nic, the bounded
control plane), every op's statistics recorded, the fault of the run armed, and the
result file the campaign checks.
- train_worker: DDP trains the DDP example's MLP with the hook, `steps` steps.
- collective_worker: `steps` calls of the NIC's allreduce on 40 000 floats (3 ops each),
  t_B calibrated first; a call whose every reduced packet holds every live rank's
  contribution must be the float64 mean of their inputs (which every rank computes
  from the seed) within the lossless bound; other calls have counted loss.

Files in the run's folder: err{rank}.txt (stderr; faulthandler's stacks on a crash),
addr{rank}.json (data and control addresses, for the junk), step{rank} (the step under
way), result{rank}.json; the junk handshake trained{rank} / junk_started / junk_stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

from optireduce.experiments import faults as F

COLLECTIVE_N = 40_000  # floats per allreduce call: 3 ops of C = 16384
EXACT_REL_L2 = 1e-4  # a lossless op's error bound against the float64 mean (DESIGN)


def step_file(run_dir: str, rank: int) -> Path:
    return Path(run_dir, f"step{rank}")


def udp_drops(port: int) -> int:
    """The kernel's drop count of our UDP socket on `port` (/proc/net/udp), -1 unknown."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port:
                return int(cols[-1])
    return -1


def collective_inputs(seed: int, call: int, world: int) -> np.ndarray:
    """[world, COLLECTIVE_N] float32: every rank's input of one call."""
    rng = np.random.default_rng([seed, call])
    return (rng.standard_normal((world, COLLECTIVE_N)) * (1 + np.arange(world))[:, None]).astype(
        np.float32
    )


class _Rank:
    """One rank of a run: process group, hook state, NIC, the fault, the result."""

    def __init__(self, rank: int, world: int, run_dir: str, spec: dict) -> None:
        err = open(Path(run_dir, f"err{rank}.txt"), "w")  # noqa: SIM115 (our stderr)
        os.dup2(err.fileno(), 2)
        import faulthandler

        faulthandler.enable()  # a crash leaves its stacks in err{rank}.txt
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        from datetime import timedelta

        import torch.distributed as dist

        from optireduce import OptiReduceState
        from optireduce.params import NicParams

        self.rank, self.world, self.run_dir, self.spec = rank, world, run_dir, spec
        dist.init_process_group("gloo", init_method=f"file://{run_dir}/store", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))  # fmt: skip
        self.state = OptiReduceState(NicParams(), warmup_iters=spec["warmup"], checksum_every=3,
                                     seed=spec["seed"])  # fmt: skip
        self.ops: list = []
        self.arm = threading.Event()
        self.granted = None

    def start_nic(self) -> None:
        """Build the NIC (collective), wrap its allreduce, publish the addresses."""
        nic = self.nic = self.state.nic
        allreduce = nic.allreduce

        def recording(x, out=None):
            res, st = allreduce(x, out=out)
            self.ops.extend(st)
            return res, st

        fault = self.spec["fault"]
        if fault in ("kill", "stall") and self.rank == self.spec["victim"]:
            sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP

            def armed(x, out=None):  # the first call after the fault step: the signal 1 ms in
                if self.arm.is_set():
                    self.arm.clear()
                    threading.Timer(0.001, os.kill, (os.getpid(), sig)).start()
                return recording(x, out)

            nic.allreduce = armed
        else:
            nic.allreduce = recording
        self.ports = {"data": list(nic.transport.address),
                      "control": list(self.state._control.transport.address)}  # fmt: skip
        Path(self.run_dir, f"addr{self.rank}.json").write_text(json.dumps(self.ports))

    def step(self, it: int) -> None:
        """Before step `it`: say so, and strike if this is the fault's step."""
        spec, fault = self.spec, self.spec["fault"]
        step_file(self.run_dir, self.rank).write_text(str(it))
        if it == spec["fault_step"] and self.rank == spec["victim"]:
            if fault in ("kill", "stall"):
                self.arm.set()
            elif fault == "sockbuf":
                t = getattr(self.nic.transport, "adopted", None) or self.nic.transport
                self.granted = F.shrink_buffers(t.sock)
        if it == spec["warmup"] and fault == "junk":  # every later step under junk
            self._wait_for("junk_started")

    def _wait_for(self, name: str) -> None:
        stop = time.monotonic() + 30
        while not Path(self.run_dir, name).exists() and time.monotonic() < stop:
            time.sleep(0.02)

    def finish(self, extra: dict) -> None:
        """Counters and statistics to result{rank}.json; close; leave the group."""
        import torch.distributed as dist

        nic, state = self.nic, self.state
        if self.spec["fault"] == "junk":
            # the parent stops the junk once every rank is done; one more op then reads
            # whatever junk is still queued ahead of its datagrams
            Path(self.run_dir, f"trained{self.rank}").touch()
            self._wait_for("junk_stopped")
            nic.allreduce(np.zeros(1, dtype=np.float32))
        ctl = state._control
        out = {
            **extra,
            "faults": state.faults,
            "backend": nic.backend,
            "t_b_us": state.t_b_us,
            "ops": [
                [
                    s.p1_expected,
                    s.p1_received,
                    s.p2_expected,
                    s.p2_received,
                    s.phase1_reason,
                    s.phase2_reason,
                ]
                for s in self.ops
            ],
            "counters": nic.counters(),
            "control": {**ctl.transport.counters(), "foreign": ctl.ep.stats()["foreign"]},
            "kernel_drops": {
                "data": udp_drops(self.ports["data"][1]),
                "control": udp_drops(self.ports["control"][1]),
            },
            "granted_buffers": self.granted,
        }
        state.close()
        Path(self.run_dir, f"result{self.rank}.json").write_text(json.dumps(out))
        if not out["faults"]:
            dist.barrier()  # a barrier would wait for the dead
        dist.destroy_process_group()


def train_worker(rank: int, world: int, run_dir: str, spec: dict) -> None:
    me = _Rank(rank, world, run_dir, spec)
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from optireduce import optireduce_hook
    from optireduce.experiments.ddp_example import teacher_task, train_step

    xs, ys = teacher_task()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets
    ddp.register_comm_hook(me.state, optireduce_hook)
    me.start_nic()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    times = []
    for it in range(spec["steps"]):
        me.step(it)
        times.append(train_step(ddp, opt, xs, ys, it, world, rank))
    ck = sum(p.detach().double().sum().item() for p in model.parameters())
    del ddp
    me.finish({"checksum": ck.hex(), "step_s_max": max(times)})


def collective_worker(rank: int, world: int, run_dir: str, spec: dict) -> None:
    me = _Rank(rank, world, run_dir, spec)
    me.start_nic()
    state, nic = me.state, me.nic
    seed = spec["seed"]
    # t_B from warm-up ops, then the hook's bounds (max(t_B, control floor))
    state.t_b_us = nic.calibrate(collective_inputs(seed, 10_000, world)[rank], ops=3)
    state.iteration = state.warmup_iters
    me.ops.clear()
    calls, times = [], []
    for it in range(spec["steps"]):
        me.step(it)
        xs = collective_inputs(seed, it, world)
        before = set(state.faults)
        t0 = time.monotonic()
        res, st = nic.allreduce(xs[rank])
        times.append(time.monotonic() - t0)
        live = [r for r in range(world) if r not in state.faults]
        ref = xs[live].astype(np.float64).mean(axis=0)
        err = float(np.linalg.norm(res - ref) / np.linalg.norm(ref))
        # exact when every reduced packet holds every live rank's contribution
        n = len(live)
        lossless = all(len(h) > n and sum(h) == h[n] for h in (s.contributor_hist for s in st))
        calls.append({"lossless": lossless, "stable": before == set(state.faults),
                      "rel_l2": err})  # fmt: skip
    me.finish({"calls": calls, "step_s_max": max(times)})
