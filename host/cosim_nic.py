"""The driver's `sim` backend: the Verilated NIC core, live, in its own process.

The C++ harness (sim/cosim/nic_harness.cpp, mode `live`) runs the core at full
speed with its tick from the wall clock. It owns this rank's UDP socket (the
transport's, handed over as a file descriptor, so peers need no new address) and
talks to this object over its stdin/stdout: START commands and float words in,
host_o records (the head, results, then the STATS record) out. Same API and same results
as SoftwareNic (host/driver.py), bit for bit.
"""

from __future__ import annotations

import logging
import math
import os
import select
import struct
import subprocess
import time
from collections import deque

import numpy as np

from optireduce import host_port
from optireduce.host.driver import (
    BackendUnavailable,
    HostNic,
)
from optireduce.host.model.nic_model import EXP_COUNTERS, OpResult
from optireduce.sim.replay import cmd_bits, config_writes, counter_offsets, host_record
from optireduce.ubt import DEFAULT_ADDRESSING, proposal_word

log = logging.getLogger("optireduce")

# Messages on the harness's pipes (little endian u32 type first; docs/cosim.md).
MSG_CSR_WRITE, MSG_START, MSG_CSR_READ, MSG_INFO, MSG_QUIT, MSG_HOST = range(1, 7)
INFO_KEYS = (
    "cycles", "ticks", "busy_ns", "wall_ns", "rx", "tx", "dropped", "rx_queued", "cmd_queued",
    "idle", "cpu_ns",
)  # fmt: skip


