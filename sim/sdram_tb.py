"""cocotb bench (run by sim/sdram_sim.py): litedram's controller, simulation variant,
behind SdramInit.

The first user port (the config's "port"; the others stay idle) is driven at full rate
from three queues (commands, write data, read data). Each test writes what it measured
to the JSON file the pytest side names, and checks what it read against what it wrote.
"""

from __future__ import annotations

import json
import random
from collections import deque
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, RisingEdge, with_timeout

from optireduce.sim.cocotb_run import bench_config

INIT_BOUND_CYCLES = 40_000  # the program waits 20 400 cycles; each write takes a few
DRAIN_BOUND_CYCLES = 200_000


def pin(dut, name: str):
    """The driven user port's signal `name`."""
    return getattr(dut, f"{bench_config()['port']}__{name}")


class Port:
    """Drives cmd and wdata from queues, takes every rdata word; notes the cycle of every
    refresh (the refresher's completion strobe)."""

    def __init__(self, dut) -> None:
        self.dut = dut
        self.pin = {
            n: pin(dut, n)
            for n in (
                "cmd_valid",
                "cmd_ready",
                "cmd_we",
                "cmd_addr",
                "wdata_valid",
                "wdata_ready",
                "wdata_data",
                "rdata_valid",
                "rdata_data",
            )
        }
        self.cmds: deque[tuple[int, int]] = deque()  # (we, addr)
        self.wdata: deque[int] = deque()
        self.rdata: list[int] = []
        self.on_rdata = None  # optional callback(word)
        self.writes_done = 0
        self.refresh_cycles: list[int] = []
        self.cycle = 0

    async def run(self) -> None:
        d, p = self.dut, self.pin
        refresh = getattr(d.litedram, bench_config()["refresh_pulse"])
        while True:
            self._present()
            await RisingEdge(d.clk)
            self.cycle += 1
            if p["cmd_valid"].value and p["cmd_ready"].value:
                self.cmds.popleft()
            if p["wdata_valid"].value and p["wdata_ready"].value:
                self.wdata.popleft()
                self.writes_done += 1
            if p["rdata_valid"].value:
                w = int(p["rdata_data"].value)
                self.rdata.append(w)
                if self.on_rdata:
                    self.on_rdata(w)
            if refresh.value:
                self.refresh_cycles.append(self.cycle)

    def _present(self) -> None:
        p = self.pin
        p["cmd_valid"].value = int(bool(self.cmds))
        if self.cmds:
            p["cmd_we"].value, p["cmd_addr"].value = self.cmds[0]
        p["wdata_valid"].value = int(bool(self.wdata))
        if self.wdata:
            p["wdata_data"].value = self.wdata[0]

    async def drain(self, reads: int, writes: int) -> int:
        """Wait (bounded) until `reads` words came back and `writes` were taken; cycles."""
        start = self.cycle
        while len(self.rdata) < reads or self.writes_done < writes:
            await RisingEdge(self.dut.clk)
            assert self.cycle - start < DRAIN_BOUND_CYCLES, "the controller stopped answering"
        assert not self.dut.underrun.value, "the controller took a write word not yet there"
        return self.cycle - start

    def refreshes(self, since: int) -> int:
        return sum(c > since for c in self.refresh_cycles)


async def _start(dut) -> Port:
    Clock(dut.clk, 16, unit="ns").start()
    dut.rst.value = 1
    pin(dut, "cmd_valid").value = 0
    pin(dut, "wdata_valid").value = 0
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await with_timeout(First(RisingEdge(pin(dut, "ready")), RisingEdge(dut.error)),
                       INIT_BOUND_CYCLES * 16, "ns")  # fmt: skip
    assert not dut.error.value, "the init program got no acknowledge"
    port = Port(dut)
    cocotb.start_soon(port.run())
    return port


def _report(key: str, value) -> None:
    out = Path(bench_config()["out"])
    data = json.loads(out.read_text()) if out.exists() else {}
    data[key] = value
    out.write_text(json.dumps(data, indent=1))


@cocotb.test()
async def data_round_trip(dut):
    """Random words over row and bank boundaries read back as written; a read right
    behind a write to the same word returns the new word."""
    port = await _start(dut)
    rng = random.Random(bench_config().get("seed", 1))
    base, n = 0x3FE80, 1024  # row|bank|column: rows 0x1FF to 0x201, both banks
    words = [rng.getrandbits(32) for _ in range(n)]
    port.cmds.extend((1, base + k) for k in range(n))
    port.wdata.extend(words)
    port.cmds.extend((0, base + k) for k in range(n))
    await port.drain(n, n)
    assert port.rdata == words
    x, v1, v2 = 0x1234, 0xA5A5_0001, 0x5A5A_0002
    port.rdata.clear()
    port.cmds.extend([(1, x), (0, x), (1, x), (0, x)])
    port.wdata.extend([v1, v2])
    await port.drain(2, n + 2)
    assert port.rdata == [v1, v2]
    _report("data_round_trip", {"words": n})


@cocotb.test()
async def throughput(dut):
    """Cycles per word for a write stream, a read stream and read-modify-write in
    batches (the aggregator's pattern); refreshes counted in each."""
    port = await _start(dut)
    cfg = bench_config()
    n, batch = cfg["n"], cfg["batch"]
    out = {}

    c0 = port.cycle
    port.cmds.extend((1, k) for k in range(n))
    port.wdata.extend(range(n))
    await port.drain(0, n)
    out["write"] = {"words": n, "cycles": port.cycle - c0, "refreshes": port.refreshes(c0)}

    c0 = port.cycle
    port.rdata.clear()
    port.cmds.extend((0, k) for k in range(n))
    await port.drain(n, n)
    assert port.rdata == list(range(n))
    out["read"] = {"words": n, "cycles": port.cycle - c0, "refreshes": port.refreshes(c0)}

    c0 = port.cycle
    port.rdata.clear()
    port.on_rdata = lambda w: port.wdata.append((w + 3) & 0xFFFF_FFFF)
    for b in range(0, n, batch):
        port.cmds.extend((0, k) for k in range(b, b + batch))
        port.cmds.extend((1, k) for k in range(b, b + batch))
    await port.drain(n, 2 * n)
    out["rmw"] = {"words": n, "cycles": port.cycle - c0, "refreshes": port.refreshes(c0),
                  "batch": batch}  # fmt: skip
    port.on_rdata = None
    port.rdata.clear()
    port.cmds.extend((0, k) for k in range(n))
    await port.drain(n, 2 * n)
    assert port.rdata == [k + 3 for k in range(n)]
    gaps = [b - a for a, b in zip(port.refresh_cycles[:-1], port.refresh_cycles[1:], strict=True)]
    out["refresh_gap_cycles"] = {"min": min(gaps), "max": max(gaps), "n": len(gaps)}
    _report("throughput", out)
