"""What the benches of SDRAM-backed blocks watch inside the design: a signal by its
instance path, and the controller's refreshes (its completion strobe)."""

from __future__ import annotations

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge


def sdram_clock(dut, cfg: dict) -> str:
    """The controller's clock: `sdram_clk` started at cfg["sdram_clk_ps"] when the bench
    has two clocks, else the bench's `clk`. Returns its port's name."""
    if "sdram_clk_ps" not in cfg:
        return "clk"
    Clock(dut.sdram_clk, cfg["sdram_clk_ps"], unit="ps").start()
    return "sdram_clk"


def inner(dut, path: list[str]):
    """A signal inside the design, by instance names (an SDRAM-backed block's config)."""
    for name in path:
        dut = getattr(dut, name)
    return dut


def count_refreshes(
    dut, path: list[str], idle: list[str] | None = None, clock: str = "clk"
) -> dict[str, int]:
    """Counts the strobes of the signal at `path` (in the clock `clock`) from now on, in
    the returned dict's "n"; with `idle` (a signal's path), those while it was low in
    "busy"."""
    refreshes = {"n": 0, "busy": 0}

    async def count():
        sig = inner(dut, path)
        quiet = inner(dut, idle) if idle else None
        while True:
            await RisingEdge(getattr(dut, clock))
            if int(sig.value):
                refreshes["n"] += 1
                refreshes["busy"] += quiet is not None and not int(quiet.value)

    cocotb.start_soon(count())
    return refreshes
