"""litedram's controller under Verilator: its data checks and its throughput, in cycles.

The figures are cycle counts of the simulated controller against litedram's SDRAM
model (its refresh, bank and turnaround timing at `spec.clk_mhz`), so they are the
same on every machine and every run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.sdram_aggregator import SdramAggregator
from optireduce.hw.sdram_controller import SdramController, SdramSpec
from optireduce.params import NicParams
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


def aggregation_rate(spec: SdramSpec, p: NicParams, world: int) -> dict:
    """Cycles of SdramAggregator on the controller (sim/sdram_aggregator_tb.py): one op of
    p.c elements from a full `world`, ingested as fast as taken, then read out."""
    from optireduce.hw.aggregator import event_layout
    from optireduce.hw.axis import PlainStreams

    top = AggregatorOnSdram(p, 0, spec)
    core = top.core
    layout = {n: [f.offset, f.width] for n, f in event_layout(p)}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.json"
        cfg = {"out": str(out), "refresh": [core.refresh_pulse], "layout": layout,
               "world": world, "c": p.c, "p": p.p, "t_b": (1 << 31) - 1}  # fmt: skip
        log = core.verilog.parents[1] / "aggregation_rate.log"
        run_bench(PlainStreams(top, ev="whole", i="fields", o="fields"), "sdram_aggregation",
                  "optireduce.sim.sdram_aggregator_tb", cfg, sources=(core.verilog,),
                  log_file=log)  # fmt: skip
        if not out.exists():
            raise RuntimeError(f"the aggregation bench reported nothing (log: {log})")
        return json.loads(out.read_text())


def throughput(spec: SdramSpec, *, n: int = 8192, batch: int = 256) -> dict:
    """Cycles, words and refreshes of a write stream, a read stream and read-modify-write
    in batches of `batch` words."""
    return run(spec, "throughput", n=n, batch=batch)["throughput"]


class AggregatorOnSdram(wiring.Component):
    """SdramAggregator wired to the simulated controller: the aggregator's ports, plus
    the controller's `underrun` and `error`."""

    def __init__(self, p: NicParams, base: int, spec: SdramSpec | None = None) -> None:
        self.core = generate(spec or SdramSpec(), sim=True)
        self.agg = SdramAggregator(p, self.core.addr_width, base=base)
        self.ctrl = SdramController(self.core)
        ports = {n: mb for n, mb in self.agg.signature.members.items() if n != "mem"}
        super().__init__({**ports, "underrun": Out(1), "error": Out(1)})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.agg, m.submodules.ctrl = agg, ctrl = self.agg, self.ctrl
        for name, mb in self.signature.members.items():
            if name in ("underrun", "error"):
                continue
            if mb.is_signature:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(agg, name))
            elif mb.flow == In:
                m.d.comb += getattr(agg, name).eq(getattr(self, name))
            else:
                m.d.comb += getattr(self, name).eq(getattr(agg, name))
        wiring.connect(m, agg.mem, ctrl.port)
        m.d.comb += [self.underrun.eq(ctrl.underrun), self.error.eq(ctrl.error)]
        return m
