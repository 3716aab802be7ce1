"""The UDP transport's address choice, port range and admission (host/transport.py,
host/bind_address.py). Loopback only; the cross-host paths run in tests/test_multihost.py."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from optireduce import ubt
from optireduce.host.bind_address import BindError, bind_udp, interface_ipv4, local_ipv4, port_range
from optireduce.host.reliable import HEADER, MAGIC, ReliableEndpoint
from optireduce.host.transport import UdpTransport, addresses_from_store


def _ip_json_ipv4() -> dict[str, str]:
    """Interface -> first IPv4 address, as iproute2 reports it (not our ioctl)."""
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    ifs = json.loads(out.stdout)
    return {i["ifname"]: i["addr_info"][0]["local"] for i in ifs if i["addr_info"]}


def test_interface_address_is_the_one_iproute2_reports():
    for name, addr in _ip_json_ipv4().items():
        assert interface_ipv4(name) == addr
        assert local_ipv4({"OPTIREDUCE_IFNAME": name}) == addr
        # GLOO_SOCKET_IFNAME when ours is unset: its first name
        assert local_ipv4({"GLOO_SOCKET_IFNAME": f"{name},lo"}) == addr


def test_address_follows_the_rendezvous():
    assert local_ipv4({}) == "127.0.0.1"  # no rendezvous: one host
    assert local_ipv4({"MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert local_ipv4({"MASTER_ADDR": "localhost"}) == "127.0.0.1"
    # the interface named wins over the route
    ifs = _ip_json_ipv4()
    other = next((n for n in ifs if n != "lo"), None)
    if other is not None:
        env = {"MASTER_ADDR": "127.0.0.1", "OPTIREDUCE_IFNAME": other}
        assert local_ipv4(env) == ifs[other]
        # an address of this host routes through loopback but is itself the source
        assert local_ipv4({"MASTER_ADDR": ifs[other]}) == ifs[other]


def test_bad_names_and_ipv6_fail_with_what_to_set():
    with pytest.raises(BindError, match=r"OPTIREDUCE_IFNAME=nosuch0: .*does not exist.*have: "):
        local_ipv4({"OPTIREDUCE_IFNAME": "nosuch0"})
    with pytest.raises(BindError, match=r"only an IPv6 address.*OPTIREDUCE_IFNAME"):
        local_ipv4({"MASTER_ADDR": "::1"})
    with pytest.raises(BindError, match="IPv4"):
        UdpTransport(0, bind=("::1", 0))
    with pytest.raises(BindError, match="cannot resolve"):
        local_ipv4({"MASTER_ADDR": "no-such-host.invalid"})


def test_port_range_from_the_environment():
    assert port_range({}) is None
    assert port_range({"OPTIREDUCE_PORT_RANGE": "40000-40007"}) == list(range(40000, 40008))
    # one port given: two sockets (data, control) per process on this host
    two = {"OPTIREDUCE_PORT": "40000", "LOCAL_WORLD_SIZE": "2"}
    assert port_range(two) == [40000, 40001, 40002, 40003]
    assert port_range({"OPTIREDUCE_PORT": "40000"}) == [40000, 40001]
    # local rank k starts at 2k (wrapping): the same ports for it run after run
    assert port_range({**two, "LOCAL_RANK": "1"}) == [40002, 40003, 40000, 40001]
    assert port_range({"OPTIREDUCE_PORT_RANGE": "5-7", "LOCAL_RANK": "2"}) == [6, 7, 5]
    for bad in ("40000", "x-y", "5-4", "0-10", "1-70000"):
        with pytest.raises(BindError, match="OPTIREDUCE_PORT_RANGE"):
            port_range({"OPTIREDUCE_PORT_RANGE": bad})
    with pytest.raises(BindError, match="OPTIREDUCE_PORT="):
        port_range({"OPTIREDUCE_PORT": "http"})


def _two_free_ports() -> tuple[socket.socket, int]:
    """A socket holding port p, with p + 1 free (as far as one can tell)."""
    for _ in range(50):
        a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        a.bind(("127.0.0.1", 0))
        p = a.getsockname()[1]
        if p < 65535:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
                try:
                    b.bind(("127.0.0.1", p + 1))
                    return a, p
                except OSError:
                    pass
        a.close()
    pytest.fail("no two adjacent free UDP ports on loopback")


def test_sockets_take_the_first_free_port_of_the_range():
    held, p = _two_free_ports()
    with held, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        bind_udp(s, "127.0.0.1", range(p, p + 2))
        assert s.getsockname() == ("127.0.0.1", p + 1)
        taken = rf"every port of {p}-{p + 1} .*taken"
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as t,
            pytest.raises(BindError, match=taken),
        ):
            bind_udp(t, "127.0.0.1", range(p, p + 2))


def _ubt_like(sender: int, job: int = 1) -> bytes:
    h = bytearray(ubt.HEADER_LEN)
    h[0:8] = bytes([1, ubt.MSG_SCATTER, 0, 0, job >> 8, job & 0xFF, sender >> 8, sender & 0xFF])
    return bytes(h)


def test_admission_drops_strangers_and_spoofed_senders():
    a = UdpTransport(0, bind=("127.0.0.1", 0))
    b = UdpTransport(1, bind=("127.0.0.1", 0))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    try:
        for t in (a, b):
            t.connect([a.address, b.address])
        for d in (_ubt_like(1), b"x", _ubt_like(0)):
            stranger.sendto(d, a.address)  # not a member, whatever it says
        b.sock.sendto(_ubt_like(3), a.address)  # a member, naming another sender
        b.sock.sendto(_ubt_like(0), a.address)  # ... naming the receiver itself
        b.sock.sendto(_ubt_like(1, job=77), a.address)  # admitted: the job is the model's
        b.sock.sendto(b"short", a.address)  # admitted: too short to name anyone (parser drops)
        got = []
        for _ in range(20):
            got += a.recv(0.05)
            if len(got) == 2:
                break
        assert got == [_ubt_like(1, job=77), b"short"]
        assert a.counters() == {"tx_datagrams": 0, "rx_datagrams": 2, "not_member": 3,
                                "wrong_sender": 2, "bad_tag": 0}  # fmt: skip
        # the reliable layer's header names its sender elsewhere; UBT frames keep theirs
        ReliableEndpoint(a)
        rel = HEADER.pack(MAGIC, 0, 1, 1, 0, 0, 0, 0, 1, 0)
        b.sock.sendto(rel, a.address)
        b.sock.sendto(HEADER.pack(MAGIC, 0, 1, 0, 0, 0, 0, 0, 1, 0), a.address)
        b.sock.sendto(_ubt_like(2), a.address)
        got = []
        for _ in range(20):
            got += a.recv(0.05)
            if got:
                break
        assert got == [rel] and a.wrong_sender == 4
    finally:
        for t in (a, b):
            t.close()
        stranger.close()


def test_a_table_with_one_address_twice_is_refused():
    with UdpTransport(0, bind=("127.0.0.1", 0)) as a, pytest.raises(ValueError, match="same"):
        a.connect([a.address, a.address])


def test_loopback_next_to_routable_addresses_is_refused():
    from torch.distributed import HashStore

    store = HashStore()
    store.set("t/1", "10.77.0.2:4000")
    with pytest.raises(BindError, match=r"ranks \[0\] publish loopback"):
        addresses_from_store(store, 0, 2, ("127.0.0.1", 4000), timeout_s=5, prefix="t/")
    store.set("u/1", "127.0.0.1:4001")
    store.set("u/key/1", "none")  # rank 1's key's fingerprint: unkeyed, as rank 0
    got = addresses_from_store(store, 0, 2, ("127.0.0.1", 4000), timeout_s=5, prefix="u/")
    assert got == [("127.0.0.1", 4000), ("127.0.0.1", 4001)]


def test_default_bind_uses_the_environment(monkeypatch):
    held, p = _two_free_ports()
    with held:
        monkeypatch.setenv("OPTIREDUCE_IFNAME", "lo")
        monkeypatch.setenv("OPTIREDUCE_PORT_RANGE", f"{p}-{p + 1}")
        with UdpTransport(0) as t:
            assert t.address == ("127.0.0.1", p + 1)


def test_a_native_nic_without_a_transport_binds_the_same_way(monkeypatch):
    from optireduce.host.native.nic import NativeNic
    from optireduce.params import NicParams

    held, p = _two_free_ports()
    with held:
        monkeypatch.setenv("OPTIREDUCE_IFNAME", "lo")
        monkeypatch.setenv("OPTIREDUCE_PORT_RANGE", f"{p}-{p + 1}")
        with NativeNic(NicParams(), 0, 2, agree=list) as nic:
            assert nic.address == ("127.0.0.1", p + 1)
