"""UBT datagrams between ranks over real UDP sockets, with the impairment layer.

One socket per rank. Peers are found through torch.distributed's store
(`addresses_from_store`) or a static table. Sends go out at once, or, with an
impairment, from a timer thread at the drawn delay (real clock). Receives drain
whatever is queued, up to a bounded wait.
"""

from __future__ import annotations

import contextlib
import heapq
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence

from optireduce.host.model.impairment import Impairment, ImpairmentSpec

Address = tuple[str, int]
STORE_PREFIX = "optireduce/udp/"


class UdpTransport:
    def __init__(
        self,
        rank: int,
        *,
        bind: Address = ("127.0.0.1", 0),
        impairment: ImpairmentSpec | None = None,
        seed: int = 0,
        buffer_bytes: int = 32 << 20,
    ) -> None:
        self.rank = rank
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
        self.sock.bind(bind)
        self.sock.setblocking(False)
        self.peers: list[Address] = []
        self.sent = self.received = 0
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
        """Set every rank's address (index = rank)."""
        self.peers = [(h, int(p)) for h, p in peers]

    def send(self, dst: int, datagram: bytes) -> None:
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
        """Every datagram that arrives within timeout_s (at least those already queued)."""
        out: list[bytes] = []
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout_s))
        while ready:
            try:
                out.append(self.sock.recv(65536))
            except BlockingIOError:
                break
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
                         seed: int = 0, prefix: str = STORE_PREFIX) -> UdpTransport:  # fmt: skip
    """This rank's transport, connected to every rank's through the store."""
    transport = UdpTransport(rank, impairment=impairment, seed=seed)
    transport.connect(addresses_from_store(store, rank, world, transport.address, prefix=prefix))
    return transport


def addresses_from_store(store, rank: int, world: int, address: Address,
                         timeout_s: float = 60.0, prefix: str = STORE_PREFIX
                         ) -> list[Address]:  # fmt: skip
    """Publish our address in a torch.distributed store and read every rank's."""
    from datetime import timedelta

    store.set(f"{prefix}{rank}", f"{address[0]}:{address[1]}")
    store.set_timeout(timedelta(seconds=timeout_s))
    out = []
    for r in range(world):
        host, port = store.get(f"{prefix}{r}").decode().rsplit(":", 1)
        out.append((host, int(port)))
    return out
