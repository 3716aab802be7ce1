"""UBT v1 wire format: struct packer, scapy layer, receiver checks and the Wireshark dissector."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import checksum as scapy_checksum
from scapy.utils import wrpcap

from optireduce import ubt, ubt_lua
from optireduce.ubt_scapy import UBT, bind_port, scapy_frame, scapy_to_header, scapy_values

REPO = Path(__file__).resolve().parents[1]
LUA_PATH = REPO / "optireduce" / "ubt.lua"
PORT = ubt_lua.DEFAULT_PORT
SRC, DST = 3, 1
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def field_range(f: ubt.Field) -> tuple[int, int]:
    bits = ubt.field_bits(f)
    if ubt.field_signed(f):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


any_header = st.builds(ubt.UbtHeader, **{f.name: st.integers(*field_range(f)) for f in ubt.FIELDS})


@st.composite
def valid_frame(draw: st.DrawFn) -> tuple[ubt.UbtHeader, np.ndarray]:
    """A header parse_ubt accepts and its payload (short, so scapy stays fast)."""
    world = draw(st.integers(1, 0xFFFF))
    msg_type = draw(st.sampled_from(sorted(ubt.MSG_TYPES)))
    contributors = 0 if msg_type == ubt.MSG_SCATTER else draw(st.integers(1, world))
    count = draw(st.integers(0, 24))
    values = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count, max_size=count))
    h = ubt.UbtHeader(
        version=ubt.VERSION,
        msg_type=msg_type,
        flags=draw(st.sampled_from([0, ubt.FLAG_LAST])),
        exponent=draw(st.integers(-128, 127)),
        job_id=draw(st.integers(0, 0xFFFF)),
        sender=draw(st.integers(0, 0xFFFF)),
        op_id=draw(st.integers(0, 2**32 - 1)),
        pkt_index=draw(st.integers(0, 2**32 - 1)),
        count=count,
        contributors=contributors,
        t_c_us=draw(st.integers(1, 2**32 - 1)),
        op_len=draw(st.integers(0, 2**32 - 1)),
        world=world,
        reserved=0,
    )
    return h, np.array(values, dtype=np.int64)


def header(**changes: int) -> ubt.UbtHeader:
    base = ubt.UbtHeader(
        version=1, msg_type=ubt.MSG_SCATTER, flags=0, exponent=-7, job_id=1, sender=SRC,
        op_id=42, pkt_index=5, count=8, contributors=0, t_c_us=1500, op_len=16384, world=4,
        reserved=0,
    )  # fmt: skip
    return base._replace(**changes)


def frame(h: ubt.UbtHeader | None = None, values: np.ndarray | None = None, **kw: int) -> bytes:
    h = header() if h is None else h
    if values is None:
        values = np.arange(h.count, dtype=np.int64) * 1000 - 3000
    args = {"src": SRC, "dst": DST, "port": PORT, **kw}
    return ubt.build_frame(h, ubt.payload_bytes(values), **args)


def parse(data: bytes, **kw: int) -> ubt.ParsedFrame | str:
    args = {"port": PORT, "rank": DST, **kw}
    return ubt.parse_frame(data, **args)


# --- struct packer -------------------------------------------------------------------------


def test_header_layout() -> None:
    assert ubt.HEADER_LEN == 32 == ubt.HEADER.size
    assert ubt.UbtHeader._fields == tuple(f.name for f in ubt.FIELDS)
    off = 0
    for f in ubt.FIELDS:
        size = struct.calcsize("!" + f.fmt)
        assert off % size == 0, f"{f.name} at {off} is not {size}-byte aligned"
        assert ubt.FIELD_OFFSETS[f.name] == (off, size)
        assert ubt.field_bits(f) == 8 * size
        off += size
    assert off == ubt.HEADER_LEN


@FAST
@given(any_header)
def test_pack_unpack_round_trip(h: ubt.UbtHeader) -> None:
    data = h.pack()
    assert len(data) == ubt.HEADER_LEN
    assert ubt.UbtHeader.unpack(data) == h
    assert ubt.UbtHeader.unpack(b"\xaa" * 5 + data, offset=5) == h
    # field by field at its documented offset, network byte order
    for f in ubt.FIELDS:
        o, _size = ubt.FIELD_OFFSETS[f.name]
        assert struct.unpack_from("!" + f.fmt, data, o)[0] == getattr(h, f.name)


def test_pack_rejects_out_of_range() -> None:
    for f in ubt.FIELDS:
        lo, hi = field_range(f)
        for bad in (lo - 1, hi + 1):
            with pytest.raises(struct.error):
                header(**{f.name: bad}).pack()


def test_payload_bytes_big_endian() -> None:
    v = np.array([1, -1, 2**31 - 1, -(2**31)])
    b = ubt.payload_bytes(v)
    assert b == struct.pack("!4i", *v.tolist())
    assert ubt.payload_values(b).tolist() == v.tolist()


# --- scapy layer -----------------------------------------------------------------------------


def check_scapy_parse(data: bytes, h: ubt.UbtHeader, values: np.ndarray) -> None:
    pkt = Ether(data)
    assert pkt.haslayer(UBT), pkt.summary()
    layer = pkt[UBT]
    for f in ubt.FIELDS:
        assert int(getattr(layer, f.name)) == getattr(h, f.name), f.name
    assert list(layer.values) == values.tolist()
    assert scapy_to_header(pkt) == h
    assert scapy_values(pkt).tolist() == values.tolist()
    # IPv4 header checksum, checked by scapy's own code (not ubt.ipv4_checksum)
    assert scapy_checksum(raw(pkt[IP])[:20]) == 0
    rebuilt = pkt[IP].copy()
    del rebuilt.chksum
    assert IP(raw(rebuilt)).chksum == pkt[IP].chksum
    assert pkt[UDP].chksum == 0
    assert pkt[UDP].sport == pkt[UDP].dport == PORT


@FAST
@given(valid_frame())
def test_build_frame_scapy_round_trip(hv: tuple[ubt.UbtHeader, np.ndarray]) -> None:
    h, values = hv
    built = frame(h, values)
    check_scapy_parse(built, h, values)

    pkt = scapy_frame(h, values, src=SRC, dst=DST, port=PORT)
    sbytes = raw(pkt)
    again = Ether(sbytes)
    assert again[IP].chksum == Ether(built)[IP].chksum
    assert again[UDP].chksum == Ether(built)[UDP].chksum == 0
    assert sbytes == built

    parsed = parse(sbytes)
    assert isinstance(parsed, ubt.ParsedFrame), parsed
    assert parsed.header == h
    assert ubt.payload_values(parsed.payload).tolist() == values.tolist()


def test_full_packet_and_addressing() -> None:
    values = np.arange(256, dtype=np.int64) * -8191 + 12345
    h = header(msg_type=ubt.MSG_GATHER, count=256, contributors=3, flags=ubt.FLAG_LAST)
    addr = ubt.Addressing(mac_base=0x02_00_00_00_10_00, ip_base=(10 << 24) | 7)
    built = frame(h, values, src=2, dst=0, port=4791, addressing=addr)
    assert len(built) == ubt.L2_L4_LEN + ubt.HEADER_LEN + 4 * 256
    bind_port(4791)
    pkt = Ether(built)
    assert pkt[Ether].src == addr.mac_str(2) and pkt[Ether].dst == addr.mac_str(0)
    assert pkt[IP].src == addr.ip_str(2) and pkt[IP].dst == addr.ip_str(0)
    assert pkt[IP].flags == "DF" and pkt[IP].ttl == 64
    assert scapy_to_header(pkt) == h
    assert raw(scapy_frame(h, values, src=2, dst=0, port=4791, addressing=addr)) == built
    parsed = ubt.parse_frame(built, port=4791, rank=0, addressing=addr)
    assert isinstance(parsed, ubt.ParsedFrame) and parsed.header == h
    assert parse(built) == "wrong_address"


def test_scapy_count_filled_from_values() -> None:
    layer = UBT(msg_type=ubt.MSG_GATHER, contributors=1, world=2, t_c_us=1, values=[5, -6, 7])
    h = scapy_to_header(layer)
    assert h.count == 3 and h.version == ubt.VERSION
    parsed = ubt.parse_ubt(raw(layer))
    assert isinstance(parsed, ubt.ParsedFrame) and parsed.header == h
    assert ubt.payload_values(parsed.payload).tolist() == [5, -6, 7]


def test_zero_tc_is_malformed() -> None:
    """A t_C is at least one tick; 0 would drive every peer's timeout to nothing."""
    assert parse(frame(header(t_c_us=0))) == "malformed_header"
    assert isinstance(parse(frame(header(t_c_us=1))), ubt.ParsedFrame)


