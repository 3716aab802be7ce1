"""UBT datagrams between ranks over real UDP sockets, with the impairment layer.

One socket per rank, bound to the address host/bind_address.py picks (the interface
that reaches the rendezvous, or the one named; the configured port range). Peers are
found through torch.distributed's store (`addresses_from_store`) or a static table.
Sends go out at once, or, with an impairment, from a timer thread at the drawn delay
(real clock). Receives drain whatever is queued, up to a bounded wait.

Admission, as the native transport does it: a datagram whose source address is not in
the peers table is dropped and counted (`not_member`); one from a member whose header
names another sender is dropped and counted (`wrong_sender`). The job id is the
protocol's check (the model counts `wrong_job`).

Keyed jobs (host/job_key.py, docs/security.md): every datagram sent ends in its header's
tag (ubt.header_tag); one from a member without the right tag is dropped and counted
(`bad_tag`), and the tag is cut off before anything else reads the datagram.
"""

from __future__ import annotations

import contextlib
import heapq
import hmac
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from optireduce.host.bind_address import (
    BindError,
    bind_udp,
    check_ipv4,
    is_loopback,
    local_ipv4,
    port_range,
)
from optireduce.host.job_key import check_fingerprints, fingerprint, job_key
from optireduce.host.model.impairment import Impairment, ImpairmentSpec
from optireduce.ubt import KEY_LEN, TAG_LEN, header_tag

Address = tuple[str, int]
STORE_PREFIX = "optireduce/udp/"
UBT_SENDER = struct.Struct("!H")  # the UBT header's sender field, at byte 6
FROM_ENV = "env"  # UdpTransport(key=FROM_ENV): the job's key from the environment


def ubt_sender(datagram: bytes) -> int | None:
    """The rank a UBT datagram says sent it (None: too short to say; the parser drops it)."""
    return UBT_SENDER.unpack_from(datagram, 6)[0] if len(datagram) >= 8 else None


