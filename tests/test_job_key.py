"""Keyed jobs (host/job_key.py, docs/security.md): every datagram carries a tag, BLAKE2b
keyed with the job's key over its UBT header; a member's datagram without the right tag is
dropped and counted (bad_tag) by the Python and the native transports alike.

The reference for the tag is Python's hashlib (ubt.header_tag); the native transport's own
BLAKE2b must give the same bytes, and ranks of both backends train together in a keyed job.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.driver import SoftwareNic
from optireduce.host.job_key import (
    KEY_FILE_VAR,
    JobKeyError,
    check_fingerprints,
    fingerprint,
    job_key,
)
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.host.native import _engine
from optireduce.host.native.nic import NativeNic
from optireduce.host.transport import UdpTransport, addresses_from_store
from optireduce.params import NicParams
from tests.native.test_live_native import ThreadAgreement, inputs


def _file_key(data: bytes) -> bytes:
    """The key a key file's bytes give (docs/security.md), computed here from the definition."""
    return hashlib.blake2b(data, digest_size=32, person=b"optireduce-key").digest()


def test_the_native_tag_is_keyed_blake2b_as_hashlib_computes_it():
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 8, 31, 32, 33, 1056):
        for _ in range(25):
            key, d = rng.bytes(ubt.KEY_LEN), rng.bytes(n)
            want = hashlib.blake2b(d[: ubt.HEADER_LEN], key=key, digest_size=8).digest()
            assert ubt.header_tag(key, d) == want
            assert _engine.header_tag(key, d) == want
    with pytest.raises(ValueError, match="32 bytes"):
        _engine.header_tag(b"short", b"")


def test_the_key_comes_from_a_file_every_host_holds(tmp_path):
    assert job_key({}) is None
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    a.write_bytes(bytes(range(32)))
    b.write_bytes(bytes(range(1, 33)))
    ka, kb = job_key({KEY_FILE_VAR: str(a)}), job_key({KEY_FILE_VAR: str(b)})
    assert len(ka) == ubt.KEY_LEN and ka != kb
    assert ka == _file_key(bytes(range(32)))
    assert fingerprint(ka) != fingerprint(kb) and fingerprint(None) == "none"
    with pytest.raises(JobKeyError, match="cannot read it"):
        job_key({KEY_FILE_VAR: str(tmp_path / "missing")})
    (tmp_path / "short").write_bytes(b"x" * 15)
    with pytest.raises(JobKeyError, match="at least 16"):
        job_key({KEY_FILE_VAR: str(tmp_path / "short")})
    check_fingerprints([fingerprint(ka)] * 3, 1)
    with pytest.raises(JobKeyError, match=r"rank 0 has a key .* ranks \[2\] differ"):
        check_fingerprints([fingerprint(ka), fingerprint(ka), fingerprint(kb)], 0)
    with pytest.raises(JobKeyError, match=r"rank 1 has no key .* ranks \[0\] differ"):
        check_fingerprints([fingerprint(ka), "none"], 1)


def test_ranks_with_different_keys_fail_at_rendezvous():
    from torch.distributed import HashStore

    store = HashStore()

    def rank(r: int, key: bytes | None) -> str:
        try:
            addresses_from_store(store, r, 2, ("127.0.0.1", 1 + r), timeout_s=20, key=key)
        except JobKeyError as e:
            return str(e)
        return "no error"

    with ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(rank, (0, 1), (bytes(32), None)))
    assert errors[0].startswith("rank 0 has a key (OPTIREDUCE_KEY_FILE) and ranks [1] differ")
    assert errors[1].startswith("rank 1 has no key (OPTIREDUCE_KEY_FILE) and ranks [0] differ")


def _header(sender: int, job: int = 1) -> bytes:
    h = ubt.UbtHeader(1, ubt.MSG_SCATTER, 0, 0, job, sender, 5, 0, 2, 0, 0, 2, 2, 0)
    return h.pack() + bytes(8)


def test_the_python_transport_tags_what_it_sends_and_drops_what_is_not_tagged():
    key, other = bytes(range(32)), bytes(32)
    a = UdpTransport(0, bind=("127.0.0.1", 0), key=key)
    b = UdpTransport(1, bind=("127.0.0.1", 0), key=key)
    stranger = UdpTransport(0, bind=("127.0.0.1", 0), key=key)
    try:
        for t in (a, b):
            t.connect([a.address, b.address])
        d = _header(1)
        b.send(0, d)  # tagged by the transport
        flipped = bytearray(d + ubt.header_tag(key, d))
        flipped[9] ^= 1  # the header's op id
        payload = bytearray(d + ubt.header_tag(key, d))
        payload[ubt.HEADER_LEN] ^= 1  # the payload: the tag does not cover it
        for raw in (d, d + ubt.header_tag(other, d), bytes(flipped), b"short", bytes(payload)):
            b.sock.sendto(raw, a.address)
        stranger.sock.sendto(d + ubt.header_tag(key, d), a.address)  # right tag, no member
        b.sock.sendto(_header(0) + ubt.header_tag(key, _header(0)), a.address)  # rank 0?
        got = []
        for _ in range(40):
            got += a.recv(0.05)
            if len(got) == 2 and a.bad_tag == 4 and a.not_member == 1:
                break
        assert got == [d, bytes(payload[: -ubt.TAG_LEN])]
        assert a.counters() == {"tx_datagrams": 0, "rx_datagrams": 2, "not_member": 1,
                                "wrong_sender": 1, "bad_tag": 4}  # fmt: skip
        assert b.counters()["tx_datagrams"] == 1
    finally:
        for t in (a, b, stranger):
            t.close()


