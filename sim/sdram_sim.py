"""litedram's controller under Verilator: its data checks and its throughput, in cycles.

The figures are cycle counts of the simulated controller against litedram's SDRAM
model (its refresh, bank and turnaround timing at `spec.clk_mhz`), so they are the
same on every machine and every run.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from amaranth import ClockDomain, DomainRenamer, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

from optireduce import host_port, ubt
from optireduce.host.model.virtual_cluster import _run as run_cluster
from optireduce.hw.aggregator import event_layout
from optireduce.hw.axis import PlainStreams
from optireduce.hw.nic_core import NicCore
from optireduce.hw.sdram_aggregator import SdramAggregator
from optireduce.hw.sdram_controller import (
    SdramController,
    SdramSpec,
    connect_memory,
    memory_ports,
)
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import field_places, run_bench
from optireduce.sim.replay import cmd_bits, config_writes, replay
from optireduce.sim.sdram_gen import generate

BENCH = "optireduce.sim.sdram_tb"
HOST_GBPS = 1.0  # the host port's link: START words come no faster (headers not counted)


def run(spec: SdramSpec, testcase: str, **config: int) -> dict:
    """Run one cocotb test of the bench (raises if it fails); returns what it reported.
    The tools' output goes to build/litedram/<core>/<testcase>.log."""
    core = generate(spec, sim=True)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.json"
        cfg = {
            **config,
            "out": str(out),
            "refresh_pulse": core.refresh_pulse,
            "port": spec.ports[0],
        }  # the bench drives the first port; the others idle
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


