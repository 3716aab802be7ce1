"""The `board` backend against the virtual board: the Verilated shell of a board (host
adapter, crossings, NIC core) on two Linux interfaces, its host port cabled to a host's
namespace and its network port on the bridge of the namespace cluster. The host drives
it exactly as it would a board on a cable (host/board_nic.py). Needs root, as every
namespace test; fails with the fix elsewhere unless OPTIREDUCE_NO_NETNS=1."""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from optireduce import host_port, simulate_allreduce
from optireduce.experiments.bench_cosim import LIVE_PARAMS, inputs
from optireduce.experiments.board_cluster import run_board_cluster
from optireduce.experiments.netns import BOARD_HOST_IF, NetnsCluster, enter
from optireduce.host.model.nic_model import EXP_COUNTERS
from optireduce.params import NicParams
from optireduce.sim.cosim_build import board_harness_path
from optireduce.sim.replay import COUNTERS
from optireduce.ubt import DEFAULT_ADDRESSING
from tests.test_protocol import LUA_PATH, tshark_or_fail

# the virtual board's first Verilator build takes 1-2 min alone, over 10 beside the suite
pytestmark = pytest.mark.timeout(1800)


def _start_in_namespace(ns: str, fn, *args):
    """fn(*args) in a process on namespace ns; (process, queue of its outcome)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def run():
        enter(ns)
        try:
            q.put(("ok", fn(*args)))
        except Exception as e:
            q.put(("error", f"{type(e).__name__}: {e}"))

    proc = ctx.Process(target=run, daemon=True)
    proc.start()
    return proc, q


def _outcome(proc, q):
    try:
        return q.get(timeout=60)
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def _in_namespace(ns: str, fn, *args):
    """fn(*args) in a process on namespace ns; its return value (or its exception's text)."""
    return _outcome(*_start_in_namespace(ns, fn, *args))


def _detect() -> list[dict]:
    from optireduce.host.board_nic import detect

    return [dict(ifname=b.ifname, version=b.version, **b.params) for b in detect([BOARD_HOST_IF])]


def _read_one(name: str) -> int:
    from optireduce.host.board_nic import HostPortLink, RegisterPort, _offsets

    link = HostPortLink(BOARD_HOST_IF)
    try:
        (v,) = RegisterPort(link).access([(_offsets(LIVE_PARAMS)[name], None)])
        return v
    finally:
        link.close()


def _read_until(regs, names: tuple[str, ...], ready, bound_s: float = 10.0) -> dict[str, int]:
    """The registers `names`, read again until ready(values) holds or bound_s has passed."""
    from optireduce.host.board_nic import _offsets

    off = _offsets(LIVE_PARAMS)
    deadline = time.monotonic() + bound_s
    while True:
        got = dict(zip(names, regs.access([(off[k], None) for k in names]), strict=True))
        if ready(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _short_start_taken() -> int:
    """A START of 3 words (46 bytes, padded to 60 on the way): the NIC's ops_started."""
    from optireduce.host.board_nic import HostPortLink, RegisterPort

    link = HostPortLink(BOARD_HOST_IF)
    try:
        link.send(host_port.chunk_frames(host_port.START, 0, np.ones(3, np.float32), 0))
        got = _read_until(RegisterPort(link), ("ops_started",), lambda g: g["ops_started"] > 0)
        return got["ops_started"]
    finally:
        link.close()


def _bad_frame_counted() -> dict[str, int]:
    """A frame of an unknown host-port version: the adapter's counters as the NIC reads them."""
    from optireduce.host.board_nic import HostPortLink, RegisterPort

    names = ("adapter_drop_bad_header", "adapter_drop_bad_length", "adapter_rx_frames")
    link = HostPortLink(BOARD_HOST_IF)
    try:
        start = host_port.chunk_frames(host_port.START, 1, np.ones(8, np.float32), 0)[0]
        link.send([start[:14] + b"\x09" + start[15:]])
        return _read_until(RegisterPort(link), names, lambda g: g["adapter_drop_bad_header"] > 0)
    finally:
        link.close()


def _silent_register_read() -> float:
    from optireduce.host.board_nic import BoardError, HostPortLink, RegisterPort

    link = HostPortLink(BOARD_HOST_IF)
    t0 = time.monotonic()
    try:
        RegisterPort(link, timeout_s=0.3, tries=2).access([(0, None)])
    except BoardError as e:
        assert "no answer from a NIC on brd0" in str(e) and "board program" in str(e)
        return time.monotonic() - t0
    finally:
        link.close()
    raise AssertionError("a register read with nothing on the cable returned")


def _send_from_board(frames: list[bytes]) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind(("hp", 0))
    for f in frames:
        s.send(f)
    s.close()


def _receive_junk(ready) -> dict:
    """Frames on the host link until three have been judged (or 10 s): taken and drops."""
    from optireduce.host.board_nic import HostPortLink

    link = HostPortLink(BOARD_HOST_IF)
    try:
        ready.set()
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) + sum(link.drops.values()) < 3 and time.monotonic() < deadline:
            got += link.recv(0.2)
        return {"frames": len(got), **link.drops}
    finally:
        link.close()


def test_detect_finds_the_virtual_board_and_bad_answers_are_errors_or_drops(tmp_path, netns_ready):
    exe = board_harness_path(LIVE_PARAMS)
    with NetnsCluster(2, boards=(0,)) as c:
        board = c.start_board(0, str(exe))
        found = _in_namespace(c.ns[0], _detect)
        assert found == ("ok", [{
            "ifname": "brd0", "version": 0x10004, "p": LIVE_PARAMS.p, "b": LIVE_PARAMS.b,
            "c": LIVE_PARAMS.c, "n_max": LIVE_PARAMS.n_max, "lanes": LIVE_PARAMS.lanes,
            "ops_in_flight": LIVE_PARAMS.ops_in_flight, "w_wire": LIVE_PARAMS.w_wire,
            "tick_bits": LIVE_PARAMS.tick_bits, "job_id": LIVE_PARAMS.job_id,
            "udp_port": LIVE_PARAMS.udp_port, "estimator": 0}])  # fmt: skip
        # one register read: its 42-byte frame and the reply are padded to Ethernet's
        # least length on the way, as on a wire, and taken
        assert _in_namespace(c.ns[0], _read_one, "param_c") == ("ok", LIVE_PARAMS.c)
        # so is a START of 3 words: the op starts
        assert _in_namespace(c.ns[0], _short_start_taken) == ("ok", 1)
        # a bad frame is a drop the adapter counts, and its register says so; since
        # loading: the START and the register reads of _read_one, _short_start_taken and
        # this one's first (each REG frame counts before its reads are answered)
        status, got = _in_namespace(c.ns[0], _bad_frame_counted)
        assert status == "ok" and got["adapter_drop_bad_header"] == 1, got
        assert got["adapter_drop_bad_length"] == 0 and got["adapter_rx_frames"] >= 4, got
        # a board with nothing on its host port: a clear error within the bound
        board.terminate()
        board.wait(timeout=10)
        status, waited = _in_namespace(c.ns[0], _silent_register_read)
        assert status == "ok" and 0.6 <= waited < 5.0, waited  # 2 tries x 0.3 s, and load
        # frames on the host link that are not the NIC's are counted, not taken: one
        # from another source, one with a bad header, one good RESULT fragment's worth
        nic_to_host = host_port.HOST_MAC + host_port.NIC_MAC + b"\x88\xb5"
        stranger = host_port.HOST_MAC + bytes.fromhex("02aabbccddee") + b"\x88\xb5"
        # a 4-word RESULT is 50 bytes: on a wire it comes padded to 60
        good = host_port.chunk_frames(host_port.RESULT, 0, np.ones(4, np.float32), 0)[0]
        good += bytes(host_port.ETH_MIN - len(good))
        ready = mp.get_context("fork").Event()
        receiver = _start_in_namespace(c.ns[0], _receive_junk, ready)
        assert ready.wait(60)  # its socket is open: nothing sent before is lost
        sent = _in_namespace(c.boards[0], _send_from_board, [
            stranger + good[14:], nic_to_host + b"\x07" + good[15:], good])  # fmt: skip
        assert sent == ("ok", None)
        assert _outcome(*receiver) == ("ok", {"frames": 1, "not_from_nic": 1, "malformed": 1})


def _check_against_model(run, xs, boards) -> None:
    want, st = simulate_allreduce(xs, params=LIVE_PARAMS, calibrate=False)
    for r in range(len(xs)):
        np.testing.assert_array_equal(run.outs[r].view(np.uint32), want[r].view(np.uint32))
    for b in boards:
        got = run.counters[b]
        assert {k: got[k] for k in COUNTERS} == {k: st.counters[b][k] for k in COUNTERS}
        assert {k: got[k] for k in EXP_COUNTERS} == {k: st.exp_counters[b][k]
                                                     for k in EXP_COUNTERS}  # fmt: skip
        assert got["host_not_from_nic"] == got["host_malformed"] == got["host_lost_results"] == 0
        # the host adapter dropped nothing, and took and sent at least a frame per op
        assert all(
            got[f"adapter_{k}"] == 0
            for k in host_port.ADAPTER_COUNTERS
            if k.startswith("drop_") or k in ("truncated_ops", "bad_records")
        ), got
        assert got["adapter_rx_frames"] >= 6 and got["adapter_tx_frames"] >= 12, got
        fig = run.boards[b]
        assert fig["ops_started"] == fig["ops_done"] == 6 and fig["cycles"] > 0
    ops = len(want[0]) // LIVE_PARAMS.c + 1
    for stats in run.stats:
        assert len(stats) == ops
        assert all(s["phase1_reason"] == s["phase2_reason"] == "complete" for s in stats)


def _dissect(exe: str, pcap, tmp, *fields: str) -> list[list[str]]:
    """tshark with the project's dissectors: one row of `fields` per frame."""
    env = dict(os.environ, WIRESHARK_CONFIG_DIR=str(tmp / "wsconf"))  # no personal prefs
    (tmp / "wsconf").mkdir(exist_ok=True)
    cmd = [exe, "-n", "-X", f"lua_script:{LUA_PATH}", "-r", str(pcap), "-T", "fields",
           *(a for f in fields for a in ("-e", f))]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_one_virtual_board_among_native_ranks_gives_the_models_bits(tmp_path, netns_ready):
    exe = tshark_or_fail()
    xs = inputs(3, 1500, 11)  # 6 ops of at most c = 256, the last one partial
    run = run_board_cluster(LIVE_PARAMS, xs, boards=(1,), tmp=tmp_path, timeout_s=300)
    assert run.backends == ["native", "board", "native"]
    _check_against_model(run, xs, (1,))
    # Wireshark reads both cables of the board from its capture. Host port: the NIC's
    # frames come from NIC_MAC; per op one START in, one RESULT and one STATS out
    # (c = 256 words: one fragment each way), every REG request answered.
    fig = run.boards[1]
    rows = _dissect(exe, tmp_path / "board1-host.pcap", tmp_path, "eth.src", "orhost.kind",
                    "orhost.op_id", "orhost.n")  # fmt: skip
    assert len(rows) == fig["host_rx"] + fig["host_tx"]
    nic = host_port.NIC_MAC.hex(":")
    ins = collections.Counter(k for src, k, *_ in rows if src != nic)
    outs = collections.Counter(k for src, k, *_ in rows if src == nic)
    kind = {v: str(k) for k, v in host_port.KINDS.items()}
    assert ins[kind["start"]] == outs[kind["result"]] == outs[kind["stats"]] == 6
    assert ins[kind["reg"]] == outs[kind["reg"]] >= 3  # identify, configure, counters
    starts = [(int(op), int(n)) for src, k, op, n in rows if k == kind["start"]]
    assert starts == [(op, min(256, 1500 - 256 * op)) for op in range(6)]
    # Network port: every frame is UBT; what the board sent and took, by type, is what
    # its counters say
    rows = _dissect(exe, tmp_path / "board1-net.pcap", tmp_path, "eth.src", "ubt.msg_type",
                    "ubt.sender")  # fmt: skip
    assert len(rows) == fig["net_rx"] + fig["net_tx"]
    own = DEFAULT_ADDRESSING.mac_str(1)
    sent = collections.Counter(t for src, t, _ in rows if src == own)
    took = collections.Counter(t for src, t, _ in rows if src != own)
    c = run.counters[1]
    assert (sent["1"], sent["2"]) == (c["tx_scatter"], c["tx_gather"])
    assert (took["1"], took["2"]) == (c["rx_scatter"], c["rx_gather"])
    assert {snd for src, _, snd in rows if src == own} == {"1"}


def test_every_rank_a_virtual_board(tmp_path, netns_ready):
    xs = inputs(3, 1500, 12)
    run = run_board_cluster(LIVE_PARAMS, xs, boards=(0, 1, 2), tmp=tmp_path, timeout_s=300)
    assert run.backends == ["board"] * 3
    _check_against_model(run, xs, (0, 1, 2))


def test_an_older_bitstream_is_refused_with_how_to_update_it():
    from types import SimpleNamespace

    from optireduce.host.board_nic import IDENT, NIC_TYPE, BoardError, identify

    class Regs:  # a NIC answering every register read; its version is `version`
        link = SimpleNamespace(ifname="eth7")

        def __init__(self, version: int) -> None:
            self.version = version

        def access(self, accesses):
            values = {"type": NIC_TYPE, "version": self.version}
            return [values.get(name, 5) for name in IDENT[: len(accesses)]]

    for old, shown in ((0x0001_0003, "1.3"), (0x0000_0009, "0.9"), (0x0002_0000, "2.0")):
        with pytest.raises(BoardError, match=rf"eth7 has register block version {shown};"
                           r" this host needs 1\.4 .* board program"):  # fmt: skip
            identify(Regs(old))
    info = identify(Regs(0x0001_0004))
    assert info.version == 0x0001_0004 and info.params["c"] == 5
    assert identify(Regs(0x0001_0007)).version == 0x0001_0007  # a later 1.x


def test_without_the_variable_the_board_is_not_tried(monkeypatch, caplog):
    from optireduce.host import driver
    from optireduce.host.transport import UdpTransport

    monkeypatch.delenv("OPTIREDUCE_BOARD_IFNAME", raising=False)
    tr = [UdpTransport(r, key=None) for r in range(2)]
    for t in tr:
        t.connect([u.address for u in tr])
    with caplog.at_level("INFO", logger="optireduce"):
        nic = driver.select_nic(LIVE_PARAMS, 0, 2, transport=tr[0], agree=lambda e: e,
                                prefer=("board", "software"))  # fmt: skip
    try:
        assert nic.backend == "software"
        lines = [r.getMessage() for r in caplog.records if r.name == "optireduce"]
        assert len(lines) == 1 and "board: OPTIREDUCE_BOARD_IFNAME is not set" in lines[0]
    finally:
        nic.close()
        tr[1].close()


def test_a_named_interface_that_does_not_exist_stops_the_rank(monkeypatch):
    from optireduce.host import driver
    from optireduce.host.board_nic import BoardError
    from optireduce.host.transport import UdpTransport

    monkeypatch.setenv("OPTIREDUCE_BOARD_IFNAME", "nosuch0")
    t, t2 = UdpTransport(0, key=None), UdpTransport(0, key=None)
    t.connect([t.address, ("127.0.0.1", 9)])
    try:
        with pytest.raises(BoardError, match="needs every rank at the NIC's build addressing"):
            driver.select_nic(LIVE_PARAMS, 0, 2, transport=t, agree=lambda e: e,
                              prefer=("board", "software"))  # fmt: skip
        t2.connect([("198.18.0.1", LIVE_PARAMS.udp_port), ("198.18.0.2", LIVE_PARAMS.udp_port)])
        with pytest.raises(BoardError, match="cannot use interface 'nosuch0'"):
            driver.select_nic(LIVE_PARAMS, 0, 2, transport=t2, agree=lambda e: e,
                              prefer=("board", "software"))  # fmt: skip
    finally:
        t.close()
        t2.close()


def test_board_detect_on_the_command_line_lists_the_virtual_board(netns_ready):
    exe = board_harness_path(LIVE_PARAMS)
    cli = [sys.executable, "-m", "optireduce.cli"]
    with NetnsCluster(2, boards=(0,)) as c:
        c.start_board(0, str(exe))
        r = subprocess.run([*c.exec_prefix(c.ns[0]), *cli, "board", "detect", "--json"],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr
        (found,) = json.loads(r.stdout)
        assert found["ifname"] == BOARD_HOST_IF and found["params"]["c"] == LIVE_PARAMS.c
        # the host's other interface (eth0 on the bridge) has no NIC on it: not listed
        r = subprocess.run([*c.exec_prefix(c.ns[1]), *cli, "board", "detect"],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert r.returncode == 1 and "no optireduce NIC answered on eth0" in r.stdout


def test_board_program_without_a_cable_fails_at_once_saying_what_it_looked_for(tmp_path):
    bit = tmp_path / "top.bit"
    bit.write_bytes(b"\xff" * 64)
    cli = [sys.executable, "-m", "optireduce.cli", "board", "program"]
    t0 = time.monotonic()
    r = subprocess.run([*cli, "--board", "colorlight", "--bitstream", str(bit)],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert time.monotonic() - t0 < 30
    assert r.returncode == 2
    assert "looked for an FT232H JTAG cable (USB 0403:6014)" in r.stderr
    assert "unable to open ftdi device" in r.stderr  # openFPGALoader's own words
    r = subprocess.run([*cli, "--board", "butterstick", "--bitstream", str(bit)],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2 and "writes the flash only: add --flash" in r.stderr
    r = subprocess.run([*cli, "--board", "ecpix5", "--bitstream", str(tmp_path / "none.bit")],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2 and "no bitstream at" in r.stderr


def test_batched_frames_on_a_packet_socket_equal_the_python_path(monkeypatch):
    """The native sendmmsg / recvmmsg path and the one-frame-per-call Python path move the
    same frames, in order, on a packet socket (loopback: every frame comes back once)."""
    import optireduce.host.board_nic as bn

    assert bn._engine is not None, "the native engine did not load: make install"
    rng = np.random.default_rng(5)
    frames = [host_port.build(host_port.HostFrame(host_port.RESULT, op, 0, 300, 0,
                                                  rng.bytes(4 * int(rng.integers(0, 300)))),
                              to_nic=False) for op in range(150)]  # fmt: skip
    got = {}
    for native in (True, False):
        monkeypatch.setattr(bn, "_engine", bn._engine if native else None)
        tx, rx = bn.HostPortLink("lo"), bn.HostPortLink("lo")
        try:
            assert tx.native == rx.native == native
            tx.send(frames)
            seen: list = []
            deadline = time.monotonic() + 10
            while len(seen) < len(frames) and time.monotonic() < deadline:
                seen += rx.recv(0.5)
            got[native] = seen
        finally:
            tx.close()
            rx.close()
    want = [host_port.parse(f) for f in frames]
    assert got[True] == got[False] == want


def test_a_board_built_for_another_job_is_named_by_what_differs():
    """The build parameters the NIC reports (its job id and port too: they are the
    build's, read only) are compared with the job's; every difference is named."""
    from types import SimpleNamespace

    from optireduce.host.board_nic import IDENT, NIC_TYPE, build_mismatch, identify
    from optireduce.hw.csr import VERSION

    p = NicParams(p=16, b=64, c=256, n_max=8, tick_bits=24, t_b_us=5000)
    board = {"type": NIC_TYPE, "version": VERSION, "param_p": 16, "param_b": 64,
             "param_c": 256, "param_n_max": 8, "param_lanes": 1,
             "param_ops_in_flight": p.ops_in_flight, "param_w_wire": 32,
             "param_tick_bits": 24, "job_id": p.job_id, "udp_port": p.udp_port,
             "estimator": 0}  # fmt: skip

    class Regs:
        link = SimpleNamespace(ifname="eth7")

        def __init__(self, values: dict) -> None:
            self.values = values

        def access(self, accesses):
            return [self.values[name] for name in IDENT[: len(accesses)]]

    assert build_mismatch(identify(Regs(board)), p) == {}
    other = board | {"job_id": 9, "param_tick_bits": 32, "estimator": 1}
    assert build_mismatch(identify(Regs(other)), p) == {
        "job_id": (9, p.job_id), "tick_bits": (32, 24), "estimator": (1, 0)}  # fmt: skip
    assert build_mismatch(identify(Regs(other)), p.replace(estimator="plain")) == {
        "job_id": (9, p.job_id), "tick_bits": (32, 24)}  # fmt: skip