class SimNic(HostNic):
    """One rank's NIC as the co-simulated RTL (same API as SoftwareNic)."""

    backend = "sim"
    probe_s = 1.0  # with a result awaited, how often the core's clock is read
    stall_s = 10.0  # an op in flight and the core's clock still this long: the harness is stuck

    def _open(self) -> None:
        from optireduce.sim.cosim_build import harness_path
        from optireduce.sim.toolchain import ToolchainError

        if self.transport.impairment is not None:
            raise BackendUnavailable("the sim NIC sends on the socket itself: no impairment")
        if self.p.tc_sample != "duration":  # hw/deadline.py samples a deadline phase whole
            raise BackendUnavailable(f"the gateware has no tc_sample={self.p.tc_sample!r}")
        if self.p.progress_ahead:  # hw/parser.py drops a future op's frame before the aggregator
            raise BackendUnavailable("the gateware has no progress_ahead (docs/deadlines.md)")
        if self.transport.key is not None:  # the harness sends on the socket: no tags
            raise BackendUnavailable("the gateware has no tags: a keyed job (OPTIREDUCE_KEY_FILE) "
                                     "runs on the native or software backend")  # fmt: skip
        try:
            self.exe = harness_path(self.p)
        except (ToolchainError, ImportError) as e:
            raise BackendUnavailable(f"cannot build the co-simulation harness: {e}") from e
        self._last_start: int | None = None  # the last op's start_us (host_port.op_stats)
        self.gone: set[int] = set()
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._host: deque[bytes] = deque()  # result records that came while awaiting a reply
        self._tick_limit = 0  # this call's bound on the core's clock (_limit)
        self._clock = (0, 0.0)  # the core's clock when last read, and when (monotonic)
        self._why = ""  # why the call was found late
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

    def _fill(self, n: int, deadline: float) -> None:
        """At least n bytes from the harness buffered, or TimeoutError past `deadline`
        (monotonic); nothing is consumed, so a timeout never splits a message."""
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

    def _message(self, deadline: float) -> tuple[int, bytes]:
        """The next whole message: its type and body (HOST: the words, without tick and
        count)."""
        self._fill(4, deadline)
        (typ,) = struct.unpack_from("<I", self._buf)
        if typ == MSG_HOST:
            self._fill(16, deadline)
            (count,) = struct.unpack_from("<I", self._buf, 12)
            head, size = 16, 16 + 4 * count
        elif typ == MSG_CSR_READ:
            head, size = 4, 12
        elif typ == MSG_INFO:
            head, size = 4, 4 + 8 * len(INFO_KEYS)
        else:
            raise RuntimeError(f"sim NIC: unknown message {typ} from the harness")
        self._fill(size, deadline)
        body, self._buf = self._buf[head:size], self._buf[size:]
        return typ, body

    def _request(self, msg: bytes, want: int, timeout_s: float = 10.0) -> bytes:
        """Send `msg` and return the reply's body (within timeout_s: the first request
        may wait for the harness to start); result records that come first are kept
        for _poll (a reply can be asked for with ops in flight)."""
        self._send(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            typ, data = self._message(deadline)
            if typ == want:
                return data
            if typ != MSG_HOST:
                raise RuntimeError(f"sim NIC: message {typ} while waiting for {want}")
            self._host.append(data)

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
        """A calibrated hard bound for every later phase: the t_b_us register alone (as
        the model's set_t_b, t_C's state stays; a new t_c_init_us would restart it)."""
        from optireduce.hw.csr import register

        self.p = self.p.replace(t_b_us=int(t_b_us))
        off = register(self.p, "t_b_us").offset
        self._send(struct.pack("<III", MSG_CSR_WRITE, off, self.p.t_b_us))

    # ---- the op loop's primitives (HostNic._allreduce) ------------------------------
    def _limit(self, ops: int) -> float:
        """HostNic's bound on the clock the core's deadlines run on, its ticks. While it
        waits for a deadline the core gets a tick only once it is idle again (about 40
        cycles), so its clock runs about 190 times slower than the wall clock (measured
        in the demo; 500 at load 19): the bound read in seconds failed every op with a
        phase that ended by its deadline. Each phase ends by t_B ticks after it starts;
        outside the phases the core takes in, encodes, decodes and reads out at most C
        elements, a few cycles each (4.2 for a whole op, measured), and the harness
        strobes at most one tick a cycle: 8 C ticks per op cover it. Ops queued behind
        the window start when one ends, so the call's bound is ops x (2 t_B + 8 C) ticks
        from now; time stands still until the first START. No wall-clock limit: _poll
        raises past the tick bound, or when the clock stands still for stall_s with an op
        in flight (the harness is stuck)."""
        ticks = self.info()["ticks"]
        self._tick_limit = ticks + ops * (2 * self.p.t_b_us + 8 * self.p.c)
        self._clock = (ticks, time.monotonic())
        self._why = ""
        return math.inf

    def _late(self, got: int, ops: int) -> TimeoutError:
        e = super()._late(got, ops)
        return TimeoutError(f"{e} ({self._why})") if self._why else e

    def _check_clock(self) -> None:
        """TimeoutError if the core's clock passed this call's bound or stands still."""
        ticks, now = self.info()["ticks"], time.monotonic()
        if self._host:
            return  # a result came meanwhile
        if ticks > self._tick_limit:
            self._why = f"the core's clock at tick {ticks}, past the bound, tick {self._tick_limit}"
            raise TimeoutError(self._why)
        if ticks != self._clock[0]:
            self._clock = (ticks, now)
        elif now - self._clock[1] > self.stall_s:
            self._why = f"the core's clock stood still at tick {ticks} for {self.stall_s} s"
            raise TimeoutError(self._why)

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
        """The next result record (the harness sends nothing else unasked); the core's
        clock is read every probe_s without one (_check_clock)."""
        while not self._host:
            try:
                typ, data = self._message(min(deadline, time.monotonic() + self.probe_s))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                self._check_clock()
                continue
            if typ != MSG_HOST:
                raise RuntimeError(f"sim NIC: unexpected message {typ}")
            self._host.append(data)
        data = self._host.popleft()
        op_id, res, words = host_record(np.frombuffer(data, "<u4").tolist(), self.world)
        # ticks wrap (tick_bits): each op's start is put near the one before
        d = host_port.stats_from_words(words)
        st = host_port.op_stats(d, self.rank, self.p.tick_bits, self._last_start)
        self._last_start = st.start_us
        return [OpResult(op_id, res, st)]

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