def test_trailing_bytes_after_datagram_ignored() -> None:
    """Bytes after the IP datagram (Ethernet FCS or padding) are not part of the UBT datagram."""
    h = header(count=1)
    parsed = parse(frame(h) + b"\xde\xad\xbe\xef")
    assert isinstance(parsed, ubt.ParsedFrame) and parsed.header == h
    assert len(parsed.payload) == 4


# --- receiver checks -----------------------------------------------------------------------


patch = ubt.patch_frame  # a field changed, the IP checksum fixed or not


GOOD = frame()
UBT_OFF = ubt.L2_L4_LEN

L2_L4_CASES = {
    "short frame": (GOOD[:41], "truncated"),
    "empty": (b"", "truncated"),
    "cut payload": (GOOD[:-1], "truncated"),
    "ip total length too small": (patch(GOOD, 16, "H", 27), "truncated"),
    "IPv6 ethertype": (patch(GOOD, 12, "H", 0x86DD), "not_ipv4"),
    "ARP ethertype": (patch(GOOD, 12, "H", 0x0806), "not_ipv4"),
    "IHL 6": (patch(GOOD, 14, "B", 0x46), "bad_ip_header"),
    "IP version 6": (patch(GOOD, 14, "B", 0x65), "bad_ip_header"),
    "bad IP checksum": (patch(GOOD, 24, "H", 0x1234, fix_ip=False), "bad_ip_checksum"),
    "IP TTL changed, checksum not": (patch(GOOD, 22, "B", 63, fix_ip=False), "bad_ip_checksum"),
    "more fragments": (patch(GOOD, 20, "H", 0x6000), "ip_fragment"),
    "fragment offset": (patch(GOOD, 20, "H", 0x0001), "ip_fragment"),
    "TCP": (patch(GOOD, 23, "B", 6), "not_udp"),
    "wrong MAC": (patch(GOOD, 0, "6s", int.to_bytes(1, 6, "big")), "wrong_address"),
    "wrong IP": (patch(GOOD, 30, "4s", ubt.DEFAULT_ADDRESSING.ip(DST + 1)), "wrong_address"),
    "wrong dport": (patch(GOOD, 36, "H", PORT + 1), "wrong_port"),
    "UDP length short": (patch(GOOD, 38, "H", len(GOOD) - 34 - 4), "bad_udp_length"),
    "UDP length long": (patch(GOOD, 38, "H", len(GOOD) - 34 + 4), "bad_udp_length"),
}