def test_native_and_python_ranks_train_together_in_a_keyed_job(tmp_path, monkeypatch):
    """Rank 0 on the Python model, ranks 1 and 2 on the native engine, every transport keyed
    from OPTIREDUCE_KEY_FILE: the results equal the model's bit for bit (each side accepts
    the other's tags), and untagged or wrongly tagged datagrams from a member are counted
    as bad_tag on both backends and change nothing."""
    path = tmp_path / "job.key"
    secret = os.urandom(32)
    path.write_bytes(secret)
    monkeypatch.setenv(KEY_FILE_VAR, str(path))
    world, n = 3, 40_000
    p = NicParams(t_b_us=5_000_000, t_c_min_us=5_000_000)
    xs = inputs(world, n, seed=11)
    trs = [UdpTransport(r, bind=("127.0.0.1", 0)) for r in range(world)]
    assert all(t.key == _file_key(secret) for t in trs)
    for t in trs:
        t.connect([u.address for u in trs])
    agreement = ThreadAgreement(world)
    nics = [SoftwareNic(p, 0, world, trs[0], agreement.rank(0))]
    nics += [NativeNic(p, r, world, trs[r], agreement.rank(r)) for r in (1, 2)]
    # a frame rank 2 could send to rank 0 or 1, but without its tag, then with another key's
    spoof = _header(2)
    try:
        with ThreadPoolExecutor(world) as pool:
            early = [pool.submit(nics[r].allreduce, xs[r]) for r in (0, 1)]
            time.sleep(0.3)
            for r in (0, 1):
                trs[2].sock.sendto(spoof, trs[r].address)
                trs[2].sock.sendto(spoof + ubt.header_tag(bytes(32), spoof), trs[r].address)
            late = pool.submit(nics[2].allreduce, xs[2])
            got = [f.result(timeout=120) for f in (*early, late)]
        counters = [nic.counters() for nic in nics]
    finally:
        for nic in nics:
            nic.close()
        for t in trs:
            t.close()
    want, _ = simulate_allreduce(xs, params=p, calibrate=False)
    for (out, stats), w in zip(got, want, strict=True):
        np.testing.assert_array_equal(out, w)
        assert all(s.phase1_reason == s.phase2_reason == "complete" for s in stats)
    assert [c["bad_tag"] for c in counters] == [2, 2, 0]
    for c in counters:
        assert c["not_member"] == c["wrong_sender"] == 0
        assert sum(c[k] for k in ubt.DROP_REASONS) == 0  # nothing of it reached a NIC


def test_an_unkeyed_transport_ignores_the_key_file_only_when_told(tmp_path, monkeypatch):
    path = tmp_path / "job.key"
    path.write_bytes(b"k" * 32)
    monkeypatch.setenv(KEY_FILE_VAR, str(path))
    with UdpTransport(0, bind=("127.0.0.1", 0)) as keyed, \
         UdpTransport(0, bind=("127.0.0.1", 0), key=None) as plain:  # fmt: skip
        assert keyed.key == _file_key(b"k" * 32) and plain.key is None
    with pytest.raises(ValueError, match="32 bytes"):
        UdpTransport(0, bind=("127.0.0.1", 0), key=b"short")


def test_the_co_simulated_nic_refuses_a_keyed_job_and_the_driver_falls_back(caplog):
    """The Verilated harness sends on the socket itself, untagged: in a keyed job select_nic
    passes it over, saying why, and takes the next backend."""
    import logging

    from optireduce.host.driver import select_nic

    tr = UdpTransport(0, bind=("127.0.0.1", 0), key=bytes(32))
    peer = UdpTransport(1, bind=("127.0.0.1", 0), key=bytes(32))
    try:
        tr.connect([tr.address, peer.address])
        with caplog.at_level(logging.INFO, logger="optireduce"):
            nic = select_nic(NicParams(), 0, 2, transport=tr, agree=lambda v: v,
                             prefer=("sim", "software"))  # fmt: skip
        assert nic.backend == "software"
        (line,) = [r.getMessage() for r in caplog.records if "using the" in r.getMessage()]
        assert line == ("optireduce rank 0: using the software NIC (sim: the gateware has no "
                        "tags: a keyed job (OPTIREDUCE_KEY_FILE) runs on the native or "
                        "software backend)")  # fmt: skip
        nic.close()
    finally:
        tr.close()
        peer.close()


def test_a_keyed_datagram_must_still_fit_one_udp_datagram():
    """The tag adds 8 bytes: a native transport for datagrams of up to 65 500 bytes (65 507
    is UDP's limit) is refused in a keyed job, not left to fail every full send."""
    with pytest.raises(ValueError, match="8-byte tag"):
        _engine.ReliableLive(0, 2, max_datagram=65_500, key=bytes(32))
    ok = _engine.ReliableLive(0, 2, max_datagram=65_499, key=bytes(32))
    ok.stop()
