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
import select
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence

from optireduce.ubt import DEFAULT_ADDRESSING

CLONE_NEWNET = 0x40000000
NO_NETNS_VAR = "OPTIREDUCE_NO_NETNS"  # "1": this machine cannot make namespaces (README)
IFNAME = "eth0"  # each host's interface towards the bridge
BOARD_HOST_IF = "brd0"  # a board host's interface to its board's host port
BOARD_HOST_OFFSET = 100  # a board host's own address: its rank's + this
BOARD_START_S = 60.0  # a virtual board opens its interfaces within this


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
    """`hosts` namespaces (and a stranger's, if asked) on one bridge.

    With `boards` (host indices), the hosts take the NIC's build addressing
    (optireduce.ubt.DEFAULT_ADDRESSING): host i is rank i at ip_base + i + 1 with MAC
    mac_base + i, except that a board's host keeps that rank address for its board and
    has BOARD_HOST_OFFSET added to its own. Each board gets a namespace of its own with
    two cables: `BOARD_HOST_IF` in its host's namespace to the board's `hp` (host port),
    and the board's `np` (network port) on the bridge. `start_board(i, exe)` runs a
    virtual board (sim/cosim/board_harness.cpp) on them. No host sends anything the NIC
    model would not (IPv6 off, every address's neighbour entry static, the bridge
    floods nothing to a board), so a board's counters can be compared with the model's.
    """

    def __init__(self, hosts: int, *, subnet: str = "10.77.0", rate: str = "1gbit",
                 stranger: bool = False, boards: Sequence[int] = ()) -> None:  # fmt: skip
        self.tag = f"ort{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.hosts, self.subnet, self.rate = hosts, subnet, rate
        self.sw = f"{self.tag}-sw"
        self.ns = [f"{self.tag}-h{i}" for i in range(hosts)]
        self.stranger = f"{self.tag}-x" if stranger else None
        self.boards = {b: f"{self.tag}-b{b}" for b in boards}
        if any(not 0 <= b < hosts for b in self.boards) or (self.boards and stranger):
            raise ValueError("NetnsCluster: boards are host indices, and no stranger with them")
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []  # stopped by down()

    def rank_ip(self, i: int) -> str:
        """Rank i's data address: the NIC addressing's with boards, else the host's."""
        if not self.boards:
            return self.ip(i)
        return socket.inet_ntoa(DEFAULT_ADDRESSING.ip(i))

    def rank_mac(self, i: int) -> str:
        return DEFAULT_ADDRESSING.mac(i).hex(":")

    def ip(self, i: int) -> str:
        """Host i's own address."""
        if not self.boards:
            return f"{self.subnet}.{i + 1}"
        a = int.from_bytes(DEFAULT_ADDRESSING.ip(i), "big")
        return socket.inet_ntoa((a + BOARD_HOST_OFFSET * (i in self.boards)).to_bytes(4, "big"))

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
        self._quiet(self.sw)
        # no IGMP snooping: with it, the bridge joins the snoopers' group (224.0.0.106) and
        # its IGMPv3 reports (IP options: a board's parser drops them as bad_ip_header) were
        # flooded to every port, a board's too, up to a second after it came up
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
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
            if self.boards:
                self._quiet(ns)
                if k not in self.boards:
                    sh("ip", "-n", ns, "link", "set", IFNAME, "address", self.rank_mac(k))
            self._cable(ns, IFNAME, port)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for b, ns in self.boards.items():
            self._board_up(b, ns)
        if self.boards:
            self._static_neighbours()
        return self

    def _cable(self, ns: str, dev: str, port: str) -> None:
        """A host's veth end `dev` and its bridge port `port`: up, both directions shaped."""
        sh("ip", "-n", self.sw, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", ns, "link", "set", dev, "up")
        for where, d in ((ns, dev), (self.sw, port)):
            sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", d, "root",
               "tbf", "rate", self.rate, "burst", "128kb", "latency", "20ms")  # fmt: skip

    @staticmethod
    def _quiet(ns: str) -> None:
        """No IPv6 (router and neighbour solicitations) in namespace ns."""
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
           "net.ipv6.conf.default.disable_ipv6=1")  # fmt: skip

    def _board_up(self, b: int, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        self._quiet(ns)
        sh("ip", "link", "add", BOARD_HOST_IF, "netns", self.ns[b], "type", "veth",
           "peer", "name", "hp", "netns", ns)  # fmt: skip
        sh("ip", "-n", self.ns[b], "link", "set", BOARD_HOST_IF, "up")
        sh("ip", "-n", ns, "link", "set", "hp", "up")
        port = f"pb{b}"
        sh("ip", "link", "add", "np", "netns", ns, "type", "veth", "peer", "name", port,
           "netns", self.sw)  # fmt: skip
        # a wire carries frames: what a host hands its stack as one GSO batch reaches the
        # board segmented, as a NIC would put it on the cable
        sh("ip", "-n", self.sw, "link", "set", port, "gso_max_segs", "1")
        self._cable(ns, "np", port)
        # the switch sends the board only what is addressed to it, as a learned port would
        sh("ip", "netns", "exec", self.sw, "bridge", "link", "set", "dev", port, "flood", "off",
           "mcast_flood", "off")  # fmt: skip
        sh("ip", "netns", "exec", self.sw, "bridge", "fdb", "add", self.rank_mac(b), "dev", port,
           "master", "static")  # fmt: skip

    def _static_neighbours(self) -> None:
        """Every host knows every rank's and host's MAC: no ARP broadcasts reach a board."""
        macs = {self.rank_ip(i): self.rank_mac(i) for i in range(self.hosts)}
        for b in self.boards:
            macs[self.ip(b)] = self.mac(b)
        for ns in self.ns:
            for ip, mac in macs.items():
                sh("ip", "-n", ns, "neigh", "replace", ip, "lladdr", mac, "dev", IFNAME,
                   "nud", "permanent")  # fmt: skip

    def start_board(self, b: int, exe: str, stats: str | None = None,
                    pcap: str | None = None) -> subprocess.Popen:  # fmt: skip
        """The virtual board `exe` (sim/cosim_build.board_harness_path) of host b, running
        in its namespace until down(): its figures to `stats` (JSON) as it ends, its two
        ports' frames to `pcap`-host.pcap and `pcap`-net.pcap."""
        cmd = [*self.exec_prefix(self.boards[b]), exe, "--host", "hp", "--net", "np"]
        for opt, v in (("--stats", stats), ("--pcap", pcap)):
            if v:
                cmd += [opt, v]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        # ready once its sockets are open: it says so in its first line (bounded wait)
        if not select.select([proc.stderr], [], [], BOARD_START_S)[0]:
            raise RuntimeError(f"the virtual board of host {b} did not start in {BOARD_START_S} s")
        line = proc.stderr.readline()
        if not line.startswith("virtual board: host port on"):
            raise RuntimeError(f"the virtual board of host {b} failed: {line}{proc.stderr.read()}")
        return proc

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
        for p in self.procs:  # asked first: a virtual board writes its figures as it ends
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
        for ns in self.made:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.kill_ns(ns)
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
