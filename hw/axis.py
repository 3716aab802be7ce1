"""AXI-Stream shell around a block with lib.stream ports, for cocotbext-axi.

A stream port `x` becomes flat ports named as AXI-Stream expects:
  sink   -> s_axis_tdata / s_axis_tvalid / s_axis_tready / s_axis_tlast / s_axis_tuser
  source -> m_axis_tdata / m_axis_tvalid / m_axis_tready / m_axis_tlast / m_axis_tuser
tdata is the payload's `data` field (the whole payload if it has none), padded
to whole bytes; tlast carries `last`, tuser carries `first` and tkeep carries
`keep` when the payload has them. Every other port of the block is passed
through under its own name.
"""

from __future__ import annotations

from amaranth import Module, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.forward_ports import forward_ports


def _fields(payload_shape) -> tuple[int, set[str]]:
    """Width of tdata and which of first/last/keep the payload has."""
    if isinstance(payload_shape, data.StructLayout):
        names = {name for name, _ in payload_shape}
        sig = Signal(payload_shape)
        width = len(Value.cast(sig["data"])) if "data" in names else payload_shape.size
        return width, names & {"first", "last", "keep"}
    return Value.cast(Signal(payload_shape)).shape().width, set()


def _pad8(width: int) -> int:
    return -(-width // 8) * 8


class AxisWrapper(wiring.Component):
    def __init__(self, block: wiring.Component, sink: str = "i", source: str = "o") -> None:
        self.block, self.sink, self.source = block, sink, source
        members = {}
        for name, prefix, flip in ((sink, "s_axis", In), (source, "m_axis", Out)):
            sig = block.signature.members[name].signature
            if not {"payload", "valid", "ready"} <= set(sig.members):
                raise TypeError(f"AxisWrapper: port {name!r} is not a stream")
            width, has = _fields(sig.members["payload"].shape)
            back = Out if flip is In else In
            members[f"{prefix}_tdata"] = flip(_pad8(width))
            members[f"{prefix}_tvalid"] = flip(1)
            members[f"{prefix}_tready"] = back(1)
            if "keep" in has:
                members[f"{prefix}_tkeep"] = flip(_pad8(width) // 8)
            if "last" in has:
                members[f"{prefix}_tlast"] = flip(1)
            if "first" in has:
                members[f"{prefix}_tuser"] = flip(1)
        for name, member in block.signature.members.items():
            if name in (sink, source):
                continue
            if not member.is_port:
                raise TypeError(f"AxisWrapper: port {name!r} is not a plain signal")
            members[name] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.block = b = self.block
        si, so = getattr(b, self.sink), getattr(b, self.source)
        for port, prefix, inbound in ((si, "s_axis", True), (so, "m_axis", False)):
            p = port.payload
            has = {n for n, _ in p.shape()} if isinstance(p.shape(), data.StructLayout) else set()
            dat = p["data"] if "data" in has else p
            tdata = getattr(self, f"{prefix}_tdata")
            if inbound:
                m.d.comb += [
                    port.valid.eq(self.s_axis_tvalid),
                    self.s_axis_tready.eq(port.ready),
                    Value.cast(dat).eq(tdata[: len(Value.cast(dat))]),
                ]
                if "last" in has:
                    m.d.comb += p["last"].eq(self.s_axis_tlast)
                if "first" in has:
                    m.d.comb += p["first"].eq(self.s_axis_tuser)
                if "keep" in has:
                    m.d.comb += p["keep"].eq(self.s_axis_tkeep)
            else:
                m.d.comb += [
                    self.m_axis_tvalid.eq(port.valid),
                    port.ready.eq(self.m_axis_tready),
                    tdata.eq(Value.cast(dat)),
                ]
                if "last" in has:
                    m.d.comb += self.m_axis_tlast.eq(p["last"])
                if "first" in has:
                    m.d.comb += self.m_axis_tuser.eq(p["first"])
                if "keep" in has:
                    m.d.comb += self.m_axis_tkeep.eq(p["keep"])
        for name in self.signature.members:
            if hasattr(b, name) and name not in (self.sink, self.source):
                inner, outer = getattr(b, name), getattr(self, name)
                if self.signature.members[name].flow == In:
                    m.d.comb += inner.eq(outer)
                else:
                    m.d.comb += outer.eq(inner)
        return m


class PlainStreams(wiring.Component):
    """`block` with some of its streams as plain ports, so AxisWrapper can pass them
    through to cocotb; every other member stays as it is. `styles` names each such
    stream `s` and how it shows:
      "whole"  -> s_valid / s_ready / s_payload
      "fields" -> s_valid / s_ready / s_<field> for each field of the payload's layout
      "axis"   -> s_tvalid / s_tready / s_tdata (the payload padded to whole bytes), as
                  cocotbext-axi's AxiStreamBus.from_prefix(dut, "s") expects
    """

    def __init__(self, block: wiring.Component, **styles: str) -> None:
        self.block, self.styles = block, styles
        members = {}
        for name, mb in block.signature.members.items():
            if name not in styles:
                members[name] = mb
                continue
            fwd = In if mb.flow == In else Out
            back = Out if fwd is In else In
            shape = mb.signature.members["payload"].shape
            pre = "t" if styles[name] == "axis" else ""
            members[f"{name}_{pre}valid"] = fwd(1)
            members[f"{name}_{pre}ready"] = back(1)
            if styles[name] == "fields":
                members.update({f"{name}_{f}": fwd(field.shape) for f, field in shape})
            elif styles[name] == "axis":
                members[f"{name}_tdata"] = fwd(_pad8(Value.cast(Signal(shape)).shape().width))
            else:
                members[f"{name}_payload"] = fwd(shape)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.block = b = self.block
        for name, mb in b.signature.members.items():
            inner = getattr(b, name)
            if name not in self.styles:
                if mb.is_port:
                    forward_ports(m, self, b, (name,))
                else:
                    wiring.connect(m, wiring.flipped(getattr(self, name)), inner)
                continue
            style = self.styles[name]
            pre = "t" if style == "axis" else ""
            if style == "fields":
                pairs = [
                    (inner.payload[f], getattr(self, f"{name}_{f}"))
                    for f, _ in inner.payload.shape()
                ]
            elif style == "axis":
                tdata = getattr(self, f"{name}_tdata")
                pairs = [(Value.cast(inner.payload), tdata[: len(Value.cast(inner.payload))])]
            else:
                pairs = [(inner.payload, getattr(self, f"{name}_payload"))]
            pairs.append((inner.valid, getattr(self, f"{name}_{pre}valid")))
            ready = getattr(self, f"{name}_{pre}ready")
            if mb.flow == In:  # the block takes this stream: the outside drives it
                m.d.comb += [i.eq(o) for i, o in pairs] + [ready.eq(inner.ready)]
            else:
                m.d.comb += [o.eq(i) for i, o in pairs] + [inner.ready.eq(ready)]
        return m
