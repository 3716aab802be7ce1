"""Hosts on separate network stacks on one machine: network namespaces on a bridge.

`NetnsCluster(hosts)` makes a switch namespace holding a Linux bridge and one namespace per
host (and optionally a stranger's), each joined to the bridge by a veth pair whose two ends
are shaped with `tc ... tbf` (1 Gbit/s by default: these kernels have no netem, so delay and
loss stay in our own impairment layer). Addresses live only inside the namespaces. Names
are unique to the run, and `down()` (or leaving the `with` block) removes everything,
killing whatever still runs inside.

A process joins a host with `enter(name)` before it opens any socket or thread: torch's
spawned workers do that first thing, so gloo, the store's client and OptiReduce's
transports all live on that host's stack (the FileStore is a file: namespaces do not
separate file systems). Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess

CLONE_NEWNET = 0x40000000
NO_NETNS_VAR = "OPTIREDUCE_NO_NETNS"  # "1": this machine cannot make namespaces (README)
IFNAME = "eth0"  # each host's interface towards the bridge


class NetnsError(RuntimeError):
    """Namespaces cannot be made here; the message says what to do."""


def check_netns() -> None:
    """Raise NetnsError with the fix unless this process can make namespaces."""
    fix = f"; or set {NO_NETNS_VAR}=1 on a machine that cannot make network namespaces"
    if os.geteuid() != 0:
        raise NetnsError("network namespaces need root: run as root" + fix)
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsError(f"`{tool}` is missing: install iproute2 (apt-get install iproute2)"
                             + fix)  # fmt: skip


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (30 s bound); RuntimeError with its stderr when it fails and check."""
    r = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def enter(name: str) -> None:
    """Move this process's thread into namespace `name` (call before any socket or thread:
    threads made later inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    path = f"/var/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)
    if os.stat("/proc/thread-self/ns/net").st_ino != os.stat(path).st_ino:
        raise NetnsError(f"setns({name}): this thread is not in the namespace after it")


class NetnsCluster:
    """`hosts` namespaces (and a stranger's, if asked) on one bridge."""

    def __init__(self, hosts: int, *, subnet: str = "10.77.0", rate: str = "1gbit",
                 stranger: bool = False) -> None:  # fmt: skip
        self.tag = f"ort{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.hosts, self.subnet, self.rate = hosts, subnet, rate
        self.sw = f"{self.tag}-sw"
        self.ns = [f"{self.tag}-h{i}" for i in range(hosts)]
        self.stranger = f"{self.tag}-x" if stranger else None
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []  # killed by down()

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    @property
    def stranger_ip(self) -> str:
        return f"{self.subnet}.100"

    def up(self) -> NetnsCluster:
        check_netns()
        r = sh("ip", "netns", "add", self.sw, check=False)
        if r.returncode != 0:
            raise NetnsError(f"`ip netns add` failed ({r.stderr.strip()}): needs root and a "
                             "kernel with network namespaces; or set "
                             f"{NO_NETNS_VAR}=1")  # fmt: skip
        self.made.append(self.sw)
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        hosts = [(ns, self.ip(i)) for i, ns in enumerate(self.ns)]
        if self.stranger:
            hosts.append((self.stranger, self.stranger_ip))
        for k, (ns, addr) in enumerate(hosts):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            port = f"p{k}"
            sh("ip", "link", "add", IFNAME, "netns", ns, "type", "veth",
               "peer", "name", port, "netns", self.sw)  # fmt: skip
            sh("ip", "-n", self.sw, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
            sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            for where, dev in ((ns, IFNAME), (self.sw, port)):  # both directions shaped
                sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root",
                   "tbf", "rate", self.rate, "burst", "128kb", "latency", "20ms")  # fmt: skip
        return self

    def mac(self, i: int) -> str:
        return sh("ip", "netns", "exec", self.ns[i], "cat", f"/sys/class/net/{IFNAME}/address"
                  ).stdout.strip()  # fmt: skip

    def exec_prefix(self, ns: str) -> list[str]:
        """A command line's prefix that runs it in namespace ns."""
        return ["ip", "netns", "exec", ns]

    def kill_ns(self, ns: str) -> None:
        """Every process in namespace ns."""
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def down(self) -> None:
        """Everything removed; one stuck command does not stop the rest."""
        for ns in self.made:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.kill_ns(ns)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for ns in reversed(self.made):
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                sh("ip", "netns", "del", ns, check=False)

    def left_behind(self) -> set[str]:
        """Namespaces of this cluster that still exist (none after down())."""
        return set(sh("ip", "netns", "list").stdout.split()) & set(self.made)

    def __enter__(self) -> NetnsCluster:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()
