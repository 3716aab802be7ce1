"""litedram's controller under Verilator: its data checks and its throughput, in cycles.

The figures are cycle counts of the simulated controller against litedram's SDRAM
model (its refresh, bank and turnaround timing at `spec.clk_mhz`), so they are the
same on every machine and every run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from optireduce.hw.sdram_controller import SdramController, SdramSpec
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.sdram_gen import generate

BENCH = "optireduce.sim.sdram_tb"


def run(spec: SdramSpec, testcase: str, **config: int) -> dict:
    """Run one cocotb test of the bench (raises if it fails); returns what it reported.
    The tools' output goes to build/litedram/<core>/<testcase>.log."""
    core = generate(spec, sim=True)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.json"
        cfg = {**config, "out": str(out), "refresh_pulse": core.refresh_pulse}
        log = core.verilog.parents[1] / f"{testcase}.log"
        run_bench(SdramController(core), "sdram_sim", BENCH, cfg, testcase=testcase,
                  sources=(core.verilog,), log_file=log)  # fmt: skip
        if not out.exists():
            raise RuntimeError(f"{BENCH}.{testcase} reported nothing (log: {log})")
        return json.loads(out.read_text())


def throughput(spec: SdramSpec, *, n: int = 8192, batch: int = 256) -> dict:
    """Cycles, words and refreshes of a write stream, a read stream and read-modify-write
    in batches of `batch` words."""
    return run(spec, "throughput", n=n, batch=batch)["throughput"]
