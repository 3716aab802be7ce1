"""The SDRAM controller from litedram: generated Verilog, its register map and its init
program, cached by configuration under build/litedram/.

litedram (PyPI) writes a standalone controller for one SDRAM chip set: the same
refresher, bank machines and timing checks in both variants. `sim=False` gives the
board's (GENSDRPHY: the pins of the 5A-75B's SDR SDRAM); `sim=True` replaces the PHY
and the chips by litedram's SDRAMPHYModel, so Verilator runs the controller against
memory that answers as the chips would. The generator runs in a child process: migen
keeps global state and its imports take seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from filelock import FileLock

from optireduce.hw.sdram_controller import SdramCore, SdramSpec
from optireduce.hw.sdram_init import DFII_BITS
from optireduce.sim.toolchain import FIX, ToolchainError
from optireduce.sim.verilog import BUILD

CORE_NAME = "litedram_core"
GEN_TIMEOUT_S = 600
# LiteX stamps its header with the date and the working directory's git revision; they
# are dropped so that one configuration always gives the same text (and one Verilator build)
STAMP = re.compile(r"^// (LiteX sha1|Date)\s*:.*\n", re.M)
# litedram drives the board's data pins through its own TRELLIS_IO cells but declares
# the port an input: it is made the inout it is, so the top's pins reach those cells
DQ_PORT = re.compile(r"^(\s*)input(\s+wire\s+\[\d+:0\]\s+sdram_dq,)", re.M)


def _key(spec: SdramSpec, sim: bool) -> str:
    """What the output depends on: the configuration, the tools' versions, this code."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tools = {t: version(t) for t in ("litedram", "litex", "migen")}
    except PackageNotFoundError as e:
        raise ToolchainError(f"{e.name} is not installed: {FIX}") from e
    me = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    text = json.dumps({**asdict(spec), "sim": sim, **tools, "generator": me})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def generate(spec: SdramSpec, *, sim: bool) -> SdramCore:
    """The controller for `spec` (generated once per configuration and tool versions)."""
    out = BUILD / "litedram" / f"{'sim' if sim else 'board'}-{_key(spec, sim)}"
    out.mkdir(parents=True, exist_ok=True)
    info = out / "core.json"
    with FileLock(str(out / ".lock"), timeout=GEN_TIMEOUT_S):
        if not info.exists():
            cmd = [sys.executable, "-m", "optireduce.sim.sdram_gen", json.dumps(asdict(spec)),
                   "sim" if sim else "board", str(out)]  # fmt: skip
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=GEN_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                raise ToolchainError(f"litedram's generator took over {GEN_TIMEOUT_S} s") from e
            if res.returncode != 0 or not info.exists():
                tail = "\n".join((res.stdout + res.stderr).splitlines()[-15:])
                raise ToolchainError(f"litedram's generator failed ({' '.join(cmd)}):\n{tail}")
    core = SdramCore.from_json(json.loads(info.read_text()), out)
    if core.addr_width != spec.addr_bits:
        raise ToolchainError(f"litedram's port for {spec.module} has {core.addr_width} address "
                             f"bits, SdramSpec.addr_bits says {spec.addr_bits}")  # fmt: skip
    return core


def _init_program(settings) -> list[list[int]]:
    """litedram's init sequence for this PHY as [address, bank, is_control, bits, delay]."""
    from litedram.init import get_sdram_phy_init_sequence

    seq, _ = get_sdram_phy_init_sequence(settings.phy, settings.timing)
    steps = []
    for _comment, a, ba, cmd, delay in seq:
        bits = 0
        for name in cmd.split("|"):
            bits |= DFII_BITS[name.strip()]
        steps.append([a, ba, int(cmd.startswith("DFII_CONTROL")), bits, delay])
    return steps


def _worker(spec: SdramSpec, sim: bool, out: Path) -> None:
    """In the child: run litedram's generator and write core.json."""
    from litedram import modules, phy
    from litedram.gen import LiteDRAMCore
    from litex.build.lattice import LatticePlatform
    from litex.build.sim import SimPlatform
    from litex.soc.integration.builder import Builder

    config = {
        "cpu": None, "device": spec.device, "memtype": "SDR",
        "sdram_module": getattr(modules, spec.module), "sdram_module_nb": spec.data_width // 8,
        "sdram_rank_nb": 1, "sdram_phy": phy.GENSDRPHY, "sys_clk_freq": spec.clk_mhz * 1e6,
        "user_ports": {name: {"type": "native", "data_width": spec.data_width}
                       for name in spec.ports},
    }  # fmt: skip
    plat = SimPlatform("", io=[]) if sim else LatticePlatform(spec.device, io=[],
                                                               toolchain="trellis")  # fmt: skip
    soc = LiteDRAMCore(plat, config, integrated_rom_size=0xC000)
    builder = Builder(soc, output_dir=str(out), compile_software=False, compile_gateware=False,
                      csr_csv=str(out / "csr.csv"))  # fmt: skip
    builder.build(build_name=CORE_NAME, regular_comb=False)
    csr = {}
    for line in (out / "csr.csv").read_text().splitlines():
        f = line.split(",")
        if f[0] == "csr_register":
            csr[f[1]] = int(f[2], 16)
    vpath = out / "gateware" / f"{CORE_NAME}.v"
    verilog = STAMP.sub("", vpath.read_text())
    if not sim:
        verilog, n = DQ_PORT.subn(r"\1inout \2", verilog)
        if n != 1:
            raise SystemExit("the generated controller has no sdram_dq input port to correct")
    vpath.write_text(verilog)
    refresh = re.search(r"^reg\s+(\w+_sequencer_done1)\b", verilog, re.M)  # the refresher's
    if refresh is None:
        raise SystemExit("the generated controller has no refresh sequencer register")
    settings = soc.sdram.controller.settings
    port = soc.sdram.crossbar.masters[0]
    tmp = out / "core.json.tmp"
    tmp.write_text(json.dumps({
        "spec": asdict(spec), "sim": sim, "verilog": f"gateware/{CORE_NAME}.v", "csr": csr,
        "init": _init_program(settings), "addr_width": len(port.cmd.addr),
        "data_width": len(port.wdata.data), "cl": settings.phy.cl,
        "refresh_pulse": refresh.group(1),
    }, indent=1))  # fmt: skip
    tmp.replace(out / "core.json")  # whole, or not there


if __name__ == "__main__":
    _worker(SdramSpec(**json.loads(sys.argv[1])), sys.argv[2] == "sim", Path(sys.argv[3]))
