"""The driver's `board` backend: an FPGA NIC, or a virtual board, on one of the host's
network interfaces (docs/boards.md, "From the box to training").

The host reaches the NIC's host port with host-port frames (optireduce/host_port.py,
EtherType 0x88B5) on a raw AF_PACKET socket bound to the interface named by
OPTIREDUCE_BOARD_IFNAME. It identifies the NIC by reading its ID and build-parameter
registers (REG frames, a bounded wait), configures it (rank, world, t_B, the peers'
addresses, admission), streams each op's chunk as START and DATA frames and takes back
RESULT fragments and the STATS record. Same `Nic` interface and results as every
backend; counters are read from the NIC's registers.

The NIC's network addresses are fixed by its build (hw/nic_core.py, Addressing): rank r
is at ip_base + r + 1, UDP port udp_port, MAC mac_base + r. A job with a board rank
therefore needs every rank at those addresses; `BoardNic` checks the addresses the
ranks published and says what to set when they differ.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optireduce import host_port
from optireduce.host.driver import BackendUnavailable, HostNic
from optireduce.host.model.nic_model import EXP_COUNTERS, OpResult
from optireduce.host.native import _engine, why
from optireduce.params import NicParams
from optireduce.ubt import DEFAULT_ADDRESSING, Addressing, proposal_word

log = logging.getLogger("optireduce")

BOARD_IFNAME_VAR = "OPTIREDUCE_BOARD_IFNAME"
NIC_TYPE = 0x4F52_0001  # the `nic` register block's type (docs/registers.md)
# START/DATA fragments: 256 words is a 1058-byte frame, inside a 1500-byte MTU and the
# board MAC's 2048-byte receive FIFO (docs/boards.md, "Fragment size")
FRAGMENT = 256
MAX_PAIRS = 128  # REG accesses per frame: 256 words, half the adapter's frame buffer
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_UNICAST = 263, 1, 3  # <linux/if_packet.h>
RECV_BATCH = 256  # frames taken from the socket per recv()
SEND_WAIT_S = 5.0  # longest wait for room in the interface's queue
IDENT = ("type", "version", "param_p", "param_b", "param_c", "param_n_max", "param_lanes",
         "param_ops_in_flight", "param_w_wire", "param_tick_bits", "job_id",
         "udp_port", "estimator")  # fmt: skip
# NicParams fields the NIC's registers give back: the job must use the board's values
PARAM_REGS = {"param_p": "p", "param_b": "b", "param_c": "c", "param_n_max": "n_max",
              "param_lanes": "lanes", "param_ops_in_flight": "ops_in_flight",
              "param_w_wire": "w_wire", "param_tick_bits": "tick_bits", "job_id": "job_id",
              "udp_port": "udp_port", "estimator": "estimator"}  # fmt: skip


class BoardError(RuntimeError):
    """The board could not be reached or answered wrongly; the message says what to do."""


class NoAnswer(BoardError):
    """Nothing answered a register access within the bound."""


def _offsets(p: NicParams) -> dict[str, int]:
    """Register offsets by name; every block has a `type`, `version` and `next`: the
    `nic` block's (the first) are the ones named."""
    from optireduce.hw.csr import register_map

    out: dict[str, int] = {}
    for blk in register_map(p):
        for r in blk.regs:
            out.setdefault(r.name, r.offset)
    return out


def board_address(rank: int, p: NicParams, addressing: Addressing = DEFAULT_ADDRESSING
                  ) -> tuple[str, int]:  # fmt: skip
    """Where a board NIC of `rank` sends and receives UBT datagrams (its build's addressing)."""
    return socket.inet_ntoa(addressing.ip(rank)), p.udp_port


def board_requested(env: dict[str, str] | None = None) -> bool:
    """Did the job ask for a board (OPTIREDUCE_BOARD_IFNAME set, the board backend allowed)?"""
    from optireduce.host.driver import default_backends

    env = os.environ if env is None else env
    return bool(env.get(BOARD_IFNAME_VAR, "").strip()) and "board" in default_backends()


