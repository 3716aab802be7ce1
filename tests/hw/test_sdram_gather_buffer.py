"""SdramGatherBuffer on litedram's controller (Verilator, litedram's SDRAM model): the same
bench as GatherBuffer's, against the same model, with the memory's latency, refreshes
and its port's contract in the way."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.gather_buffer import GatherBuffer as ModelBuffer
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.hw.gather_buffer import GatherOp
from optireduce.hw.sdram_controller import SdramController, SdramSpec
from optireduce.hw.sdram_gather_buffer import SdramGatherBuffer
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.sdram_gen import generate
from optireduce.sim.sdram_sim import controller
from optireduce.sim.stream_sim import element_payload, read_element, set_ports, simulate
from tests.hw.sdram_port_model import PortModel

SMALL = NicParams(p=16, b=64, c=1024, n_max=8)  # long enough for several refreshes


class GatherOnSdram(wiring.Component):
    """SdramGatherBuffer wired to the simulated controller; GatherBuffer's ports, plus the
    controller's `underrun` and `error` and the buffer's `fault`. With `two_clocks`, the
    controller and the buffer's issuer run on `sdram_clk` (an input), as in the 25F's core."""

    def __init__(self, p: NicParams, base: int, two_clocks: bool = False) -> None:
        self.core = generate(SdramSpec(), sim=True)
        self.two_clocks = two_clocks
        domain = "sdram" if two_clocks else "sync"
        self.buf = SdramGatherBuffer(p, self.core.addr_width, base=base, mem_domain=domain)
        self.ctrl = SdramController(self.core)
        ports = {n: m for n, m in self.buf.signature.members.items() if n != "mem"}
        extra = {"sdram_clk": In(1)} if two_clocks else {}
        super().__init__({**ports, "underrun": Out(1), "error": Out(1), **extra})

    def elaborate(self, platform) -> Module:
        m = Module()
        m.submodules.buf = buf = self.buf
        ctrl = self.ctrl
        controller(m, ctrl, self.sdram_clk if self.two_clocks else None)
        for name in ("i", "cmd", "o", "k"):  # streams
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(buf, name))
        for name in ("slot", "pkt_index", "contributors", "hist_slot", "hist_addr"):
            m.d.comb += getattr(buf, name).eq(getattr(self, name))
        for name in ("duplicate", "out_of_range", "hist_data", "fault"):
            m.d.comb += getattr(self, name).eq(getattr(buf, name))
        wiring.connect(m, buf.mem, ctrl.port)
        m.d.comb += [self.underrun.eq(ctrl.underrun), self.error.eq(ctrl.error)]
        return m


@pytest.mark.parametrize("two_clocks", [False, True], ids=["one_clock", "two_clocks"])
def test_cocotb_verilator_against_the_model(two_clocks):
    """GatherBuffer's bench on the controller; with two clocks the controller runs at
    150 MHz beside the buffer's 125 (commands and words cross in AsyncFifos)."""
    p = SMALL
    base = (1 << 20) - 2 * p.c  # the slots end at the last word (address bits all used)
    top = GatherOnSdram(p, base, two_clocks=two_clocks)
    cfg = {"p": p.p, "b": p.b, "c": p.c, "lanes": p.lanes, "n_max": p.n_max,
           "refresh": ["block", "block", "ctrl", "litedram", top.core.refresh_pulse],
           "writes_level": ["block", "block", "buf", "buffer", "writes", "level"],
           **({"sdram_clk_ps": 6666} if two_clocks else {})}  # fmt: skip
    bench = f"{__package__}.benches.tb_gather_buffer"
    run_bench(AxisWrapper(PlainStreams(top, cmd="fields", k="axis")),
              f"sdram_gather_top{'_2clk' if two_clocks else ''}", bench, cfg,
              sources=(top.core.verilog,))  # fmt: skip


# ---- the fence, with a port that stalls on purpose (Amaranth simulator) -------------------
def _place_and_drain(
    c: int, open_at: int, drain_at: int, seed: int
) -> tuple[list, list, PortModel]:
    """An op of c words in packets of 8, placed last index first, a DRAIN raised once
    `drain_at` beats are in (it may land mid-packet), the port opened at cycle `open_at`,
    `o` read with random backpressure. Returns (drained, the model's z, the port)."""
    p = NicParams(p=8, b=32, c=c, n_max=8)
    dut = SdramGatherBuffer(p, 20, base=0x100)
    port = PortModel(dut.mem, open_at)
    rng = np.random.default_rng(seed)
    model = ModelBuffer(p, p.packets_for(p.c))
    taken, got = {"beats": 0}, []

    async def inputs(ctx):
        for i in reversed(range(p.packets_for(p.c))):
            vals = rng.integers(-(1 << 31), 1 << 31, p.p)
            model.place(i, vals, 1)
            set_ports(ctx, dut, slot=0, pkt_index=i, contributors=1)
            for j, v in enumerate(vals):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, element_payload([v], j == 0, j == p.p - 1))
                await ctx.tick().until(dut.i.ready)
                taken["beats"] += 1
        ctx.set(dut.i.valid, 0)

    async def bench(ctx):
        for _ in range(BOUND):
            if taken["beats"] >= drain_at:
                break
            await ctx.tick()
        ctx.set(dut.cmd.payload, {"op": GatherOp.DRAIN, "slot": 0, "n": p.c})
        ctx.set(dut.cmd.valid, 1)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        ctx.set(dut.k.ready, 1)
        for cycle in range(BOUND):
            ready = int(rng.random() < 0.6)
            ctx.set(dut.o.ready, ready)
            if ready and ctx.get(dut.o.valid):
                got.append(read_element(ctx.get(dut.o.payload))[0][0])
            if len(got) == p.c:
                return
            if cycle == 0:  # closed 20 more cycles: the drain's reads queue meanwhile
                port.open_at = min(port.open_at, port.cycle + 20)
            await ctx.tick()

    simulate(dut, bench, port.run, inputs)
    return got, model.z.ravel().tolist(), port


BOUND = 5000  # cycles any of these waits may take


@pytest.mark.parametrize(
    ("c", "open_at", "drain_at"),
    [(32, 10**9, 32), (128, 0, 122), (128, 0, 127)],  # 32: all fit the write queue
    ids=["behind_queued_writes", "mid_packet", "with_the_last_beat"],
)
def test_a_drain_reads_what_was_placed(c, open_at, drain_at):
    """The fence: a DRAIN behind writes still queued (the port refuses commands until
    after it), one raised while the last packet (index 0, the first drained) is still
    arriving, one taken with the last beat. Without the fence the drain reads words
    never written (0xDEADBEEF from the port model); with more words asked for than the
    read queue holds, a word would be lost (the backpressure makes `o` slower)."""
    got, want, port = _place_and_drain(c, open_at, drain_at, seed=4)
    assert got == want
    assert port.underruns == 0
    assert sorted(port.mem) == list(range(0x100, 0x100 + c))  # every word at base + index
