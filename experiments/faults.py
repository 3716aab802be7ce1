"""The faults of the soak campaign (experiments/soak.py), each with its documented outcome.

A fault is injected into one run of a piece of the job (training, collective ops,
replay). What each must end in, and within what bound, is `OUTCOMES`; soak.py checks
every run against it.

- kill: one rank is killed (SIGKILL) in the middle of an op: a timer of that rank
  signals it 1 ms after its driver thread entered `allreduce`.
- stall: one rank is stopped (SIGSTOP) the same way, mid-op, for longer than t_B and the
  control floor; the campaign continues it (SIGCONT) after the stall.
- cpu: one busy process per core for the whole run (`CpuHogs`).
- sockbuf: one rank's data socket shrinks to the kernel's smallest buffers after the
  warm-up (`shrink_buffers`): bursts overflow it and the kernel drops datagrams.
- junk: bursts of malformed and outsider datagrams to every rank's data and control
  sockets (`JunkSender`): from sockets that are not members, and, when raw sockets are
  allowed (root), with a member's source address, so that they pass admission by
  address and reach the header checks.
- sigint: SIGINT to the whole process group of `optireduce train` in the middle of
  training, as a Ctrl-C in its terminal does.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optireduce import ubt

Address = tuple[str, int]
FAULTS = ("none", "kill", "stall", "cpu", "sockbuf", "junk", "sigint")


@dataclass(frozen=True)
class Outcome:
    what: str  # the documented outcome
    bound_s: float  # the run must end (every process gone) within this


# Bounds: a training smoke run takes 5-15 s on 2 loaded cores; a fault adds its own
# wait (the stall, the control floor that excludes the dead, the deadlines of the ops).
OUTCOMES = {
    "none": Outcome("a result: every rank finishes, replicas equal unless loss was counted", 90),
    "kill": Outcome("the fault policy's report: the survivors exclude the killed rank "
                    "(faults == [victim]) and finish", 120),
    "stall": Outcome("the fault policy's report: the others exclude the stalled rank and "
                     "finish; it comes back, finds itself alone (faults) and finishes", 120),
    "cpu": Outcome("a result with counted loss (deadlines may end phases), no exclusion", 150),
    "sockbuf": Outcome("a result with counted loss (the kernel's drops are missing packets)",
                       120),
    "junk": Outcome("a result: every junk datagram dropped and counted, training unchanged",
                    90),
    "sigint": Outcome("a clear error: the command exits non-zero within the bound, every "
                      "worker gone, no temporary folder left", 30),
}  # fmt: skip


def shrink_buffers(sock: socket.socket) -> tuple[int, int]:
    """The smallest receive and send buffers the kernel allows (it raises 1 to its floor);
    returns what it granted. A dup of the socket (the native engine's) shares them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))  # fmt: skip


class CpuHogs:
    """One busy process per core while the block runs (same niceness as ours)."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n or os.cpu_count() or 1
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> CpuHogs:
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=10)


def _udp_ip(src: Address, dst: Address, payload: bytes) -> bytes:
    """An IPv4/UDP packet (UDP checksum 0: none) for a raw socket."""
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))  # fmt: skip
    return ip + udp


def malformed_ubt(rng: np.random.Generator, sender: int, world: int, job_id: int) -> bytes:
    """One UBT datagram that names `sender` and fails a receiver check: wrong version,
    wrong job, reserved bits set, a truncated header, or a payload of the wrong length."""
    h = ubt.UbtHeader(version=1, msg_type=ubt.MSG_SCATTER, flags=0, exponent=0, job_id=job_id,
                      sender=sender, op_id=0, pkt_index=0, count=4, contributors=0, t_c_us=100,
                      op_len=4, world=world, reserved=0)  # fmt: skip
    kind = int(rng.integers(0, 5))
    if kind == 0:
        h = h._replace(version=7)
    elif kind == 1:
        h = h._replace(job_id=(job_id + 1 + int(rng.integers(0, 1000))) & 0xFFFF)
    elif kind == 2:
        h = h._replace(flags=0x80)
    elif kind == 3:
        return h.pack()[: int(rng.integers(8, ubt.HEADER_LEN))]
    return h.pack() + rng.bytes(int(rng.integers(0, 64)) * 4 + 3)  # never whole packets


class JunkSender:
    """Bursts of junk to every rank's sockets until stopped, from a thread.

    Per target (rank, data|control) it counts what it sent: `outsider` (from a socket
    that is no member: random bytes and well-formed-looking UBT headers), and, with raw
    sockets, `spoofed` (from a member's own address: malformed UBT for data sockets,
    random bytes for control sockets; some name another member as sender)."""

    def __init__(self, data: Sequence[Address], control: Sequence[Address], job_id: int,
                 seed: int = 0, burst: int = 20, every_s: float = 0.01) -> None:  # fmt: skip
        self.data, self.control = list(data), list(control)
        self.job_id, self.burst, self.every_s = job_id, burst, every_s
        self.rng = np.random.default_rng(seed)
        self.sent: dict[str, dict[str, int]] = {}
        self.raw_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="junk")
        self._out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._out.bind(("127.0.0.1", 0))
        self._raw: socket.socket | None = None
        try:
            self._raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except OSError as e:  # not root: outsiders only
            self.raw_error = f"no raw socket ({e}): outsider datagrams only"

    def start(self) -> JunkSender:
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict[str, int]]:
        self._stop.set()
        self._thread.join(timeout=5)
        self._out.close()
        if self._raw is not None:
            self._raw.close()
        return self.sent

    def _count(self, key: str, kind: str) -> None:
        d = self.sent.setdefault(key, {"outsider": 0, "spoofed": 0})
        d[kind] += 1

    def _run(self) -> None:
        world = len(self.data)
        while not self._stop.wait(self.every_s):
            for _ in range(self.burst):
                rank = int(self.rng.integers(0, world))
                plane = "data" if self.rng.random() < 0.7 else "control"
                dst = (self.data if plane == "data" else self.control)[rank]
                peer = int(self.rng.integers(0, world - 1))
                peer += peer >= rank  # another member: its address as the source
                named = peer if self.rng.random() < 0.7 else int(self.rng.integers(0, world))
                if plane == "data":
                    junk = malformed_ubt(self.rng, named, world, self.job_id)
                else:
                    junk = self.rng.bytes(int(self.rng.integers(1, 200)))
                key = f"{plane}{rank}"
                try:
                    if self._raw is not None and self.rng.random() < 0.6:
                        src = (self.data if plane == "data" else self.control)[peer]
                        self._raw.sendto(_udp_ip(src, dst, junk), (dst[0], 0))
                        self._count(key, "spoofed")
                    else:
                        self._out.sendto(junk, dst)
                        self._count(key, "outsider")
                except OSError:
                    pass  # a full buffer on our side: not sent, not counted
