"""Build the co-simulation harness: the Verilated NIC core plus sim/cosim/nic_harness.cpp.

One executable per configuration, cached under build/cosim/<hash>/ (the hash covers
the core's Verilog and the harness source), so a rebuild happens only when one of
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
from optireduce.sim import verilog
from optireduce.sim.toolchain import FIX, ToolchainError, use_verilator

HARNESS_DIR = Path(__file__).resolve().parent / "cosim"
SOURCES = ("nic_harness.cpp",)
TOP = "nic_core"
BUILD_TIMEOUT_S = 1800
_BUILT: dict[NicParams, Path] = {}


def _core(p: NicParams) -> wiring.Component:
    from optireduce.hw.nic_core import NicCore

    return NicCore(p)


def harness_path(p: NicParams, component: wiring.Component | None = None) -> Path:
    """The harness executable for NicCore(p) (or `component`, which must have the
    NicCore ports); built on first use. ToolchainError names the fix if Verilator
    is missing; RuntimeError carries the compiler's output if the build fails."""
    if component is None and p in _BUILT and _BUILT[p].exists():
        return _BUILT[p]  # elaborating the core takes seconds: once per process
    root = use_verilator()
    vpath = verilog.write(component if component is not None else _core(p), TOP, kind="cosim")
    h = hashlib.sha256(vpath.read_bytes())
    for name in SOURCES:
        h.update((HARNESS_DIR / name).read_bytes())
    out = vpath.parent / f"harness-{h.hexdigest()[:12]}"
    exe = out / "nic_harness"
    with FileLock(str(vpath.parent / ".lock"), timeout=BUILD_TIMEOUT_S):
        if not exe.exists():
            _build(root, vpath, out, exe)
    if component is None:
        _BUILT[p] = exe
    return exe


def _build(root: Path, vpath: Path, out: Path, exe: Path) -> None:
    if not (root / "include" / "verilated.h").exists():
        raise ToolchainError(f"{root}/include/verilated.h is missing: {FIX}")
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(root / "bin" / "verilator"), "--cc", "--exe", "--build", "-j", "2",
        "-O3", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--top-module", TOP,
        "-MAKEFLAGS", "OPT_FAST=-O2 OPT_SLOW=-O1",
        "-CFLAGS", "-std=c++17", "--Mdir", str(out / "obj"), "-o", str(exe),
        str(vpath), *(str(HARNESS_DIR / n) for n in SOURCES),
    ]  # fmt: skip
    t0 = time.monotonic()
    print(f"optireduce: building the co-simulation harness in {out} ...", file=sys.stderr)
    try:
        r = subprocess.run(
            ["nice", *cmd], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except FileNotFoundError as e:
        raise ToolchainError(f"cannot run {cmd[0]}: {e}: {FIX}") from e
    if r.returncode != 0 or not exe.exists():
        tail = (r.stdout + r.stderr)[-4000:]
        raise RuntimeError(f"the harness build failed ({' '.join(cmd)}):\n{tail}")
    shutil.rmtree(out / "obj", ignore_errors=True)  # ~150 MB of objects; the exe stands alone
    print(f"optireduce: harness built in {time.monotonic() - t0:.0f} s", file=sys.stderr)
