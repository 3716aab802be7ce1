"""Scapy layer of UBT v1, generated from ubt.FIELDS (tests and debugging only: not a fast path).

    >>> from optireduce import ubt, ubt_scapy
    >>> pkt = ubt_scapy.scapy_frame(header, values, src=0, dst=1, port=17017)
    >>> bytes(pkt) == ubt.build_frame(header, ubt.payload_bytes(values), src=0, dst=1, port=17017)
    True

Frames are Ether / IP / UDP / UBT; the UBT layer holds the header fields and the payload as
`values` (count big-endian int32). UDP frames to or from the configured port dissect as UBT.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from scapy.fields import (
    ByteEnumField,
    ByteField,
    Field,
    FieldLenField,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedByteField,
    SignedIntField,
)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_bottom_up, bind_top_down

from optireduce import ubt
from optireduce.params import NicParams

DEFAULT_PORT = NicParams().udp_port

_PLAIN_FIELDS = {"B": ByteField, "b": SignedByteField, "H": ShortField, "I": IntField}
_FLAG_NAMES = ubt.FLAG_NAMES
_MAX_COUNT = 1 << ubt.field_bits(next(f for f in ubt.FIELDS if f.name == "count"))


def _scapy_field(f: ubt.Field) -> Field:
    """The scapy field of one ubt.FIELDS entry (same width, signedness and wire order)."""
    default = ubt.VERSION if f.name == "version" else 0
    if f.name == "msg_type":
        assert f.fmt == "B"
        return ByteEnumField(f.name, ubt.MSG_SCATTER, ubt.MSG_TYPES)
    if f.name == "flags":
        assert f.fmt == "B"
        return FlagsField(f.name, 0, 8, _FLAG_NAMES)
    if f.name == "count":  # None: filled from len(values) when the packet is built
        return FieldLenField(f.name, None, count_of="values", fmt="!" + f.fmt)
    return _PLAIN_FIELDS[f.fmt](f.name, default)


class UBT(Packet):
    """UBT v1 header (fields in ubt.FIELDS order) followed by `count` signed 32-bit elements."""

    name = "OptiReduce UBT v1"
    fields_desc = [  # noqa: RUF012 (scapy's class attribute)
        *(_scapy_field(f) for f in ubt.FIELDS),
        FieldListField(
            "values",
            [],
            SignedIntField("element", 0),
            count_from=lambda p: p.count,
            max_count=_MAX_COUNT,  # scapy's default cap (conf.max_list_count) is 100
        ),
    ]

    def mysummary(self) -> str:
        last = "".join(f" {n}" for f, n in ubt.FLAG_NAMES.items() if int(self.flags) & f)
        return self.sprintf(
            f"UBT %msg_type% job=%job_id% op=%op_id% idx=%pkt_index% from=%sender%{last}"
        )


assert [f.name for f in UBT.fields_desc[: len(ubt.FIELDS)]] == [f.name for f in ubt.FIELDS]

_bound_ports: set[int] = set()


def bind_port(port: int) -> None:
    """Dissect UDP datagrams from or to `port` as UBT; UDP()/UBT() builds with both ports set."""
    if not 1 <= port <= 0xFFFF:
        raise ValueError(f"not a UDP port: {port}")
    if port not in _bound_ports:
        bind_bottom_up(UDP, UBT, dport=port)
        bind_bottom_up(UDP, UBT, sport=port)
        _bound_ports.add(port)
    bind_top_down(UDP, UBT, sport=port, dport=port)


bind_port(DEFAULT_PORT)


def scapy_frame(
    header: ubt.UbtHeader,
    values: Iterable[int] | np.ndarray,
    *,
    src: int,
    dst: int,
    port: int,
    addressing: ubt.Addressing = ubt.DEFAULT_ADDRESSING,
) -> Packet:
    """Ether/IP/UDP/UBT from rank src to rank dst, byte-identical to ubt.build_frame.

    The header is used as given (count included, even if it disagrees with len(values)), so
    malformed frames can be built too. IPv4 checksum computed by scapy; UDP checksum 0.
    """
    ether = Ether(dst=addressing.mac_str(dst), src=addressing.mac_str(src), type=ubt.ETHERTYPE_IPV4)
    ip = IP(
        version=4, ihl=5, tos=0, id=0, flags="DF", frag=0, ttl=64, proto=ubt.IPPROTO_UDP,
        src=addressing.ip_str(src), dst=addressing.ip_str(dst),
    )  # fmt: skip
    udp = UDP(sport=port, dport=port, chksum=0)
    body = UBT(**header._asdict(), values=[int(v) for v in np.asarray(values).ravel()])
    return ether / ip / udp / body


def _ubt_layer(pkt: Packet) -> UBT:
    layer = pkt.getlayer(UBT)
    if layer is None:
        raise ValueError(f"no UBT layer in {pkt.summary()}")
    return layer


def scapy_to_header(pkt: Packet) -> ubt.UbtHeader:
    """The UbtHeader of a scapy packet holding a UBT layer (count as on the wire)."""
    layer = _ubt_layer(pkt)
    if layer.count is None:  # not built yet: count comes from len(values)
        layer = UBT(bytes(layer))
    return ubt.UbtHeader(*(int(getattr(layer, f.name)) for f in ubt.FIELDS))


def scapy_values(pkt: Packet) -> np.ndarray:
    """The payload elements of a scapy packet holding a UBT layer (int64, like payload_values)."""
    return np.asarray(_ubt_layer(pkt).values, dtype=np.int64)