@pytest.mark.parametrize("case", sorted(L2_L4_CASES))
def test_parse_frame_l2_l4_rejects(case: str) -> None:
    data, reason = L2_L4_CASES[case]
    assert reason in ubt.DROP_REASONS
    assert parse(data) == reason


def test_parse_frame_wrong_rank_and_port() -> None:
    assert isinstance(parse(GOOD), ubt.ParsedFrame)
    assert parse(GOOD, rank=SRC) == "wrong_address"
    assert parse(GOOD, port=PORT + 1) == "wrong_port"
    # source port is not checked: a sender may use any
    assert isinstance(parse(patch(GOOD, 34, "H", 40000)), ubt.ParsedFrame)


UBT_CASES = {
    "version 0": (header(version=0), "bad_version"),
    "version 2": (header(version=2), "bad_version"),
    "type 0": (header(msg_type=0), "bad_type"),
    "type 3": (header(msg_type=3), "bad_type"),
    "unknown flag": (header(flags=0x04), "malformed_header"),
    "all flags": (header(flags=0xFF), "malformed_header"),
    "reserved set": (header(reserved=1), "malformed_header"),
    "reserved high bit": (header(reserved=0x8000), "malformed_header"),
    "scatter with contributors": (header(contributors=1), "malformed_header"),
    "gather without contributors": (
        header(msg_type=ubt.MSG_GATHER, contributors=0),
        "malformed_header",
    ),
    "contributors > world": (
        header(msg_type=ubt.MSG_GATHER, contributors=5, world=4),
        "malformed_header",
    ),
}


@pytest.mark.parametrize("case", sorted(UBT_CASES))
def test_parse_ubt_rejects(case: str) -> None:
    h, reason = UBT_CASES[case]
    assert reason in ubt.DROP_REASONS
    data = frame(h)
    assert parse(data) == reason
    assert ubt.parse_ubt(data[UBT_OFF:]) == reason
    assert ubt.parse_ubt(h.pack() + ubt.payload_bytes(np.zeros(h.count))) == reason


