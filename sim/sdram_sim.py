"""litedram's controller under Verilator: its data checks and its throughput, in cycles.

The figures are cycle counts of the simulated controller against litedram's SDRAM
model (its refresh, bank and turnaround timing at `spec.clk_mhz`), so they are the
same on every machine and every run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from amaranth import ClockDomain, DomainRenamer, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from optireduce.hw.aggregator import event_layout
from optireduce.hw.axis import PlainStreams
from optireduce.hw.nic_core import NicCore
from optireduce.hw.sdram_aggregator import SdramAggregator
from optireduce.hw.sdram_controller import SdramController, SdramSpec
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import field_places, run_bench
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


def _period_ps(mhz: float) -> int:
    """A clock's period in whole ps, even (cocotb's Clock halves it)."""
    return 2 * round(1e6 / mhz / 2)


def aggregation_rate(
    spec: SdramSpec, p: NicParams, world: int, core_mhz: float | None = None
) -> dict:
    """SdramAggregator on the controller (sim/sdram_aggregator_tb.py): one op of p.c
    elements from a full `world`, ingested as fast as taken, then read out; cycles of
    the aggregator's clock and simulated ns. The controller and the store run at
    `spec.clk_mhz`, the aggregator at `core_mhz` (the same clock if None)."""
    two = core_mhz is not None and core_mhz != spec.clk_mhz
    top = AggregatorOnSdram(p, 0, spec, two_clocks=two)
    core = top.core
    layout = field_places(event_layout(p))
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.json"
        cfg = {"out": str(out), "refresh": [core.refresh_pulse], "layout": layout,
               "world": world, "c": p.c, "p": p.p, "t_b": (1 << 31) - 1,
               "clk_ps": _period_ps(core_mhz if two else spec.clk_mhz)}  # fmt: skip
        if two:
            cfg["sdram_clk_ps"] = _period_ps(spec.clk_mhz)
        log = core.verilog.parents[1] / "aggregation_rate.log"
        name = "sdram_aggregation_2clk" if two else "sdram_aggregation"
        run_bench(PlainStreams(top, ev="whole", i="fields", o="fields"), name,
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
    the controller's `underrun` and `error`. With `two_clocks`, the store and the
    controller run on `sdram_clk` (an input; their reset follows `sync`'s through a
    synchronizer), the aggregator on `sync`'s."""

    EXTRA = ("underrun", "error", "sdram_clk")

    def __init__(
        self, p: NicParams, base: int, spec: SdramSpec | None = None, two_clocks: bool = False
    ) -> None:
        self.core = generate(spec or SdramSpec(), sim=True)
        self.two_clocks = two_clocks
        domain = "sdram" if two_clocks else "sync"
        self.agg = SdramAggregator(p, self.core.addr_width, base=base, mem_domain=domain)
        self.ctrl = SdramController(self.core)
        ports = {n: mb for n, mb in self.agg.signature.members.items() if n != "mem"}
        extra = {"sdram_clk": In(1)} if two_clocks else {}
        super().__init__({**ports, "underrun": Out(1), "error": Out(1), **extra})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.agg = agg = self.agg
        ctrl = self.ctrl
        if self.two_clocks:
            m.domains.sdram = cd = ClockDomain("sdram", local=True)
            m.d.comb += cd.clk.eq(self.sdram_clk)
            m.submodules.sdram_reset = ResetSynchronizer(ResetSignal("sync"), domain="sdram")
            m.submodules.ctrl = DomainRenamer({"sync": "sdram"})(ctrl)
        else:
            m.submodules.ctrl = ctrl
        _pass_through(m, self, agg, skip=self.EXTRA)
        wiring.connect(m, agg.mem, ctrl.port)
        m.d.comb += [self.underrun.eq(ctrl.underrun), self.error.eq(ctrl.error)]
        return m


def _pass_through(m: Module, outer: wiring.Component, inner: wiring.Component, skip=()) -> None:
    """Connect each of `outer`'s ports (but `skip`) to `inner`'s of the same name."""
    for name, mb in outer.signature.members.items():
        if name in skip:
            continue
        if mb.is_signature:
            wiring.connect(m, wiring.flipped(getattr(outer, name)), getattr(inner, name))
        elif mb.flow == In:
            m.d.comb += getattr(inner, name).eq(getattr(outer, name))
        else:
            m.d.comb += getattr(outer, name).eq(getattr(inner, name))


class NicOnSdram(wiring.Component):
    """NicCore(p) with its accumulators on the simulated controller, in one clock: the
    core's ports, so that the co-simulation harness drives it as it drives NicCore.
    A controller fault (its init unanswered, a write word it took before it was there)
    holds `idle` low: the harness stops with a bounded wait's error rather than give
    results the SDRAM did not hold."""

    def __init__(self, p: NicParams, spec: SdramSpec | None = None) -> None:
        self.core = generate(spec or SdramSpec(), sim=True)
        if p.sdram_addr_bits != self.core.addr_width:
            raise ValueError(f"NicOnSdram: sdram_addr_bits={p.sdram_addr_bits}, the "
                             f"controller's port has {self.core.addr_width}")  # fmt: skip
        self.nic = NicCore(p)
        self.ctrl = SdramController(self.core)
        ports = {n: mb for n, mb in self.nic.signature.members.items() if n != "acc_mem"}
        super().__init__(ports)

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.nic = nic = self.nic
        m.submodules.ctrl = ctrl = self.ctrl
        _pass_through(m, self, nic, skip=("idle",))
        wiring.connect(m, nic.acc_mem, ctrl.port)
        m.d.comb += self.idle.eq(nic.idle & ~ctrl.underrun & ~ctrl.error)
        return m