def _batched() -> bool:
    """Are frames sent and received in batches by the native engine (sendmmsg, recvmmsg)?
    Without it, one frame per system call, said once in the log."""
    global _SAID
    if _engine is not None and hasattr(_engine, "send_frames"):
        return True
    if not _SAID:
        _SAID = True
        log.info("optireduce: the board's host port sends and receives a frame per system "
                 "call (%s)", why)  # fmt: skip
    return False


_SAID = False


class HostPortLink:
    """Host-port frames on one interface: a raw AF_PACKET socket for EtherType 0x88B5.
    Frames that are not the NIC's (another source, a bad header) are counted and dropped."""

    def __init__(self, ifname: str) -> None:
        self.ifname = ifname
        self.drops = {"not_from_nic": 0, "malformed": 0}
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                      socket.htons(host_port.ETHERTYPE))  # fmt: skip
        except PermissionError as e:
            raise BoardError(f"a raw socket for the host port needs CAP_NET_RAW ({e}): run as "
                             "root or grant the capability (docs/boards.md)") from e  # fmt: skip
        try:
            self.sock.bind((ifname, host_port.ETHERTYPE))
        except OSError as e:
            self.sock.close()
            raise BoardError(f"cannot use interface {ifname!r} for the host port ({e}); "
                             f"`ip link` lists the interfaces") from e  # fmt: skip
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
        # the NIC sends to HOST_MAC, not to this interface's own address: have the
        # interface's filter take it (struct packet_mreq, PACKET_MR_UNICAST)
        mreq = struct.pack("iHH8s", socket.if_nametoindex(ifname), PACKET_MR_UNICAST,
                           len(host_port.HOST_MAC), host_port.HOST_MAC)  # fmt: skip
        try:
            self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        except OSError as e:
            self.sock.close()
            raise BoardError(f"{ifname}: cannot have it receive frames for the host-port "
                             f"address {host_port.HOST_MAC.hex(':')} ({e})") from e  # fmt: skip
        self.sock.setblocking(False)

        self.native = _batched()

    def send(self, frames: list[bytes]) -> None:
        """Every frame, in order (a full interface queue is waited out, SEND_WAIT_S)."""
        if self.native:
            try:
                sent = _engine.send_frames(self.sock.fileno(), frames, SEND_WAIT_S)
            except RuntimeError as e:
                raise BoardError(f"{self.ifname}: sending to the NIC failed: {e}") from e
            if sent < len(frames):
                raise BoardError(f"{self.ifname}: the interface's queue stayed full for "
                                 f"{SEND_WAIT_S} s ({sent} of {len(frames)} sent)")  # fmt: skip
            return
        for f in frames:
            while True:
                if not select.select([], [self.sock], [], SEND_WAIT_S)[1]:
                    raise BoardError(f"{self.ifname}: the interface's queue stayed full for "
                                     f"{SEND_WAIT_S} s")  # fmt: skip
                try:
                    self.sock.send(f)
                    break
                except BlockingIOError:
                    continue  # room went to another frame: wait again
                except OSError as e:
                    raise BoardError(f"{self.ifname}: sending to the NIC failed: {e}") from e

    def recv(self, timeout_s: float) -> list[host_port.HostFrame]:
        """The NIC's frames that came within timeout_s (at least one, or none by then)."""
        timeout_s = max(0.0, timeout_s)
        if self.native:
            try:
                raw, _ = _engine.recv_frames(self.sock.fileno(), RECV_BATCH, timeout_s)
            except RuntimeError as e:
                raise BoardError(f"{self.ifname}: receiving from the NIC failed: {e}") from e
        else:
            raw = []
            if select.select([self.sock], [], [], timeout_s)[0]:
                while len(raw) < RECV_BATCH:
                    try:
                        frame, addr = self.sock.recvfrom(65536)
                    except BlockingIOError:
                        break
                    if addr[2] != socket.PACKET_OUTGOING:  # not our own send
                        raw.append(frame)
        out: list[host_port.HostFrame] = []
        for frame in map(host_port.unpad, raw):
            if frame[6:12] != host_port.NIC_MAC or frame[:6] != host_port.HOST_MAC:
                self.drops["not_from_nic"] += 1
                continue
            try:
                out.append(host_port.parse(frame))
            except ValueError:
                self.drops["malformed"] += 1
        return out

    def close(self) -> None:
        self.sock.close()


