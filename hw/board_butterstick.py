"""Great Scott Gadgets / GsD ButterStick r1.0 (LFE5UM5G-85F-8BG381): one KSZ9031 GbE PHY.

Host and network share the one port (hw/board_frames.py splits frames by EtherType).
The seven RGB LEDs share their colour lines: LED 0 shows green = link, blue = traffic,
red = PLL not locked. The Ethernet pins are on fixed 3.3 V banks, so the SYZYGY VCCIO
controller the platform describes is not needed.
"""

from __future__ import annotations

from amaranth import Module
from amaranth_boards.butterstick import ButterStickPlatform

from optireduce.hw.board_top import Board
from optireduce.params import NicParams

PARAMS = NicParams(n_max=8, p=256, b=4096, c=8192)  # the fit: docs/boards.md


def _leds(platform, m: Module, status: dict) -> None:
    leds = platform.request("rgb_leds_muxed", 0)
    m.d.comb += [
        leds.leds.o.eq(1),
        leds.g.o.eq(status["link"][0]),
        leds.b.o.eq(status["activity"][0]),
        leds.r.o.eq(~status["locked"]),
    ]


BOARD = Board(
    name="butterstick",
    platform=ButterStickPlatform,
    params=PARAMS,
    pll=(6, 25, 5),  # 30 MHz -> 125 MHz (yowasp-ecppll -i 30 -o 125 --clkout1 52.08)
    core_div=12,  # the core clock: 625 / 12 = 52.08 MHz (docs/boards.md, "Clocks")
    eth=(0,),
    leds=_leds,
    description="ButterStick r1.0, LFE5UM5G-85F-8, one GbE port (host + network)",
)
