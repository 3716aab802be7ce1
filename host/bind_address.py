"""Which local IPv4 address and port a transport binds, from the job's environment.

The address: the interface named by OPTIREDUCE_IFNAME (else GLOO_SOCKET_IFNAME, its first
name), else the one the route to the rendezvous (MASTER_ADDR) leaves by, else loopback
(no rendezvous: a one-host run). Loopback only comes out when the rendezvous itself is on
this host's loopback, so a multi-host job never publishes 127.0.0.1 to its peers.

The port: OPTIREDUCE_PORT_RANGE=lo-hi, or OPTIREDUCE_PORT=P (the range P to
P + 2 x LOCAL_WORLD_SIZE - 1: every process opens two sockets, data and control); each
socket takes the first free port of the range from 2 x LOCAL_RANK on (so the local
rank k's data socket gets lo + 2k when it is free). Neither set: the kernel picks one.

IPv4 only: the native engine and the wire addressing are IPv4. An IPv6-only rendezvous or
interface fails here with an error that says what to set.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping, Sequence

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: the interface's IPv4 address
IFNAME_VARS = ("OPTIREDUCE_IFNAME", "GLOO_SOCKET_IFNAME")


class BindError(OSError):
    """No usable local address or port; the message says what to set."""


def interface_ipv4(name: str) -> str:
    """The IPv4 address of the interface `name`."""
    if not name or len(name) >= 16:
        raise BindError(f"{name!r} is not an interface name")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            got = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError as e:
            here = ", ".join(n for _, n in socket.if_nameindex())
            if e.errno == errno.ENODEV:
                raise BindError(f"interface {name!r} does not exist here (have: {here})") from e
            if e.errno == errno.EADDRNOTAVAIL:
                raise BindError(
                    f"interface {name!r} has no IPv4 address; OptiReduce runs over IPv4 "
                    "(IPv6 is not supported): give it one or name another interface"
                ) from e
            raise
    return socket.inet_ntoa(got[20:24])


def route_source(host: str) -> str:
    """The local IPv4 address the kernel would send from to reach `host` (no packet is
    sent: connect() on a UDP socket only picks the route)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as e:
        try:
            socket.getaddrinfo(host, None, socket.AF_INET6, socket.SOCK_DGRAM)
        except socket.gaierror:
            raise BindError(f"cannot resolve the rendezvous host {host!r}: {e}") from e
        raise BindError(
            f"the rendezvous host {host!r} has only an IPv6 address; OptiReduce runs over "
            "IPv4: set OPTIREDUCE_IFNAME to an interface with an IPv4 address"
        ) from e
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((infos[0][4][0], 9))
        except OSError as e:
            raise BindError(f"no route to the rendezvous host {host!r}: {e}") from e
        return s.getsockname()[0]


def local_ipv4(env: Mapping[str, str] | None = None) -> str:
    """The address this process's transports bind and publish (see the module doc)."""
    env = os.environ if env is None else env
    for var in IFNAME_VARS:
        names = [n.strip() for n in env.get(var, "").split(",") if n.strip()]
        if names:
            try:
                return interface_ipv4(names[0])
            except BindError as e:
                raise BindError(f"{var}={env[var]}: {e}") from e
    master = env.get("MASTER_ADDR", "").strip()
    if not master:
        return "127.0.0.1"
    return route_source(master)


def port_range(env: Mapping[str, str] | None = None) -> list[int] | None:
    """The ports a socket may take, in the order tried; None: any (the kernel picks).
    The search starts at 2 x LOCAL_RANK into the range (wrapping), so that every process
    of a host gets the same ports run after run when they are free."""
    env = os.environ if env is None else env
    spec = env.get("OPTIREDUCE_PORT_RANGE", "").strip()
    port = env.get("OPTIREDUCE_PORT", "").strip()
    per_host = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    if spec:
        lo, sep, hi = spec.partition("-")
        try:
            r = range(int(lo), int(hi) + 1) if sep else None
        except ValueError:
            r = None
        if r is None or not 1 <= r.start <= r.stop - 1 <= 65535:
            raise BindError(f"OPTIREDUCE_PORT_RANGE={spec!r}: want lo-hi, 1 <= lo <= hi <= 65535")
    elif port:
        if not port.isdigit() or not 1 <= int(port) <= 65535 - 2 * per_host + 1:
            raise BindError(f"OPTIREDUCE_PORT={port!r}: want a port number, 1..65535")
        r = range(int(port), int(port) + 2 * per_host)
    else:
        return None
    start = 2 * int(env.get("LOCAL_RANK", "0") or 0) % len(r)
    return [*r[start:], *r[:start]]


def check_ipv4(host: str) -> None:
    """A clear error for an IPv6 address (the transports are IPv4)."""
    if _version(host) == 6:
        raise BindError(f"cannot bind {host}: OptiReduce runs over IPv4 (IPv6 is not supported)")


def bind_udp(sock: socket.socket, host: str, ports: Sequence[int] | None) -> None:
    """Bind `sock` to host and the first free port of `ports` (None: any port)."""
    check_ipv4(host)
    if ports is None:
        sock.bind((host, 0))
        return
    for port in ports:
        try:
            sock.bind((host, port))
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise BindError(f"cannot bind {host}:{port}: {e}") from e
    raise BindError(
        f"every port of {min(ports)}-{max(ports)} on {host} is taken; each process needs "
        "two (data and control): widen OPTIREDUCE_PORT_RANGE"
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None  # a name: the kernel resolves it (IPv4, the socket's family)
