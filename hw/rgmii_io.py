"""RGMII DDR layer: 4 data bits + CTL on both clock edges <-> one byte per 125 MHz cycle.

RGMII (v2.0) at 1000 Mb/s: the low nibble and CTL = EN travel with the rising edge, the
high nibble and CTL = EN xor ER with the falling edge.

Two implementations with the same byte-side ports (txd/tx_en/tx_er in, rxd/rx_dv/rx_er
out, all in the MAC's `sync` domain):

- `RgmiiDdrGeneric`: plain flip-flops on both edges (a `ClockDomain(clk_edge="neg")` on
  the sync clock), for amaranth.sim and Verilator with cocotbext-eth's RgmiiSource and
  RgmiiSink. Pins: rgmii_txd/rgmii_tx_ctl out, rgmii_rxd/rgmii_rx_ctl in; the RGMII
  clock is the sync clock itself. The output changes right after each edge and is held
  through the next one (the sink samples just before the edge, as a PHY with its
  internal clock delay does), so no clock skew is modelled.
- `RgmiiDdrBuffers`: the same on a board through `amaranth.lib.io.DDRBuffer` on the
  platform's pads (tx_clk, tx_ctl, tx_data, rx_ctl, rx_data of an amaranth-boards
  `eth_rgmii` resource requested with dir="-"). It needs a platform to elaborate.
  The RX buffers sample in `rx_domain`: on a board that must be the PHY's RX clock
  (see RgmiiMac and docs/rgmii.md); TX runs on sync and tx_clk is forwarded by a DDR
  buffer (1, 0), so the PHY must add the 2 ns TX clock delay (its internal delay mode).
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

BYTE_SIDE = {
    "txd": In(8),
    "tx_en": In(1),
    "tx_er": In(1),
    "rxd": Out(8),
    "rx_dv": Out(1),
    "rx_er": Out(1),
}


class RgmiiDdrGeneric(wiring.Component):
    """Generic DDR flip-flops for simulation. LATENCY: 1 cycle each way (byte register)."""

    LATENCY = 1

    def __init__(self) -> None:
        super().__init__(
            {
                **BYTE_SIDE,
                "rgmii_txd": Out(4),
                "rgmii_tx_ctl": Out(1),
                "rgmii_rxd": In(4),
                "rgmii_rx_ctl": In(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.domains.rgmii_neg = neg = ClockDomain(clk_edge="neg", local=True)
        m.d.comb += [neg.clk.eq(ClockSignal()), neg.rst.eq(ResetSignal())]

        # TX: the pin is pos ^ neg, so it shows whichever flop changed last. The falling
        # edge inside a byte's cycle launches {EN, low nibble} of the byte in txd (the sink
        # takes it at the next rising edge); that rising edge launches {EN^ER, high nibble}
        # of the same byte (taken at the falling edge after it).
        lo = Cat(self.txd[:4], self.tx_en)
        hi = Cat(self.txd[4:], self.tx_en ^ self.tx_er)
        pos, negf = Signal(5), Signal(5)
        m.d.rgmii_neg += negf.eq(lo ^ pos)
        m.d.sync += pos.eq(hi ^ negf)
        pin = pos ^ negf
        m.d.comb += [self.rgmii_txd.eq(pin[:4]), self.rgmii_tx_ctl.eq(pin[4])]

        # RX: the rising edge takes {EN, low}, the falling edge {EN^ER, high}; the next
        # rising edge puts the byte together.
        rise, fall = Signal(5), Signal(5)
        m.d.sync += rise.eq(Cat(self.rgmii_rxd, self.rgmii_rx_ctl))
        m.d.rgmii_neg += fall.eq(Cat(self.rgmii_rxd, self.rgmii_rx_ctl))
        m.d.sync += [
            self.rxd.eq(Cat(rise[:4], fall[:4])),
            self.rx_dv.eq(rise[4]),
            self.rx_er.eq(rise[4] ^ fall[4]),
        ]
        return m


class RgmiiDdrBuffers(wiring.Component):
    """DDR I/O primitives of the platform on real RGMII pads (boards only).

    `pads` is the resource from `platform.request("eth_rgmii", n, dir="-")`.
    LATENCY: as the platform's DDR buffers, plus 1 byte register each way.
    """

    def __init__(self, pads, rx_domain: str = "sync") -> None:
        self.pads, self.rx_domain = pads, rx_domain
        super().__init__(dict(BYTE_SIDE))

    def elaborate(self, platform):
        m = Module()
        p = self.pads
        m.submodules.tx_clk = tx_clk = io.DDRBuffer("o", p.tx_clk)
        m.submodules.tx_ctl = tx_ctl = io.DDRBuffer("o", p.tx_ctl)
        m.submodules.tx_data = tx_data = io.DDRBuffer("o", p.tx_data)
        rxd = self.rx_domain
        m.submodules.rx_ctl = rx_ctl = io.DDRBuffer("i", p.rx_ctl, i_domain=rxd)
        m.submodules.rx_data = rx_data = io.DDRBuffer("i", p.rx_data, i_domain=rxd)
        m.d.comb += [
            tx_clk.o[0].eq(1),
            tx_clk.o[1].eq(0),
            tx_data.o[0].eq(self.txd[:4]),
            tx_data.o[1].eq(self.txd[4:]),
            tx_ctl.o[0].eq(self.tx_en),
            tx_ctl.o[1].eq(self.tx_en ^ self.tx_er),
        ]
        # i[0] is the rising-edge sample and i[1] the falling-edge one of the same cycle.
        m.d[rxd] += [
            self.rxd.eq(Cat(rx_data.i[0], rx_data.i[1])),
            self.rx_dv.eq(rx_ctl.i[0]),
            self.rx_er.eq(rx_ctl.i[0] ^ rx_ctl.i[1]),
        ]
        return m
