"""The driver's `sim` backend: the Verilated NIC core, live, in its own process.

The C++ harness (sim/cosim/nic_harness.cpp, mode `live`) runs the core at full
speed with its tick from the wall clock. It owns this rank's UDP socket (the
transport's, handed over as a file descriptor, so peers need no new address) and
talks to this object over its stdin/stdout: START commands and float words in,
host_o records (results, then the STATS record) out. Same API and same results
as SoftwareNic (host/driver.py), bit for bit.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import subprocess
import time

import numpy as np

from optireduce import host_port
from optireduce.host.driver import (
    BackendUnavailable,
    HostNic,
)
from optireduce.host.model.nic_model import EXP_COUNTERS, OpResult
from optireduce.op_stats import OpStats
from optireduce.sim.replay import cmd_bits, config_writes, counter_offsets, host_record
from optireduce.ubt import DEFAULT_ADDRESSING, proposal_word

log = logging.getLogger("optireduce")

# Messages on the harness's pipes (little endian u32 type first; docs/cosim.md).
MSG_CSR_WRITE, MSG_START, MSG_CSR_READ, MSG_INFO, MSG_QUIT, MSG_HOST = range(1, 7)
INFO_KEYS = (
    "cycles", "ticks", "busy_ns", "wall_ns", "rx", "tx", "dropped", "rx_queued", "cmd_queued",
    "idle", "cpu_ns",
)  # fmt: skip


def op_stats(d: dict, rank: int) -> OpStats:
    """OpStats from a decoded STATS record (host_port.stats_from_words)."""
    fields = {k: v for k, v in d.items() if k in OpStats.__dataclass_fields__}
    fields["t_c_us"] = (d["t_c_phase1_us"], d["t_c_phase2_us"])
    return OpStats(rank=rank, **fields)


class SimNic(HostNic):
    """One rank's NIC as the co-simulated RTL (same API as SoftwareNic)."""

    backend = "sim"
    wait_slack_s = 10.0  # the first op may also wait for the harness to start

    def _open(self) -> None:
        from optireduce.sim.cosim_build import harness_path
        from optireduce.sim.toolchain import ToolchainError

        if self.transport.impairment is not None:
            raise BackendUnavailable("the sim NIC sends on the socket itself: no impairment")
        try:
            self.exe = harness_path(self.p)
        except (ToolchainError, ImportError) as e:
            raise BackendUnavailable(f"cannot build the co-simulation harness: {e}") from e
        self.gone: set[int] = set()
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        if len(self.transport.peers) == self.world:
            self._ensure()  # start now: the first op should not pay for it

    # ---- the harness process -------------------------------------------------------
    def _ensure(self) -> subprocess.Popen:
        if self.proc is not None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the sim NIC harness exited ({self.proc.returncode})")
            return self.proc
        peers = self.transport.peers
        if len(peers) != self.world:
            raise RuntimeError("sim NIC: connect the transport to every rank first")
        fd = self.transport.sock.fileno()
        addr = DEFAULT_ADDRESSING
        cmd = [
            str(self.exe), "live", "--rank", str(self.rank), "--world", str(self.world),
            "--sock-fd", str(fd), "--peers", ",".join(f"{h}:{p}" for h, p in peers),
            "--mac-base", str(addr.mac_base), "--ip-base", str(addr.ip_base),
            "--udp-port", str(self.p.udp_port),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     pass_fds=(fd,), bufsize=0)  # fmt: skip
        for a, v in config_writes(self.p, self.rank, self.world):
            self._send(struct.pack("<III", MSG_CSR_WRITE, a, v))
        return self.proc

    def _send(self, msg: bytes) -> None:
        self._ensure().stdin.write(msg)

    def _read(self, n: int, deadline: float) -> bytes:
        """n bytes from the harness, or TimeoutError past `deadline` (monotonic)."""
        proc = self._ensure()
        fd = proc.stdout.fileno()
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("sim NIC: no answer from the harness in time")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"the sim NIC harness exited ({proc.wait(5)})")
                self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _message(self, deadline: float) -> tuple[int, bytes]:
        (typ,) = struct.unpack("<I", self._read(4, deadline))
        if typ == MSG_HOST:
            _, count = struct.unpack("<QI", self._read(12, deadline))
            return typ, self._read(4 * count, deadline)
        if typ == MSG_CSR_READ:
            return typ, self._read(8, deadline)
        if typ == MSG_INFO:
            return typ, self._read(8 * len(INFO_KEYS), deadline)
        raise RuntimeError(f"sim NIC: unknown message {typ} from the harness")

    def _request(self, msg: bytes, want: int, timeout_s: float = 10.0) -> bytes:
        self._send(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            typ, data = self._message(deadline)
            if typ == want:
                return data
            raise RuntimeError(f"sim NIC: message {typ} while waiting for {want}")

    # ---- the Nic API --------------------------------------------------------------------
    def csr_read(self, offset: int) -> int:
        return struct.unpack("<II", self._request(struct.pack("<II", MSG_CSR_READ, offset),
                                                  MSG_CSR_READ))[1]  # fmt: skip

    def exclude(self, rank: int) -> None:
        """The core has no exclude input (docs/nic_core.md, gaps): a dead peer is noted,
        and the core's deadlines still bound every op it takes part in."""
        self.gone.add(rank)

    def counters(self) -> dict[str, int]:
        """The register bank's counters, the exponent counters (EXP_COUNTERS) included."""
        offsets = {**counter_offsets(self.p), **counter_offsets(self.p, EXP_COUNTERS)}
        return {k: self.csr_read(a) for k, a in offsets.items()}

    def info(self) -> dict[str, int]:
        """Cycles and ticks simulated; busy (not sleeping), wall and CPU time in ns;
        datagrams in, out and dropped; what is queued; the core's idle."""
        data = self._request(struct.pack("<I", MSG_INFO), MSG_INFO)
        return dict(zip(INFO_KEYS, struct.unpack(f"<{len(INFO_KEYS)}Q", data), strict=True))

    def set_t_b(self, t_b_us: int) -> None:
        """A calibrated hard bound for every later phase (the t_b_us register)."""
        self.p = self.p.replace(t_b_us=int(t_b_us))
        for a, v in config_writes(self.p, self.rank, self.world):
            self._send(struct.pack("<III", MSG_CSR_WRITE, a, v))

    # ---- the op loop's primitives (HostNic._allreduce) ------------------------------
    def _room(self, op_id: int, done: int) -> bool:
        # The harness queues commands and the core takes each when its window has
        # room; one more than the window is queued, so the pipes never both fill.
        return op_id < done + self.p.ops_in_flight + 1

    def _start(
        self, op_id: int, chunk: np.ndarray, exponent: int | None, ahead: int | None
    ) -> None:
        bits = cmd_bits(exponent, proposal_word(ahead))  # exponent None: the in-band one
        head = struct.pack("<IIII", MSG_START, op_id, len(chunk), bits)
        self._send(head + chunk.astype("<f4").tobytes())

    def _poll(self, deadline: float) -> list[OpResult]:
        """The next result record (the harness sends nothing else unasked)."""
        typ, data = self._message(deadline)
        if typ != MSG_HOST:
            raise RuntimeError(f"sim NIC: unexpected message {typ}")
        op_id, res, words = host_record(np.frombuffer(data, "<u4").tolist(), self.world)
        return [OpResult(op_id, res, op_stats(host_port.stats_from_words(words), self.rank))]

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.stdin.write(struct.pack("<I", MSG_QUIT))
                proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait(timeout=5)
            proc.stdout.close()
        self.transport.close()
