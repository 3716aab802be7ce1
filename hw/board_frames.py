"""Frame plumbing of the board tops, between the RGMII MACs (one byte per beat) and the
core (eight bytes per beat), all at one input beat per cycle:

- `Widen`:  frame_stream(1) -> frame_stream(8) (byte 0 in lane 0, `keep` on the last beat);
- `Narrow`: frame_stream(8) -> frame_stream(1);
- `EtherTypeDemux`: one MAC's frames -> host-port frames (EtherType 0x88B5) or the rest;
- `FrameMux`: two frame sources -> one MAC, a whole frame at a time (round robin).

The last two serve boards with one Ethernet port, where the host port and the network
port share the PHY (docs/boards.md).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce import host_port
from optireduce.hw.streams import frame_stream

ETHERTYPE_AT = 12  # bytes 12..13 of an Ethernet frame


class Widen(wiring.Component):
    """Bytes to `nbytes`-byte beats. Full rate: a beat leaves while the next one fills."""

    def __init__(self, nbytes: int = 8) -> None:
        self.nbytes = nbytes
        super().__init__({"i": In(frame_stream(1)), "o": Out(frame_stream(nbytes))})

    def elaborate(self, platform):
        m = Module()
        n = self.nbytes
        acc = Signal(8 * n)
        pos = Signal(range(n))
        full = Signal()
        m.d.comb += [
            self.o.valid.eq(full),
            self.i.ready.eq(~full | self.o.ready),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += full.eq(0)
        with m.If(self.i.valid & self.i.ready):
            byte = self.i.payload.data[0]
            done = self.i.payload.last | (pos == n - 1)
            m.d.sync += acc.word_select(pos, 8).eq(byte)
            with m.If(done):
                lanes = [Mux(pos == k, byte, acc[8 * k : 8 * k + 8]) for k in range(n)]
                m.d.sync += [
                    Cat(*(self.o.payload.data[k] for k in range(n))).eq(Cat(*lanes)),
                    self.o.payload.keep.eq((Const(1, n + 1) << (pos + 1)) - 1),
                    self.o.payload.last.eq(self.i.payload.last),
                    full.eq(1),
                    pos.eq(0),
                ]
            with m.Else():
                m.d.sync += pos.eq(pos + 1)
        return m


class Narrow(wiring.Component):
    """`nbytes`-byte beats to bytes (keep is contiguous from lane 0)."""

    def __init__(self, nbytes: int = 8) -> None:
        self.nbytes = nbytes
        super().__init__({"i": In(frame_stream(nbytes)), "o": Out(frame_stream(1))})

    def elaborate(self, platform):
        m = Module()
        n = self.nbytes
        # the beat shifts down a byte as each goes out: the byte out is data[:8] and
        # "another follows" is keep[1], flip-flops, not a select by position (125 MHz)
        data = Signal(8 * n)
        keep = Signal(n)
        last = Signal()
        held = Signal()
        more = keep[1] if n > 1 else Const(0)  # a kept byte follows this one
        m.d.comb += [
            self.o.valid.eq(held),
            self.o.payload.data[0].eq(data[:8]),
            self.o.payload.keep.eq(1),
            self.o.payload.last.eq(last & ~more),
            self.i.ready.eq(~held | (self.o.ready & ~more)),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [data.eq(data >> 8), keep.eq(keep >> 1)]
            with m.If(~more):
                m.d.sync += held.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                data.eq(Cat(*(self.i.payload.data[k] for k in range(n)))),
                keep.eq(self.i.payload.keep | 1),  # an empty beat still carries one byte
                last.eq(self.i.payload.last),
                held.eq(1),
            ]
        return m


class EtherTypeDemux(wiring.Component):
    """Host-port frames (EtherType 0x88B5) to `host`, every other frame to `net`.

    The first 14 bytes wait in registers until the EtherType is known, then the frame
    streams through; a frame shorter than 14 bytes goes to `net` (whose parser drops it).
    """

    def __init__(self) -> None:
        super().__init__(
            {
                "i": In(frame_stream(1)),
                "host": Out(frame_stream(1)),
                "net": Out(frame_stream(1)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        head_len = ETHERTYPE_AT + 2
        hdr = Array(Signal(8, name=f"hdr{k}") for k in range(head_len))
        cnt = Signal(range(head_len + 1))
        out_i = Signal(range(head_len + 1))
        ended = Signal()  # the frame ended inside its first 14 bytes
        to_host = Signal()
        outs = (self.net, self.host)
        sel_valid, sel_ready = Signal(), Signal()
        sel_data, sel_last = Signal(8), Signal()
        m.d.comb += sel_ready.eq(Mux(to_host, self.host.ready, self.net.ready))
        for k, o in enumerate(outs):
            m.d.comb += [
                o.valid.eq(sel_valid & (to_host == k)),
                o.payload.data[0].eq(sel_data),
                o.payload.keep.eq(1),
                o.payload.last.eq(sel_last),
            ]
        et = host_port.ETHERTYPE
        with m.FSM():
            with m.State("HEAD"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [hdr[cnt].eq(self.i.payload.data[0]), cnt.eq(cnt + 1)]
                    with m.If(self.i.payload.last | (cnt == head_len - 1)):
                        is_host = (
                            ~self.i.payload.last
                            & (hdr[ETHERTYPE_AT] == et >> 8)
                            & (self.i.payload.data[0] == et & 0xFF)
                        )
                        m.d.sync += [
                            to_host.eq(is_host),
                            ended.eq(self.i.payload.last),
                            out_i.eq(0),
                        ]
                        m.next = "REPLAY"
            with m.State("REPLAY"):
                # the held bytes shift out from hdr[0]: no 14-way byte mux in front of
                # the next block's registers (125 MHz)
                m.d.comb += [
                    sel_valid.eq(1),
                    sel_data.eq(hdr[0]),
                    sel_last.eq(ended & (out_i == cnt - 1)),
                ]
                with m.If(sel_ready):
                    m.d.sync += out_i.eq(out_i + 1)
                    m.d.sync += [hdr[k].eq(hdr[k + 1]) for k in range(head_len - 1)]
                    with m.If(out_i == cnt - 1):
                        m.d.sync += cnt.eq(0)
                        with m.If(ended):
                            m.next = "HEAD"
                        with m.Else():
                            m.next = "PASS"
            with m.State("PASS"):
                m.d.comb += [
                    sel_valid.eq(self.i.valid),
                    sel_data.eq(self.i.payload.data[0]),
                    sel_last.eq(self.i.payload.last),
                    self.i.ready.eq(sel_ready),
                ]
                with m.If(self.i.valid & sel_ready & self.i.payload.last):
                    m.next = "HEAD"
        return m


class FrameMux(wiring.Component):
    """Two byte-frame sources into one sink, never interleaving frames (round robin)."""

    def __init__(self) -> None:
        super().__init__(
            {
                "a": In(frame_stream(1)),
                "b": In(frame_stream(1)),
                "o": Out(frame_stream(1)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        busy = Signal()
        cur = Signal()  # 0: a, 1: b
        prefer_b = Signal()
        src = (self.a, self.b)
        pick = Mux(self.a.valid & self.b.valid, prefer_b, self.b.valid)
        use = Mux(busy, cur, pick)
        for k, s in enumerate(src):
            m.d.comb += s.ready.eq(self.o.ready & (use == k) & (busy | s.valid))
        m.d.comb += [
            self.o.valid.eq(Mux(use, self.b.valid, self.a.valid)),
            self.o.payload.eq(Mux(use, self.b.payload, self.a.payload)),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [busy.eq(~self.o.payload.last), cur.eq(use)]
            with m.If(self.o.payload.last):
                m.d.sync += prefer_b.eq(~use)
        return m
