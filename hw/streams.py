"""Stream payload layouts shared by the datapath blocks."""

from __future__ import annotations

from amaranth.hdl import signed
from amaranth.lib import data, stream


def element_layout(width: int, lanes: int = 1) -> data.StructLayout:
    """`lanes` signed elements of `width` bits, with block/frame first and last markers."""
    return data.StructLayout(
        {"data": data.ArrayLayout(signed(width), lanes), "first": 1, "last": 1}
    )


def element_stream(width: int, lanes: int = 1) -> stream.Signature:
    return stream.Signature(element_layout(width, lanes))


def float_layout(lanes: int = 1) -> data.StructLayout:
    """IEEE-754 float32 bit patterns, with markers."""
    return data.StructLayout({"data": data.ArrayLayout(32, lanes), "first": 1, "last": 1})


def float_stream(lanes: int = 1) -> stream.Signature:
    return stream.Signature(float_layout(lanes))


def frame_layout(nbytes: int) -> data.StructLayout:
    """Ethernet frame bytes, `nbytes` per beat, first byte in lane 0; keep marks valid lanes
    (all ones except possibly on the last beat)."""
    return data.StructLayout({"data": data.ArrayLayout(8, nbytes), "keep": nbytes, "last": 1})


def frame_stream(nbytes: int) -> stream.Signature:
    return stream.Signature(frame_layout(nbytes))
