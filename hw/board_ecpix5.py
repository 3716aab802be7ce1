"""LambdaConcept ECPIX-5 (LFE5UM5G-85F-8BG554): one RTL8211E GbE PHY.

Host and network share the one port (hw/board_frames.py splits frames by EtherType).
LEDs: RGB LED 0 green = link (the PHY's RX clock runs), blue = traffic; LED 1 red =
PLL not locked.
"""

from __future__ import annotations

from amaranth import Module
from amaranth_boards.ecpix5 import ECPIX585Platform

from optireduce.hw.board_top import Board, NoProgrammer
from optireduce.params import NicParams

PARAMS = NicParams(n_max=8, p=256, b=4096, c=8192)  # the fit: docs/boards.md


class Ecpix5Platform(NoProgrammer, ECPIX585Platform):
    """The amaranth-boards platform; builds need no programmer."""


def _leds(platform, m: Module, status: dict) -> None:
    led0, led1 = platform.request("rgb_led", 0), platform.request("rgb_led", 1)
    m.d.comb += [
        led0.g.o.eq(status["link"][0]),
        led0.b.o.eq(status["activity"][0]),
        led1.r.o.eq(~status["locked"]),
    ]


BOARD = Board(
    name="ecpix5",
    platform=Ecpix5Platform,
    params=PARAMS,
    pll=(4, 5, 5),  # 100 MHz -> 125 MHz (yowasp-ecppll -i 100 -o 125 --clkout1 52.08)
    core_div=12,  # the core clock: 625 / 12 = 52.08 MHz (docs/boards.md, "Clocks")
    eth=(0,),
    leds=_leds,
    description="LambdaConcept ECPIX-5, LFE5UM5G-85F-8, one GbE port (host + network)",
)
