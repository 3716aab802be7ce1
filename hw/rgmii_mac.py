"""RGMII Gigabit MAC: byte streams toward the core, RGMII pins toward the PHY (docs/rgmii.md).

  i (frame_stream(1)) -> RgmiiTx (FIFO, preamble/SFD, pad to 60, FCS, IFG 12) -> DDR -> TXD/TX_CTL
  RXD/RX_CTL -> DDR -> RgmiiRx (SFD, FCS check, runt/error drop, frame FIFO) -> o (frame_stream(1))

Model: IEEE 802.3 framing with zlib.crc32 as the FCS (tests build the reference from
scapy Ether()/Raw + zlib); there is no host/ function for it.

Without `pads` the DDR layer is the generic one (`RgmiiDdrGeneric`) and the pins are
ports of this component (rgmii_txd, rgmii_tx_ctl, rgmii_rxd, rgmii_rx_ctl) clocked by
`sync` on both edges: for amaranth.sim and Verilator. With `pads` (an amaranth-boards
`eth_rgmii` resource, dir="-") it uses the platform's DDR buffers. On a board the RX
side must run on the PHY's RX clock: pass `rx_domain` (a domain clocked by rx_clk); the
receiver then runs in that domain, its frames cross to `sync` through a StreamCrossing
(hw/clock_crossing.py: an AsyncFifo, registered on both sides) and its counters through
Gray-coded synchronizers.
"""

from __future__ import annotations

from amaranth import Cat, DomainRenamer, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from optireduce.hw.clock_crossing import StreamCrossing
from optireduce.hw.rgmii_io import RgmiiDdrBuffers, RgmiiDdrGeneric
from optireduce.hw.rgmii_rx import COUNTER_WIDTH, RgmiiRx
from optireduce.hw.rgmii_tx import RgmiiTx
from optireduce.hw.streams import frame_layout, frame_stream
from optireduce.params import NicParams

RX_COUNTERS = ("rx_good", "rx_bad_fcs", "rx_runt", "rx_error", "rx_overflow")
CDC_DEPTH = 16  # rx_domain -> sync byte FIFO; both clocks are 125 MHz +- 100 ppm


def _gray(b):
    return b ^ (b >> 1)


def _ungray(m: Module, g: Signal) -> Signal:
    out = Signal.like(g)
    bits = [g[-1]]
    for k in range(len(g) - 2, -1, -1):
        bits.insert(0, bits[0] ^ g[k])
    m.d.sync += out.eq(Cat(*bits))
    return out


class RgmiiMac(wiring.Component):
    """RGMII MAC. Ports: `i` (TX bytes), `o` (RX bytes, good frames only, FCS removed),
    counters tx_frames and RX_COUNTERS (32 bits), and the RGMII pins when `pads` is None.

    LATENCY (pins, no backpressure): TX, last input beat -> first preamble nibble:
    RgmiiTx.LATENCY + 1; RX, end of frame on the pins -> first byte on `o`:
    RgmiiRx.LATENCY + 2 (see experiments/figures/fig_rgmii_mac.py for the measured loopback).
    On a board (`rx_domain`) the StreamCrossing adds its FIFO and a register on each side.
    """

    def __init__(
        self,
        p: NicParams | None = None,
        *,
        fifo_bytes: int = 2048,
        pads=None,
        rx_domain: str = "sync",
    ) -> None:
        self.p = p or NicParams()
        self.fifo_bytes, self.pads, self.rx_domain = fifo_bytes, pads, rx_domain
        members = {
            "i": In(frame_stream(1)),
            "o": Out(frame_stream(1)),
            "tx_frames": Out(COUNTER_WIDTH),
            **{name: Out(COUNTER_WIDTH) for name in RX_COUNTERS},
        }
        if pads is None:
            assert rx_domain == "sync", "the generic DDR layer runs on sync only"
            members |= {
                "rgmii_txd": Out(4),
                "rgmii_tx_ctl": Out(1),
                "rgmii_rxd": In(4),
                "rgmii_rx_ctl": In(1),
            }
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = tx = RgmiiTx(self.fifo_bytes)
        rx = RgmiiRx(self.fifo_bytes)
        cross = self.rx_domain != "sync"
        m.submodules.rx = DomainRenamer(self.rx_domain)(rx) if cross else rx

        if self.pads is None:
            m.submodules.ddr = ddr = RgmiiDdrGeneric()
            m.d.comb += [
                self.rgmii_txd.eq(ddr.rgmii_txd),
                self.rgmii_tx_ctl.eq(ddr.rgmii_tx_ctl),
                ddr.rgmii_rxd.eq(self.rgmii_rxd),
                ddr.rgmii_rx_ctl.eq(self.rgmii_rx_ctl),
            ]
        else:
            m.submodules.ddr = ddr = RgmiiDdrBuffers(self.pads, self.rx_domain)

        wiring.connect(m, wiring.flipped(self.i), tx.i)
        m.d.comb += [
            ddr.txd.eq(tx.txd),
            ddr.tx_en.eq(tx.tx_en),
            ddr.tx_er.eq(tx.tx_er),
            rx.rxd.eq(ddr.rxd),
            rx.rx_dv.eq(ddr.rx_dv),
            rx.rx_er.eq(ddr.rx_er),
            self.tx_frames.eq(tx.tx_frames),
        ]

        if not cross:
            wiring.connect(m, wiring.flipped(self.o), rx.o)
            for name in RX_COUNTERS:
                m.d.comb += getattr(self, name).eq(getattr(rx, name))
            return m

        # Board: PHY RX clock -> sync. Bytes through a StreamCrossing (an AsyncFifo with a
        # register on each side: the frame FIFO's block RAM output and the crossing's LUT
        # RAM never share a cycle), counters as Gray codes (they step by one, so one bit
        # changes at a time and a synchronized read is exact).
        m.submodules.cdc = cdc = StreamCrossing(
            frame_layout(1), w_domain=self.rx_domain, r_domain="sync", depth=CDC_DEPTH
        )
        wiring.connect(m, rx.o, cdc.i)
        wiring.connect(m, cdc.o, wiring.flipped(self.o))
        for name in RX_COUNTERS:
            g = Signal(COUNTER_WIDTH, name=f"{name}_gray")
            m.d[self.rx_domain] += g.eq(_gray(getattr(rx, name)))
            g_sync = Signal(COUNTER_WIDTH, name=f"{name}_gray_sync")
            m.submodules[f"{name}_sync"] = FFSynchronizer(g, g_sync)
            m.d.comb += getattr(self, name).eq(_ungray(m, g_sync))
        return m