class RegisterPort:
    """REG transactions on a link: a request tagged with its own number, the reply matched
    by the tag (a bounded wait, retried: reads and writes may be applied twice). Frames
    that are not the awaited reply go to `others`."""

    def __init__(self, link: HostPortLink, timeout_s: float = 2.0, tries: int = 3) -> None:
        self.link, self.timeout_s, self.tries = link, timeout_s, tries
        self.others: deque[host_port.HostFrame] = deque()
        self.tag = 0
        self.stale = 0  # replies to earlier tries

    def access(self, accesses: list[tuple[int, int | None]]) -> list[int]:
        """Apply (offset, value) writes and (offset, None) reads in order; the values."""
        out: list[int] = []
        for k in range(0, len(accesses), MAX_PAIRS):
            out += self._frame(accesses[k : k + MAX_PAIRS])
        return out

    def _frame(self, accesses: list[tuple[int, int | None]]) -> list[int]:
        for _ in range(self.tries):
            self.tag = (self.tag + 1) & 0xFFFF_FFFF
            self.link.send([host_port.reg_request(accesses, self.tag)])
            deadline = time.monotonic() + self.timeout_s
            while (left := deadline - time.monotonic()) > 0:
                for f in self.link.recv(left):
                    if f.kind != host_port.REG:
                        self.others.append(f)
                    elif f.op_id == self.tag and f.count == 2 * len(accesses):
                        return host_port.reg_values(f)
                    else:
                        self.stale += 1
        raise NoAnswer(f"no answer from a NIC on {self.link.ifname} to a register access "
                         f"in {self.tries} x {self.timeout_s} s: is the board powered, "
                         "programmed (optireduce board program) and cabled to this "
                         "interface?")  # fmt: skip


@dataclass(frozen=True)
class BoardInfo:
    ifname: str
    version: int
    params: dict[str, int]  # NicParams fields from the build-parameter registers

    def describe(self) -> str:
        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"optireduce NIC v{_version(self.version)} on {self.ifname} ({ps})"


def _version(v: int) -> str:
    return f"{v >> 16}.{v & 0xFFFF}"


def identify(regs: RegisterPort, p: NicParams | None = None) -> BoardInfo:
    """Read the NIC's ID and build parameters; BoardError if it is not an optireduce NIC
    or one older than this host."""
    from optireduce.hw.csr import VERSION  # amaranth: imported when a board is used

    off = _offsets(p or NicParams())
    values = dict(zip(IDENT, regs.access([(off[name], None) for name in IDENT]), strict=True))
    if values["type"] != NIC_TYPE:
        raise BoardError(f"the device on {regs.link.ifname} answers with type "
                         f"{values['type']:#x}, not an optireduce NIC ({NIC_TYPE:#x})")  # fmt: skip
    got = values["version"]
    if got >> 16 != VERSION >> 16 or got < VERSION:
        raise BoardError(
            f"the NIC on {regs.link.ifname} has register block version {_version(got)}; this "
            f"host needs {_version(VERSION)} or a later {VERSION >> 16}.x (from 1.2 the host "
            "adapter takes the padded frames a wire delivers, from 1.3 its counters are "
            "registers, from 1.4 the NIC says its clock's width and its build's job id and "
            "port): build and load this "
            "version's bitstream (optireduce build bitstream --board NAME, then optireduce "
            "board program --board NAME)"
        )
    params = {PARAM_REGS[k]: v for k, v in values.items() if k in PARAM_REGS}
    return BoardInfo(regs.link.ifname, got, params)


def build_mismatch(info: BoardInfo, p: NicParams) -> dict[str, tuple[int, int]]:
    """The build parameters in which the board's NIC and the job differ: name -> (board,
    job). A job must run with the board's (a NIC built for another job id drops every
    frame of this one as wrong_job)."""
    job = {k: _register_value(p, k) for k in info.params}
    return {k: (v, job[k]) for k, v in info.params.items() if job[k] != v}


