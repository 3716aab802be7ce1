"""Colorlight 5A-75B (rev. 7.0, LFE5U-25F-6BG256): two Broadcom B50612D GbE PHYs.

Port 0 (the RJ45 next to the power jack, eth_rgmii 0) goes to the host, port 1 to the
network: a bump-in-the-wire NIC. The two PHYs share one reset, MDC and MDIO pin, so the
second port's resource here lists only its data and clock pins. The one LED is on while
both PHYs deliver an RX clock and blinks with traffic (slowly: the SDRAM controller
reports a fault). Params: see docs/boards.md (the
25F's build is C = 2048 on chip; `--sdram` is C = 16K with its SDRAM).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.build import Attrs, Pins, Resource, Subsignal
from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform

from optireduce.hw.board_top import Board, NoProgrammer
from optireduce.hw.sdram_controller import SdramSpec
from optireduce.params import NicParams

# one op in flight, one FWHT and a 24-bit clock (t_B < 2^20 us): the 25F's LUTs
# (docs/boards.md, "One op in flight on the 25F", "A 24-bit clock")
PARAMS = NicParams(n_max=8, p=256, b=1024, c=2048, ops_in_flight=1, fwht_shared=True,
                   tick_bits=24)  # fmt: skip


class ColorlightPlatform(NoProgrammer, Colorlight_5A75B_R70Platform):
    """The amaranth-boards platform with port 1 freed of the shared PHY pins; builds need
    no programmer (openFPGALoader is only for flashing, docs/boards.md)."""

    resources = [  # noqa: RUF012 (amaranth-boards declares it so)
        *(r for r in Colorlight_5A75B_R70Platform.resources
          if not (r.name == "eth_rgmii" and r.number == 1)),
        Resource("eth_rgmii", 1,
            Subsignal("tx_clk",  Pins("M12", dir="o")),
            Subsignal("tx_ctl",  Pins("R15", dir="o")),
            Subsignal("tx_data", Pins("T14 R12 R13 R14", dir="o")),
            Subsignal("rx_clk",  Pins("M16", dir="i")),
            Subsignal("rx_ctl",  Pins("L15", dir="i")),
            Subsignal("rx_data", Pins("P13 N13 P14 M15", dir="i")),
            Attrs(IO_TYPE="LVCMOS33"),
        ),
    ]  # fmt: skip


def _leds(platform, m: Module, status: dict) -> None:
    led = platform.request("led", 0)
    links = status["link"][0] & status["link"][1]
    busy = status["activity"][0] | status["activity"][1]
    phase = Signal(26)  # traffic blinks it at 125 MHz / 2^23 = 15 Hz, an SDRAM fault at 1.9
    m.d.sync += phase.eq(phase + 1)
    m.d.comb += led.o.eq(Mux(status["fault"], phase[-1], links & ~(busy & phase[22])))


BOARD = Board(
    name="colorlight",
    platform=ColorlightPlatform,
    params=PARAMS,
    pll=(1, 5, 5),  # 25 MHz -> 125 MHz (yowasp-ecppll -i 25 -o 125 --clkout1 52.08)
    core_div=12,  # the core clock: 625 / 12 = 52.08 MHz (docs/boards.md, "Clocks")
    # the placer's top DCCs (X31/Y0) took no route from the fabric on the whole NIC
    reset_dccs=(("sync", "X31/Y50/BDCC0"), ("core", "X31/Y50/BDCC1")),
    eth=(0, 1),
    leds=_leds,
    description="Colorlight 5A-75B r7.0, LFE5U-25F-6, two GbE ports (host, network)",
    sdram=SdramSpec(),  # 2 x M12L16161A, one 32-bit bus, at 62.5 MHz (VCO / 10)
    sdram_c=16384,  # accumulators and gather slots in SDRAM (docs/boards.md)
)
