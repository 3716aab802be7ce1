"""A stand-in for the NIC core with NicCore's ports, for the shell around it: the shell's
test (tests/hw/test_nic_shell.py) checks every crossing with it, and
`optireduce build bitstream --core loopback` builds a board with it, so the 125 MHz side
(MACs, host adapter, crossings) is placed and routed alone in three minutes instead of an
hour (docs/gateware.md, "The 125 MHz side, routed")."""

from __future__ import annotations

from amaranth import Array, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host_port import ADAPTER_COUNTERS, HEAD_FIELDS
from optireduce.hw.csr import addr_bits, register
from optireduce.hw.host_adapter import CMD_LAYOUT, OUT_LAYOUT, RECORD_FIXED
from optireduce.hw.nic_shell import NET_BYTES
from optireduce.hw.streams import float_stream, frame_stream
from optireduce.params import NicParams


class LoopbackCore(wiring.Component):
    """A stand-in core with NicCore's ports: net_rx straight back to net_tx; on host_o
    an op's head (the record's first words, `head` set), its words back, then a record
    [op_id, n, exponent, 0.., world at
    RECORD_FIXED - 1, 0 x (world + 1)], with `world` the register's reset value (the
    adapter's copy after reset); every register reads the ticks counted so far and writes
    are ignored. A REG frame that writes `world` therefore makes every later result a
    bad record: the adapter checks records against its copy of `world`."""

    def __init__(self, p: NicParams) -> None:
        self.world = register(p, "world").reset
        super().__init__({
            "host_cmd": In(stream.Signature(CMD_LAYOUT)), "host_i": In(float_stream(1)),
            "host_o": Out(stream.Signature(OUT_LAYOUT)),
            "net_rx": In(frame_stream(NET_BYTES)), "net_tx": Out(frame_stream(NET_BYTES)),
            "csr_addr": In(addr_bits(p)), "csr_w_en": In(1), "csr_w_data": In(32),
            "csr_r_en": In(1), "csr_r_data": Out(32), "csr_r_valid": Out(1), "tick": In(1),
            "adapter_counts": In(len(ADAPTER_COUNTERS)),  # not counted here
        })  # fmt: skip

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [
            self.net_tx.valid.eq(self.net_rx.valid),
            self.net_tx.payload.eq(self.net_rx.payload),
            self.net_rx.ready.eq(self.net_tx.ready),
        ]
        ticks = Signal(32)
        m.d.sync += ticks.eq(ticks + self.tick)
        m.d.sync += self.csr_r_valid.eq(self.csr_r_en)
        with m.If(self.csr_r_en):
            m.d.sync += self.csr_r_data.eq(ticks)
        op, n, e = Signal(32), Signal(32), Signal(8)
        k = Signal(32)
        rlen = RECORD_FIXED + 1 + self.world
        rec = [op, n, e] + [0] * (RECORD_FIXED - 4) + [self.world] + [0] * (1 + self.world)
        with m.FSM():
            with m.State("CMD"):
                m.d.comb += self.host_cmd.ready.eq(1)
                with m.If(self.host_cmd.valid):
                    c = self.host_cmd.payload
                    m.d.sync += [op.eq(c.op_id), n.eq(c.n), e.eq(c.exponent), k.eq(0)]
                    m.next = "HEAD"
            with m.State("HEAD"):
                m.d.comb += [
                    self.host_o.valid.eq(1),
                    self.host_o.payload.data.eq(Array(rec)[k]),
                    self.host_o.payload.head.eq(1),
                ]
                with m.If(self.host_o.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == len(HEAD_FIELDS) - 1):
                        m.d.sync += k.eq(0)
                        m.next = "WORDS"
            with m.State("WORDS"):
                m.d.comb += [
                    self.host_o.valid.eq(self.host_i.valid),
                    self.host_o.payload.data.eq(self.host_i.payload.data[0]),
                    self.host_i.ready.eq(self.host_o.ready),
                ]
                with m.If(self.host_i.valid & self.host_o.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == n - 1):
                        m.d.sync += k.eq(0)
                        m.next = "RECORD"
            with m.State("RECORD"):
                m.d.comb += [
                    self.host_o.valid.eq(1),
                    self.host_o.payload.data.eq(Array(rec)[k]),
                    self.host_o.payload.last.eq(k == rlen - 1),
                ]
                with m.If(self.host_o.ready):
                    m.d.sync += k.eq(k + 1)
                    with m.If(k == rlen - 1):
                        m.next = "CMD"
        return m