def _register_value(p: NicParams, field: str) -> int:
    """A NicParams field as its build register holds it (the estimator as 0/1)."""
    return int(p.estimator == "plain") if field == "estimator" else getattr(p, field)


def interfaces() -> list[str]:
    """The host's interfaces that are up, loopback aside."""
    out = []
    for d in sorted(Path("/sys/class/net").iterdir()):
        try:
            up = (d / "operstate").read_text().strip() in ("up", "unknown")
            loop = int((d / "type").read_text()) == 772  # ARPHRD_LOOPBACK
        except OSError:
            continue
        if up and not loop:
            out.append(d.name)
    return out


def detect(ifnames: list[str] | None = None, timeout_s: float = 0.5,
           errors: dict[str, str] | None = None) -> list[BoardInfo]:  # fmt: skip
    """The NICs answering on `ifnames` (default: every interface that is up): one REG read
    on each, one interface after another, answers awaited for timeout_s. An interface
    that could not be asked (no raw socket: not root), or whose device answered but is
    not a NIC this host can drive (another type, an older version), goes into `errors`
    with the reason; one where nothing answered is left out."""
    found = []
    for name in ifnames or interfaces():
        try:
            link = HostPortLink(name)
        except BoardError as e:
            if errors is not None:
                errors[name] = str(e)
            continue
        try:
            found.append(identify(RegisterPort(link, timeout_s, tries=1)))
        except NoAnswer:
            pass
        except BoardError as e:
            if errors is not None:
                errors[name] = str(e)
        finally:
            link.close()
    return found


