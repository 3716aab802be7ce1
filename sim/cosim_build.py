"""Build the co-simulation harnesses: the Verilated NIC core plus sim/cosim/nic_harness.cpp
(the live `sim` backend and the replay), and the Verilated board shell plus
sim/cosim/board_harness.cpp (the virtual board).

One executable per configuration, cached under build/cosim/<hash>/ (the hash covers
the top's Verilog and the harness sources), so a rebuild happens only when one of
them changes. A file lock makes concurrent pytest-xdist workers build it once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

from amaranth.lib import wiring
from filelock import FileLock

from optireduce.params import NicParams
from optireduce.sim import ico_gate, verilog
from optireduce.sim.toolchain import FIX, ToolchainError, use_verilator

HARNESS_DIR = Path(__file__).resolve().parent / "cosim"
TOP = "nic_core"
BOARD_TOP = "virtual_board"
SOURCES = {TOP: ("nic_harness.cpp",), BOARD_TOP: ("board_harness.cpp",)}
SHARED = ("harness.hpp",)
BUILD_TIMEOUT_S = 1800
_BUILT: dict[tuple[str, NicParams], Path] = {}


def _top(top: str, p: NicParams) -> tuple[wiring.Component, tuple[Path, ...]]:
    """The top for `p` and the Verilog it needs besides its own."""
    if top == BOARD_TOP:
        from optireduce.hw.virtual_board import VirtualBoard

        return VirtualBoard(p), ()
    if p.sdram_addr_bits:  # the accumulators on litedram's simulated controller
        from optireduce.sim.sdram_sim import NicOnSdram

        nic = NicOnSdram(p)
        return nic, (nic.core.verilog,)
    from optireduce.hw.nic_core import NicCore

    return NicCore(p), ()


def harness_path(p: NicParams, component: wiring.Component | None = None) -> Path:
    """The harness executable for NicCore(p) (or `component`, which must have the
    NicCore ports); built on first use. ToolchainError names the fix if Verilator
    is missing; RuntimeError carries the compiler's output if the build fails."""
    return _harness(TOP, p, component)


def board_harness_path(p: NicParams) -> Path:
    """The virtual board's executable: VirtualBoard(p) and sim/cosim/board_harness.cpp
    (built on first use, as harness_path)."""
    return _harness(BOARD_TOP, p, None)


def build_params(p: NicParams) -> NicParams:
    """The parameters a harness is built with: p but for those that only set a register's
    reset value (t_B, t_C's floor and first value). Every host writes all configuration
    registers from its own NicParams before its first op (sim/replay.py: config_writes),
    so one build serves every run that differs in them: the replays' short deadlines and
    the live runs' long ones."""
    t_b = min(NicParams().t_b_us, (1 << p.t_b_bits) - 1)  # within a narrow clock's bound
    return p.replace(t_b_us=t_b, t_c_min_us=1, t_c_init_us=None)


def _harness(top: str, p: NicParams, component: wiring.Component | None) -> Path:
    p = build_params(p) if component is None else p
    if component is None and (top, p) in _BUILT and _BUILT[top, p].exists():
        return _BUILT[top, p]  # elaborating the core takes seconds: once per process
    root = use_verilator()
    own = component is None  # the top for p: the executable is kept for this process
    top_component, more = _top(top, p) if own else (component, ())
    vpath = verilog.write(top_component, top, kind="cosim")
    h = hashlib.sha256(vpath.read_bytes())
    for path in (*(HARNESS_DIR / n for n in (*SOURCES[top], *SHARED)), *more):
        h.update(path.read_bytes())
    h.update(Path(ico_gate.__file__).read_bytes())
    out = vpath.parent / f"harness-{h.hexdigest()[:12]}"
    exe = out / Path(SOURCES[top][0]).stem
    with FileLock(str(vpath.parent / ".lock"), timeout=BUILD_TIMEOUT_S):
        if not exe.exists():
            _build(root, (vpath, *more), top, out, exe)
    if own:
        _BUILT[top, p] = exe
    return exe


def _run(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(
            ["nice", *cmd], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except FileNotFoundError as e:
        raise ToolchainError(f"cannot run {cmd[0]}: {e}: {FIX}") from e
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-4000:]
        raise RuntimeError(f"the harness {what} failed ({' '.join(cmd)}):\n{tail}")


def _build(root: Path, verilog_files: tuple[Path, ...], top: str, out: Path, exe: Path) -> None:
    """Verilate, gate the input-combinational region (sim/ico_gate.py), compile."""
    if not (root / "include" / "verilated.h").exists():
        raise ToolchainError(f"{root}/include/verilated.h is missing: {FIX}")
    out.mkdir(parents=True, exist_ok=True)
    mdir, prefix = out / "obj", f"V{top}"
    t0 = time.monotonic()
    print(f"optireduce: building the co-simulation harness in {out} ...", file=sys.stderr)
    _run([
        str(root / "bin" / "verilator"), "--cc", "--exe", "-O3", "-Wno-fatal", "-Wno-lint",
        "-Wno-style", "--top-module", top, "-CFLAGS", "-std=c++17", "--Mdir", str(mdir),
        "-o", str(exe), *map(str, verilog_files), *(str(HARNESS_DIR / n) for n in SOURCES[top]),
    ], "verilation")  # fmt: skip
    ico_gate.gate_ico(mdir, prefix)
    _run(["make", "-C", str(mdir), "-f", f"{prefix}.mk", "-j", "2", "OPT_FAST=-O2",
          "OPT_SLOW=-O1"], "compilation")  # fmt: skip
    if not exe.exists():
        raise RuntimeError(f"the harness build made no {exe}")
    shutil.rmtree(mdir, ignore_errors=True)  # ~150 MB of objects; the exe stands alone
    print(f"optireduce: harness built in {time.monotonic() - t0:.0f} s", file=sys.stderr)