def nic_rate_inputs(p: NicParams, world: int, seed: int = 0) -> dict:
    """Rank 0's inputs for one op of p.c elements in a lossless run of `world` ranks (the
    model's virtual cluster): its CSR writes, its START (the command word and the chunk's
    float32 bits), the peers' scatter frames to it in the order they came, and what the
    model sends for them all at one tick (its own scatter frames and its means)."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(p.c).astype(np.float32) for _ in range(world)]
    got: dict = {"peers": []}

    def tap(kind: str, tick: int, rank: int, what: object) -> None:
        if rank != 0:
            return
        if kind == "start":
            got["start"] = what  # (op_id, chunk, exponent)
        elif ubt.UbtHeader.unpack(what, ubt.L2_L4_LEN).msg_type == ubt.MSG_SCATTER:
            got["peers"].append(bytes(what))

    run_cluster(xs, p.c, p, drop_rate=0.0, seed=seed, lost_set=set(), latency_us=5,
                link_gbps=10.0, tap=tap)  # fmt: skip
    op_id, chunk, exp = got["start"]
    host = [host_port.config_frame(p, 0, world),
            *host_port.chunk_frames(host_port.START, op_id, chunk, exp)]  # fmt: skip
    model = replay([(0, f) for f in (*host, *got["peers"])], backend="model")
    words = np.asarray(chunk, dtype=np.float32).view(np.uint32)
    return {
        "csr": config_writes(p, 0, world),
        "start": op_id | len(chunk) << 32 | cmd_bits(exp) << 64,
        "words": [int(w) for w in words],
        "peer_frames": [f.hex() for f in got["peers"]],
        # what it sends before any time passes (replay then runs the op to its deadlines)
        "model_frames": sorted(
            f.hex() for t, f in model.frames if t == 0 and not host_port.is_host_frame(f)
        ),
    }


def nic_aggregation_rate(
    spec: SdramSpec, p: NicParams, world: int, core_mhz: float, seed: int = 0
) -> dict:
    """The NIC core on the controller (sim/nic_rate_tb.py), the core at `core_mhz`, the
    store and the controller at spec.clk_mhz (one clock if they are equal): one op of
    rank 0's, its words at the host link's pace, its peers' scatter frames offered back
    to back meanwhile. Returns the
    bench's report (`host`, `taken`, `summed`, `phase1`: cycles and ns from the first
    peer beat; `beats`), the peers' frames and elements, and whether the frames the core
    sent are the model's."""
    ins = nic_rate_inputs(p, world, seed)
    top = NicOnSdram(p, spec, two_clocks=core_mhz != spec.clk_mhz)
    with tempfile.TemporaryDirectory() as d:
        out, bulk = Path(d) / "report.json", Path(d) / "inputs.json"  # too big for the env
        bulk.write_text(json.dumps({k: ins[k] for k in ("csr", "words", "peer_frames")}))
        cfg = {"out": str(out), "inputs": str(bulk), "clk_ps": _period_ps(core_mhz),
               "sdram_clk_ps": _period_ps(spec.clk_mhz), "start": ins["start"],
               "host_rate": min(1.0, HOST_GBPS * 1e3 / 32 / core_mhz),
               "frames_out": len(ins["model_frames"]),
               # rank 0's slots (0, world, 2 world, ...) from every rank
               "store_beats": len(range(0, p.c // p.p, world)) * p.p * world}  # fmt: skip
        log = top.core.verilog.parents[1] / "nic_aggregation_rate.log"
        run_bench(top, "nic_on_sdram", "optireduce.sim.nic_rate_tb", cfg,
                  sources=(top.core.verilog,), log_file=log)  # fmt: skip
        if not out.exists():
            raise RuntimeError(f"the NIC rate bench reported nothing (log: {log})")
        rep = json.loads(out.read_text())
    sent = rep.pop("sent")
    rep["frames_sent"] = len(sent)
    rep["same_as_model"] = sorted(sent) == ins["model_frames"]
    rep["peer_frames"] = len(ins["peer_frames"])
    rep["peer_elements"] = sum(ubt.UbtHeader.unpack(bytes.fromhex(f), ubt.L2_L4_LEN).count
                               for f in ins["peer_frames"])  # fmt: skip
    return rep


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
        controller(m, ctrl, self.sdram_clk if self.two_clocks else None)
        _pass_through(m, self, agg, skip=self.EXTRA)
        wiring.connect(m, agg.mem, ctrl.port)
        m.d.comb += [self.underrun.eq(ctrl.underrun), self.error.eq(ctrl.error)]
        return m


def controller(m: Module, ctrl: SdramController, sdram_clk: Signal | None) -> None:
    """`ctrl` in `sync`, or (`sdram_clk` given) in a domain `sdram` of that clock, reset
    from `sync`'s reset through a synchronizer."""
    if sdram_clk is None:
        m.submodules.ctrl = ctrl
        return
    m.domains.sdram = cd = ClockDomain("sdram", local=True)
    m.d.comb += cd.clk.eq(sdram_clk)
    m.submodules.sdram_reset = ResetSynchronizer(ResetSignal("sync"), domain="sdram")
    m.submodules.ctrl = DomainRenamer({"sync": "sdram"})(ctrl)


def _pass_through(
    m: Module, outer: wiring.Component, inner: wiring.Component, skip: tuple[str, ...] = ()
) -> None:
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
    """NicCore(p) with its accumulators and gather slots on the simulated controller (a
    port each): the core's ports, so
    that the co-simulation harness drives it as it drives NicCore. With `two_clocks`,
    the store and the controller run on `sdram_clk` (an input), as on the 25F.
    A controller fault (its init unanswered, a write word it took before it was there)
    holds `idle` low: the harness stops with a bounded wait's error rather than give
    results the SDRAM did not hold."""

    def __init__(
        self, p: NicParams, spec: SdramSpec | None = None, two_clocks: bool = False
    ) -> None:
        self.core = generate(spec or SdramSpec(), sim=True)
        if p.sdram_addr_bits != self.core.addr_width:
            raise ValueError(f"NicOnSdram: sdram_addr_bits={p.sdram_addr_bits}, the "
                             f"controller's port has {self.core.addr_width}")  # fmt: skip
        self.two_clocks = two_clocks
        self.nic = NicCore(p, sdram_domain="sdram" if two_clocks else "sync")
        self.ctrl = SdramController(self.core)
        mem = set(memory_ports(self.nic).values())
        ports = {n: mb for n, mb in self.nic.signature.members.items() if n not in mem}
        extra = {"sdram_clk": In(1)} if two_clocks else {}
        super().__init__({**ports, **extra})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.nic = nic = self.nic
        ctrl = self.ctrl
        controller(m, ctrl, self.sdram_clk if self.two_clocks else None)
        _pass_through(m, self, nic, skip=("idle", "sdram_clk"))
        connect_memory(m, nic, ctrl)
        m.d.comb += self.idle.eq(nic.idle & ~ctrl.underrun & ~ctrl.error)
        return m
