"""The UBT v1 header as an Amaranth layout, built from `optireduce/ubt.py: FIELDS`.

The wire is big-endian and an Amaranth struct is packed LSB first, so the layout
is not the wire image: `wire_to_header` / `header_to_wire` do the byte order
explicitly, field by field, from the offsets that FIELDS implies.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Cat, Value, signed, unsigned
from amaranth.lib import data

from optireduce import ubt


def header_layout() -> data.StructLayout:
    """One member per `ubt.FIELDS` entry, in wire order, with its width and signedness."""
    return data.StructLayout(
        {
            f.name: (signed if ubt.field_signed(f) else unsigned)(ubt.field_bits(f))
            for f in ubt.FIELDS
        }
    )


HEADER_LAYOUT: data.StructLayout = header_layout()


def wire_to_header(octets: Sequence) -> Value:
    """The header's bits in HEADER_LAYOUT order from its 32 wire bytes (octets[0] first)."""
    if len(octets) != ubt.HEADER_LEN:
        raise ValueError(f"a UBT header is {ubt.HEADER_LEN} bytes, got {len(octets)}")
    parts = []
    for f in ubt.FIELDS:
        off, size = ubt.FIELD_OFFSETS[f.name]
        # big-endian: the field's last wire byte is its least significant
        parts.append(Cat(*(octets[off + size - 1 - j] for j in range(size))))
    return Cat(*parts)


def header_to_wire(header: data.View) -> list[Value]:
    """The 32 wire bytes (index 0 first on the wire) of a HEADER_LAYOUT view."""
    out: list[Value] = []
    for f in ubt.FIELDS:
        v = Value.cast(getattr(header, f.name))
        _, size = ubt.FIELD_OFFSETS[f.name]
        out += [v[8 * (size - 1 - j) : 8 * (size - j)] for j in range(size)]
    return out


def header_value(view) -> ubt.UbtHeader:
    """A simulator's HEADER_LAYOUT value (a data.Const) as the model's UbtHeader."""
    return ubt.UbtHeader(*(int(getattr(view, f.name)) for f in ubt.FIELDS))