@pytest.mark.parametrize(
    ("n_values", "extra_bytes"), [(0, 0), (7, 0), (9, 0), (8, 1), (8, 3), (7, 2)]
)
def test_parse_rejects_count_mismatch(n_values: int, extra_bytes: int) -> None:
    h = header(count=8)
    payload = ubt.payload_bytes(np.ones(n_values)) + bytes(extra_bytes)
    data = ubt.build_frame(h, payload, src=SRC, dst=DST, port=PORT)
    assert parse(data) == "bad_length"
    assert ubt.parse_ubt(data[UBT_OFF:]) == "bad_length"


def test_parse_ubt_accepts_boundaries() -> None:
    for h in (
        header(msg_type=ubt.MSG_GATHER, contributors=4, world=4),
        header(msg_type=ubt.MSG_GATHER, contributors=1, world=1),
        header(count=0),
        header(flags=ubt.FLAG_LAST, exponent=-128),
    ):
        data = h.pack() + ubt.payload_bytes(np.ones(h.count))
        parsed = ubt.parse_ubt(data)
        assert isinstance(parsed, ubt.ParsedFrame), (h, parsed)
        assert parsed.header == h and len(parsed.payload) == 4 * h.count
    assert ubt.parse_ubt(b"\x01" * 31) == "truncated"


def test_first_failing_check_wins() -> None:
    bad_hdr = frame(header(version=9, msg_type=7, reserved=1), np.zeros(3))
    assert parse(bad_hdr) == "bad_version"
    assert parse(bad_hdr, port=PORT + 1) == "wrong_port"
    assert parse(bad_hdr, rank=SRC) == "wrong_address"
    assert parse(patch(bad_hdr, 24, "H", 0, fix_ip=False), rank=SRC) == "bad_ip_checksum"
    assert parse(frame(header(msg_type=7, flags=4), np.zeros(3))) == "bad_type"
    assert parse(frame(header(flags=4), np.zeros(3))) == "malformed_header"
    assert parse(patch(GOOD, 20, "H", 0x2000)[:-4]) == "truncated"


def _check_parse_result(result: object) -> None:
    if isinstance(result, str):
        assert result in ubt.DROP_REASONS
    else:
        assert isinstance(result, ubt.ParsedFrame)
        assert len(result.payload) == 4 * result.header.count


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_parse_random_bytes_never_raises(data: bytes) -> None:
    _check_parse_result(parse(data))
    _check_parse_result(ubt.parse_ubt(data))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), max_size=4),
       st.integers(0, len(GOOD)))  # fmt: skip
def test_parse_mutated_frame_never_raises(edits: list[tuple[int, int]], cut: int) -> None:
    b = bytearray(GOOD)
    for i, v in edits:
        b[i] = v
    _check_parse_result(parse(bytes(b[:cut])))
    _check_parse_result(parse(patch(bytes(b), 24, "H", 0)))  # valid IP checksum, odd fields


# --- the spec ------------------------------------------------------------------------------

DOC_PATH = REPO / "docs" / "protocol.md"
_DOC_TYPES = {"B": "uint8", "b": "int8", "H": "uint16", "I": "uint32"}


def test_doc_header_table_matches_fields() -> None:
    rows = []
    for line in DOC_PATH.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit() and cells[2].startswith("`"):
            rows.append(cells)
    want = [
        [str(ubt.FIELD_OFFSETS[f.name][0]), str(ubt.FIELD_OFFSETS[f.name][1]), f"`{f.name}`",
         _DOC_TYPES[f.fmt], f.doc]
        for f in ubt.FIELDS
    ]  # fmt: skip
    assert rows == want


def test_doc_check_tables_use_drop_reasons() -> None:
    text = DOC_PATH.read_text()
    checks = text[text.index("## Receiver checks") : text.index("## Addressing")]
    reasons = []
    for line in checks.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            assert int(cells[0]) == len(reasons) + 1, line
            reasons.append(cells[2].strip("`"))
    assert set(reasons) <= set(ubt.DROP_REASONS), set(reasons) - set(ubt.DROP_REASONS)
    assert set(ubt.DROP_REASONS) <= set(reasons), set(ubt.DROP_REASONS) - set(reasons)


# --- Wireshark dissector ---------------------------------------------------------------------


def test_committed_lua_is_generated() -> None:
    assert LUA_PATH.read_text() == ubt_lua.lua_dissector(), (
        "optireduce/ubt.lua is stale: run `python -m optireduce.ubt_lua > optireduce/ubt.lua`"
    )


def test_lua_mentions_every_field() -> None:
    src = ubt_lua.lua_dissector(port=4242)
    for f in ubt.FIELDS:
        assert f'"ubt.{f.name}"' in src
    for name in ("ubt.flags.last", "ubt.element", "ubt.elements"):
        assert f'"{name}"' in src
    assert 'Proto("ubt", "OptiReduce UBT v1")' in src
    assert 'DissectorTable.get("udp.port"):add(4242, ubt)' in src


