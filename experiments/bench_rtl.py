"""`optireduce bench rtl`: cycles per element, latency and ECP5 area of every block.

Each block's sim/benches/fig_<block>.py measures its own rate and latency in
amaranth.sim (no backpressure) and names the component to synthesize; the area
comes from yosys synth_ecp5 (experiments/area.py). Chains are measured the same way on
the composed encoder and decoder.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from optireduce.experiments.area import ecp5_area

BLOCKS = (
    "quantizer",
    "sign_flip",
    "fwht",
    "saturate",
    "packetizer",
    "parser",
    "aggregator",
    "gather_buffer",
    "block_divider",
    "dequantizer",
    "rgmii_mac",
)
CHAINS = ("encode_packetize", "gather_decode")


def _figures(kind: str, name: str, area: bool) -> dict:
    mod = importlib.import_module(f"optireduce.experiments.figures.fig_{name}")
    out = dict(mod.figures())
    if area:
        comp, top = mod.area_component()
        a = ecp5_area(comp, top)
        out.update(luts=a["luts"], brams=a["brams"], ffs=a["ffs"], dsps=a["dsps"])
    return out


def bench_rtl(
    area: bool = True, progress: Callable[[str], object] | None = None, quick: bool = False
) -> dict:
    """Every block and chain; quick: the first three blocks, no chain (a smoke run)."""
    result: dict = {"blocks": {}, "chains": {}}
    for name in BLOCKS[:3] if quick else BLOCKS:
        if progress:
            progress(name)
        result["blocks"][name] = _figures("block", name, area)
    for name in () if quick else CHAINS:
        if progress:
            progress(name)
        result["chains"][name] = _figures("chain", name, False)
    return result