class UdpTransport:
    def __init__(
        self,
        rank: int,
        *,
        bind: Address | None = None,
        impairment: ImpairmentSpec | None = None,
        seed: int = 0,
        buffer_bytes: int = 32 << 20,
        sender_of: Callable[[bytes], int | None] = ubt_sender,
        key: bytes | str | None = FROM_ENV,
    ) -> None:
        """bind: (host, port) exactly; None: bind_address's choice (address and port range
        from the environment). sender_of: the rank a datagram's header names (admission).
        key: the job's key (KEY_LEN bytes), None for an unkeyed job, FROM_ENV: job_key()."""
        if isinstance(key, str) and key != FROM_ENV:
            raise ValueError(f"UdpTransport: key={key!r}: bytes, None or FROM_ENV")
        self.key = job_key() if isinstance(key, str) else key
        if self.key is not None and (not isinstance(self.key, bytes) or len(self.key) != KEY_LEN):
            raise ValueError(f"UdpTransport: a job key is {KEY_LEN} bytes")
        self.rank = rank
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self.sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
            if bind is None:
                bind_udp(self.sock, local_ipv4(), port_range())
            else:
                check_ipv4(bind[0])
                self.sock.bind(bind)
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.peers: list[Address] = []
        self._members: dict[Address, int] = {}
        self.sender_of = sender_of
        self.sent = self.received = 0
        self.not_member = self.wrong_sender = self.bad_tag = 0
        self.heard: dict[int, float] = {}  # rank -> time.monotonic() of its last admitted datagram
        self.impairment = Impairment(impairment, seed) if impairment else None
        self._queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, dst, datagram)
        self._seq = 0
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if self.impairment is not None:
            self._thread = threading.Thread(target=self._delayed_sender, daemon=True)
            self._thread.start()

    @property
    def address(self) -> Address:
        return self.sock.getsockname()

    def connect(self, peers: Sequence[Address]) -> None:
        """Set every rank's address (index = rank); datagrams from any other address are
        counted (not_member) and dropped."""
        table = [(socket.gethostbyname(h), int(p)) for h, p in peers]
        members = {a: r for r, a in enumerate(table)}
        if len(members) != len(table):
            raise ValueError(f"connect: two ranks have the same address: {table}")
        self.peers, self._members = table, members

    def counters(self) -> dict[str, int]:
        """Datagrams sent and admitted, and the admission drops by reason."""
        return {"tx_datagrams": self.sent, "rx_datagrams": self.received,
                "not_member": self.not_member, "wrong_sender": self.wrong_sender,
                "bad_tag": self.bad_tag}  # fmt: skip

    def send(self, dst: int, datagram: bytes) -> None:
        if self.key is not None:
            datagram = datagram + header_tag(self.key, datagram)
        if self.impairment is None:
            self._sendto(dst, datagram)
            return
        now = time.monotonic()
        with self._cv:
            for delay in self.impairment.fates():
                heapq.heappush(self._queue, (now + delay * 1e-6, self._seq, dst, datagram))
                self._seq += 1
            self._cv.notify()

    def _sendto(self, dst: int, datagram: bytes) -> None:
        try:
            self.sock.sendto(datagram, self.peers[dst])
            self.sent += 1
        except BlockingIOError:
            # A full send buffer: the datagram is lost, as on a congested link. The
            # protocol tolerates it; the receiver counts it as missing.
            pass

    def _delayed_sender(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (
                    not self._queue or self._queue[0][0] > time.monotonic()
                ):
                    wait = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._cv.wait(timeout=wait)
                if self._closed:
                    return
                _, _, dst, datagram = heapq.heappop(self._queue)
            self._sendto(dst, datagram)

    def set_impairment(self, spec: ImpairmentSpec) -> None:
        """Change the impairment from the next datagram on (its random stream goes on)."""
        if self.impairment is None:
            raise ValueError("set_impairment: this transport was made without an impairment")
        self.impairment.spec = spec

    @property
    def lost(self) -> int:
        """Datagram copies the impairment dropped."""
        return self.impairment.lost if self.impairment else 0

    @contextlib.contextmanager
    def reliable(self) -> Iterator[None]:
        """The same delays without loss or duplication, e.g. for warm-up ops."""
        imp = self.impairment
        if imp is None:
            yield
            return
        spec, imp.spec = imp.spec, imp.spec.reliable()
        try:
            yield
        finally:
            imp.spec = spec

    def recv(self, timeout_s: float) -> list[bytes]:
        """Every admitted datagram that arrives within timeout_s (at least those already
        queued)."""
        out: list[bytes] = []
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout_s))
        while ready:
            try:
                d, src = self.sock.recvfrom(65536)
            except BlockingIOError:
                break
            except ConnectionRefusedError:  # an ICMP error of an earlier send: not data
                continue
            r = self._members.get(src[:2])
            if r is None:
                self.not_member += 1
                continue
            if self.key is not None:
                if len(d) < TAG_LEN or not hmac.compare_digest(
                    d[-TAG_LEN:], header_tag(self.key, memoryview(d)[:-TAG_LEN])
                ):
                    self.bad_tag += 1
                    continue
                d = d[:-TAG_LEN]
            if self.sender_of(d) not in (r, None):
                self.wrong_sender += 1
                continue
            out.append(d)
            self.heard[r] = time.monotonic()
        self.received += len(out)
        return out

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.sock.close()

    def __enter__(self) -> UdpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def transport_from_store(store, rank: int, world: int, *, impairment: ImpairmentSpec | None = None,
                         seed: int = 0, prefix: str = STORE_PREFIX,
                         key: bytes | str | None = FROM_ENV,
                         publish: Address | None = None) -> UdpTransport:  # fmt: skip
    """This rank's transport, connected to every rank's through the store. `publish`: the
    address peers send to instead of the transport's own (a board NIC's)."""
    transport = UdpTransport(rank, impairment=impairment, seed=seed, key=key)
    try:
        transport.connect(addresses_from_store(store, rank, world, publish or transport.address,
                                               prefix=prefix, key=transport.key))  # fmt: skip
    except BaseException:
        transport.close()
        raise
    return transport


def addresses_from_store(store, rank: int, world: int, address: Address,
                         timeout_s: float = 60.0, prefix: str = STORE_PREFIX,
                         key: bytes | None = None) -> list[Address]:  # fmt: skip
    """Publish our address (and our key's fingerprint) in a torch.distributed store and read
    every rank's; JobKeyError unless every rank has the same key or none."""
    from datetime import timedelta

    store.set(f"{prefix}key/{rank}", fingerprint(key))
    store.set(f"{prefix}{rank}", f"{address[0]}:{address[1]}")
    store.set_timeout(timedelta(seconds=timeout_s))
    out = []
    for r in range(world):
        host, port = store.get(f"{prefix}{r}").decode().rsplit(":", 1)
        out.append((host, int(port)))
    loop = [r for r, (h, _) in enumerate(out) if is_loopback(h)]
    if loop and len(loop) < world:
        raise BindError(
            f"ranks {loop} publish loopback addresses and the others do not ({out}): the "
            "rendezvous (MASTER_ADDR) is on loopback for some hosts; give every host the "
            "rendezvous's routable address, or set OPTIREDUCE_IFNAME"
        )
    check_fingerprints([store.get(f"{prefix}key/{r}").decode() for r in range(world)], rank)
    return out