def test_lua_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert ubt_lua.main([]) == 0
    assert capsys.readouterr().out == ubt_lua.lua_dissector()
    assert ubt_lua.main(["4791"]) == 0
    assert "add(4791, ubt)" in capsys.readouterr().out


def tshark_or_fail() -> str:
    if os.environ.get("OPTIREDUCE_NO_TSHARK") == "1":
        pytest.skip("OPTIREDUCE_NO_TSHARK=1: Wireshark dissector test skipped")
    exe = shutil.which("tshark")
    if exe is None:
        pytest.fail(
            "tshark not found: run `apt-get install -y tshark` (Debian), "
            "`dnf install wireshark-cli` (Fedora) or `brew install wireshark` (macOS), "
            "or set OPTIREDUCE_NO_TSHARK=1 to skip this test"
        )
    return exe


TSHARK_FIELDS = [
    *(f"ubt.{f.name}" for f in ubt.FIELDS),
    *(f"ubt.flags.{n.lower()}" for n in ubt.FLAG_NAMES.values()),
    "ubt.elements",
]


def run_tshark(exe: str, pcap: Path, tmp: Path, *extra: str) -> list[list[str]]:
    env = dict(os.environ, WIRESHARK_CONFIG_DIR=str(tmp / "wsconf"))  # no personal prefs
    (tmp / "wsconf").mkdir(exist_ok=True)
    cmd = [exe, "-n", "-X", f"lua_script:{LUA_PATH}", *extra, "-r", str(pcap), "-T", "fields"]
    for name in [*TSHARK_FIELDS, "ubt.element", "_ws.expert.message"]:
        cmd += ["-e", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines and any(line.strip() for line in lines), f"no output\n{proc.stderr}"
    return [line.split("\t") for line in lines]


def test_tshark_dissector(tmp_path: Path) -> None:
    exe = tshark_or_fail()
    gather = header(
        msg_type=ubt.MSG_GATHER, sender=2, contributors=3, world=4, op_id=2**32 - 1,
        pkt_index=70000, t_c_us=4_000_000_000, op_len=1, job_id=65535, exponent=127, count=20,
    )  # fmt: skip
    cases = [
        (header(flags=ubt.FLAG_LAST, exponent=-128, count=5), [1, -2, 2**31 - 1, -(2**31), 0]),
        (gather, list(range(-10, 10))),
        (gather._replace(flags=ubt.FLAG_NONFINITE, count=1), [3]),
        (header(msg_type=ubt.MSG_GATHER, contributors=1, flags=ubt.FLAG_LAST, count=0), []),
        (header(count=256, pkt_index=255), [(i * 7919) % 65536 - 32768 for i in range(256)]),
    ]
    pkts = [scapy_frame(h, v, src=h.sender, dst=DST, port=PORT) for h, v in cases]
    bad = ubt.build_frame(header(count=3), ubt.payload_bytes(np.ones(2)), src=0, dst=1, port=PORT)
    pcap = tmp_path / "ubt.pcap"
    wrpcap(str(pcap), [*pkts, Ether(bad)])

    rows = run_tshark(exe, pcap, tmp_path)
    assert len(rows) == len(cases) + 1
    for (h, values), row in zip(cases, rows[: len(cases)], strict=True):
        got = dict(zip([*TSHARK_FIELDS, "ubt.element", "expert"], row, strict=True))
        for f in ubt.FIELDS:
            assert int(got[f"ubt.{f.name}"], 0) == getattr(h, f.name), (f.name, got)
        for flag, name in ubt.FLAG_NAMES.items():
            on = got[f"ubt.flags.{name.lower()}"].strip().lower() in ("1", "true")
            assert on == bool(h.flags & flag), (name, got)
        assert int(got["ubt.elements"]) == len(values)
        shown = [int(x) for x in got["ubt.element"].split(",") if x]
        assert shown == values[: ubt_lua.DEFAULT_MAX_ELEMENTS], got
        assert got["expert"] == "", got
    assert "payload length is not 4 * count" in rows[-1][-1]

    rows = run_tshark(exe, pcap, tmp_path, "-o", "ubt.max_elements:1000")
    for (_h, values), row in zip(cases, rows[: len(cases)], strict=True):
        assert [int(x) for x in row[len(TSHARK_FIELDS)].split(",") if x] == values