class BoardNic(HostNic):
    """One rank's NIC as an FPGA board on a host interface (same API as SoftwareNic)."""

    backend = "board"
    reply_s = 0.05  # how long one _poll waits for a frame

    def _open(self) -> None:
        ifname = os.environ.get(BOARD_IFNAME_VAR, "").strip()
        if not ifname:
            raise BackendUnavailable(f"{BOARD_IFNAME_VAR} is not set (`optireduce board "
                                     "detect` lists the NICs answering)")  # fmt: skip
        self.gone: set[int] = set()
        self._check_addresses()
        self.link = HostPortLink(ifname)
        try:
            self.regs = RegisterPort(self.link)
            self.info = identify(self.regs, self.p)
            wrong = build_mismatch(self.info, self.p)
            if wrong:
                raise BoardError(f"the NIC on {ifname} was built for other parameters "
                                 f"(board, job): {wrong}; run the job with the board's "
                                 "NicParams or program a matching bitstream")  # fmt: skip
            self._off = _offsets(self.p)
            self._configure()
        except BaseException:
            self.link.close()
            raise
        self.found = self.info.describe()
        self._parts: dict[int, dict] = {}  # op_id -> RESULT fragments so far
        self._last_start: int | None = None  # the last op's start_us (host_port.op_stats)
        self.lost_results = 0

    def _check_addresses(self) -> None:
        want = [board_address(r, self.p) for r in range(self.world)]
        got = [(h, int(port)) for h, port in self.transport.peers]
        if len(got) == self.world and got != want:
            pairs = enumerate(zip(got, want, strict=True))
            bad = "; ".join(f"rank {r} published {g[0]}:{g[1]}, needs {w[0]}:{w[1]}"
                            for r, (g, w) in pairs if g != w)  # fmt: skip
            raise BoardError(
                f"a job with a board NIC needs every rank at the NIC's build addressing: {bad}; "
                "on those hosts set OPTIREDUCE_IFNAME to the interface holding that address "
                f"and OPTIREDUCE_PORT={want[0][1]} (docs/boards.md)"
            )

    def _configure(self) -> None:
        from optireduce.sim.replay import config_writes

        peers = [(int.from_bytes(socket.inet_aton(h), "big"), port)
                 for h, port in (board_address(r, self.p) for r in range(self.world))]  # fmt: skip
        writes = config_writes(self.p, self.rank, self.world, peers)
        # the NIC numbers ops from 0 only after a reset (clearing counters does not), and
        # its host adapter drops a START that is not the next op id
        (ran,) = self.regs.access([(self._off["ops_started"], None)])
        if ran:
            raise BoardError(f"the NIC on {self.link.ifname} has run {ran} ops since it was "
                             "loaded and expects the next op id; a job starts at op 0: reload "
                             "it (optireduce board program) before this job")  # fmt: skip
        self.regs.access([(self._off["ctrl"], 1), *writes])  # counters cleared, then set up

    # ---- the Nic API --------------------------------------------------------------------
    def exclude(self, rank: int) -> None:
        """The NIC has no exclude input (docs/nic_core.md, gaps): a dead peer is noted, and
        the NIC's deadlines still bound every op it takes part in."""
        self.gone.add(rank)

    def counters(self) -> dict[str, int]:
        """The NIC's counters (the exponent counters included), its host adapter's
        (`adapter_` names) and the host side's drops (`host_`)."""
        from optireduce.sim.replay import counter_offsets

        adapter = [f"adapter_{k}" for k in host_port.ADAPTER_COUNTERS]
        offsets = {**counter_offsets(self.p), **counter_offsets(self.p, EXP_COUNTERS),
                   **{name: self._off[name] for name in adapter}}  # fmt: skip
        values = self.regs.access([(a, None) for a in offsets.values()])
        out = dict(zip(offsets, values, strict=True))
        out.update({f"host_{k}": v for k, v in self.link.drops.items()})
        out["host_lost_results"] = self.lost_results
        return out

    def set_t_b(self, t_b_us: int) -> None:
        self.p = self.p.replace(t_b_us=int(t_b_us))
        self.regs.access([(self._off["t_b_us"], self.p.t_b_us)])

    # ---- the op loop's primitives (HostNic._allreduce) ------------------------------
    def _room(self, op_id: int, done: int) -> bool:
        # a START beyond the window would stall the host port, and a board's MAC drops
        # what arrives meanwhile
        return op_id < done + self.p.ops_in_flight

    def _start(
        self, op_id: int, chunk: np.ndarray, exponent: int | None, ahead: int | None
    ) -> None:
        frames = host_port.chunk_frames(
            host_port.START, op_id, chunk, exponent, proposal_word(ahead), fragment=FRAGMENT
        )
        self.link.send(frames)

    def _poll(self, deadline: float) -> list[OpResult]:
        """The ops whose STATS came (their RESULT fragments came before it)."""
        frames = list(self.regs.others)
        self.regs.others.clear()
        if not frames:
            frames = self.link.recv(min(self.reply_s, deadline - time.monotonic()))
        out = []
        for f in frames:
            if f.kind == host_port.RESULT:
                st = self._parts.setdefault(f.op_id, {"buf": np.zeros(f.n, np.float32), "got": 0})
                if f.offset + f.count > len(st["buf"]):
                    self.link.drops["malformed"] += 1
                    continue
                st["buf"][f.offset : f.offset + f.count] = np.frombuffer(f.payload, ">f4")
                st["got"] += f.count
            elif f.kind == host_port.STATS:
                words = np.frombuffer(f.payload, ">u4").tolist()
                try:
                    d = host_port.stats_from_words(words)
                except ValueError as e:
                    raise BoardError(f"op {f.op_id}: the NIC on {self.link.ifname} sent a "
                                     f"STATS record the host cannot read ({e})") from e  # fmt: skip
                st = self._parts.pop(f.op_id, None)
                if st is None or st["got"] != d["n"]:
                    self.lost_results += 1
                    raise BoardError(f"op {f.op_id}: the NIC on {self.link.ifname} sent "
                                     f"{0 if st is None else st['got']} of {d['n']} result "
                                     "words before its STATS (frames lost on the host "
                                     "link?)")  # fmt: skip
                # ticks wrap (tick_bits): each op's start is put near the one before
                stats = host_port.op_stats(d, self.rank, self.p.tick_bits, self._last_start)
                self._last_start = stats.start_us
                out.append(OpResult(f.op_id, st["buf"], stats))
            else:
                self.link.drops["malformed"] += 1
        return out

    def close(self) -> None:
        self.link.close()
        self.transport.close()
