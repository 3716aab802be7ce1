"""Every register's input path in an ECP5 netlist, timed with a fixed delay per cell.

nextpnr reports one critical path per run, and a run takes minutes. This reads the
`synth_ecp5` netlist (`experiments/fmax.py: ecp5_netlist`) and times every path from a
register, a memory output or a DSP output to a register, memory or DSP input, with a
fixed cost per cell and per net (speed 6, set from nextpnr's path reports of this
project's blocks; placement is ignored). It ranks the endpoints, so that a block's slow
paths can be seen, and fixed, all at once; nextpnr's Fmax stays the measure.

    python -m optireduce.experiments.logic_depth gather_tracker   # one block
    python -m optireduce.experiments.logic_depth --board ecpix5   # a whole board, ranked by source
    python -m optireduce.experiments.logic_depth --board ecpix5 --domain sync   # one clock's paths
    python -m optireduce.experiments.logic_depth --board colorlight --core loopback --domain sync
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

NET_NS = 0.9  # a routed net, on average (nextpnr: 0.5-1.5 ns inside a block)
CLK_TO_Q = {"TRELLIS_FF": 0.52, "DP16KD": 5.61, "TRELLIS_DPR16X4": 0.0, "MULT18X18D": 2.5}
OUTREG_CLK_TO_Q = 0.96  # a DP16KD output through its own register (REGMODE OUTREG)
# combinational cells: (input port prefix, output port) -> ns inside the cell
_LUT = 0.24
_CARRY_IN = 0.45  # a CCU2C's A/B/C/D to its carry out
_CARRY_STEP = 0.07  # per CCU2C along the chain (dedicated wire, no net)
_SUM = 0.40  # carry in (or an input) to a sum output


@dataclass
class Endpoint:
    ns: float
    sink: str  # register (or memory / DSP) name
    source: str  # the register the slowest path starts from
    cells: int  # combinational cells on that path
    via: tuple[str, str] | None = None  # the cell output driving it (for `path`)
    clock: str = ""  # the sink's clock net


def _base(name: str) -> str:
    """The signal a yosys cell name was made from."""
    return re.sub(r"(_TRELLIS_FF_Q|_LUT4|_PFUMX|_L6MUX21|_CCU2C|\$).*", "", name)


Key = tuple[str, str]  # (cell, output port)
Arrival = tuple[float, str, int, "Key | None"]  # ns, start register, cells, slowest input


def _clock_of(port: str, clks: dict, net_name: dict) -> str:
    """The clock net an input port is sampled on: a DP16KD's A-side ports (DIA3, ADA5,
    WEA, ...) on CLKA and B-side ones on CLKB; a one-clock cell's on its clock."""
    side = re.fullmatch(r"[A-Z]+?([AB])\d*", port)
    bit = clks.get(f"CLK{side.group(1)}") if side and len(clks) > 1 else None
    if bit is None:
        bit = next(iter(clks.values()), None)
    return net_name.get(bit, "") if isinstance(bit, int) else ""


def analyse(netlist: Path, top: str) -> tuple[list[Endpoint], dict]:
    """Every endpoint's arrival time (ns), slowest first, and the trace table for `path`."""
    module = json.loads(netlist.read_text())["modules"][top]
    cells = module["cells"]
    net_name: dict[int, str] = {}  # bit -> its shortest public net name
    for n, info in module.get("netnames", {}).items():
        for b in info["bits"]:
            if isinstance(b, int) and (b not in net_name or len(n) < len(net_name[b])):
                net_name[b] = n
    driver: dict[int, Key] = {}  # bit -> (cell, output port)
    for name, c in cells.items():
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) == "output":
                for b in bits:
                    if isinstance(b, int):
                        driver[b] = (name, port)
    memo: dict[Key, Arrival] = {}
    none: Arrival = (0.0, "", 0, None)

    def arrival(bit) -> Arrival:
        """(ns at the input pin, start register, cells, driver) of a net bit."""
        if not isinstance(bit, int) or bit not in driver:
            return none
        key = driver[bit]
        t, src, n, _ = out_time(*key)
        # a carry into the next CCU2C uses the dedicated chain, not the fabric
        return (t + (0.0 if key[1] == "COUT" else NET_NS), src, n, key)

    def latest(arrs: list[Arrival]) -> Arrival:
        return max(arrs, key=lambda a: a[0], default=none)

    def out_time(name: str, port: str) -> Arrival:
        key = (name, port)
        if key in memo:
            return memo[key]
        c = cells[name]
        typ, conn = c["type"], c["connections"]
        if typ in CLK_TO_Q and typ != "TRELLIS_DPR16X4":
            t = CLK_TO_Q[typ]
            # a block RAM's side read through its output register (hw/registered_ram.py)
            side = re.fullmatch(r"DO([AB])\d+", port) if typ == "DP16KD" else None
            if side and c.get("parameters", {}).get(f"REGMODE_{side[1]}") == "OUTREG":
                t = OUTREG_CLK_TO_Q
            memo[key] = (t, _base(name), 0, None)
            return memo[key]
        memo[key] = (0.0, "(loop)", 0, None)  # combinational loops do not recurse forever
        if typ == "TRELLIS_DPR16X4":  # LUT RAM: the read is combinational from RAD
            a = latest([arrival(b) for p in ("RAD0", "RAD1", "RAD2", "RAD3")
                        for b in conn.get(p, [])])  # fmt: skip
            best = (a[0] + _LUT, a[1] or _base(name), a[2] + 1, a[3])
        elif typ == "CCU2C":
            f = latest([arrival(b) for p in ("A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1")
                        for b in conn.get(p, [])])  # fmt: skip
            ci = arrival(conn["CIN"][0]) if "CIN" in conn else none
            if port == "COUT":
                best = latest([(f[0] + _CARRY_IN, f[1], f[2] + 1, f[3]),
                               (ci[0] + _CARRY_STEP, ci[1], ci[2], ci[3])])  # fmt: skip
            else:
                best = latest([(f[0] + _LUT + _SUM, f[1], f[2] + 1, f[3]),
                               (ci[0] + _SUM, ci[1], ci[2] + 1, ci[3])])  # fmt: skip
        else:  # LUT4, PFUMX, L6MUX21: the muxes sit beside their LUTs (no fabric net)
            arrs = []
            for p, bits in conn.items():
                if c["port_directions"].get(p) != "input":
                    continue
                local = typ != "LUT4" and p in ("ALUT", "BLUT", "D0", "D1")
                for b in bits:
                    t, src, n, via = arrival(b)
                    arrs.append((t - NET_NS if local and via else t, src, n, via))
            a = latest(arrs)
            best = (a[0] + _LUT, a[1], a[2] + 1, a[3])
        memo[key] = best
        return best

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 200_000))
    out: dict[str, Endpoint] = {}
    for name, c in cells.items():
        typ = c["type"]
        if typ not in CLK_TO_Q:
            continue
        conn = c["connections"]
        clks = {port: bits[0] for port, bits in conn.items() if port.startswith(("CLK", "WCK"))}
        for port, bits in c["connections"].items():
            if c["port_directions"].get(port) != "input" or port.startswith(("CLK", "WCK")):
                continue
            clock = _clock_of(port, clks, net_name)
            if typ == "TRELLIS_DPR16X4" and port.startswith("RAD"):
                continue  # timed through the read (above)
            for b in bits:
                t, src, n, via = arrival(b)
                e = out.get(_base(name))
                if e is None or t > e.ns:
                    out[_base(name)] = Endpoint(round(t, 2), _base(name), src, n, via, clock)
    return sorted(out.values(), key=lambda e: -e.ns), memo


def path(e: Endpoint, memo: dict) -> list[str]:
    """The cells of an endpoint's slowest path, from its start."""
    steps, key = [], e.via
    while key is not None:
        t, _, _, via = memo[key]
        steps.append(f"{t:6.2f}  {key[0]}.{key[1]}")
        key = via
    return steps[::-1]


def block_depth(block: str, limit_ns: float = 8.0) -> list[Endpoint]:
    """The endpoints of a block of `optireduce bench rtl` slower than `limit_ns`."""
    import importlib

    from optireduce.experiments.fmax import ecp5_netlist

    mod = importlib.import_module(f"optireduce.experiments.figures.fig_{block}")
    comp, top = mod.area_component()
    return [e for e in analyse(ecp5_netlist(comp, top), top)[0] if e.ns > limit_ns]


def board_depth(board: str, limit_ns: float = 8.0, domain: str | None = None,
                core: str = "nic") -> list[Endpoint]:  # fmt: skip
    """The endpoints of a whole board build (`sim/bitstream.py: board_netlist`) slower
    than `limit_ns`: the paths between blocks, which no block's own netlist shows.
    `domain`: only the registers of that clock domain (sync, core, eth0_rx, ...);
    `core`: nic, or loopback (the shell alone)."""
    from optireduce.sim.bitstream import _domain, board_netlist, core_by_name

    netlist = board_netlist(board, core_by_name(core))
    slow = [e for e in analyse(netlist, "top")[0] if e.ns > limit_ns]
    return [e for e in slow if domain is None or _domain(e.clock) == domain]


def by_source(slow: list[Endpoint]) -> list[tuple[Endpoint, int]]:
    """The slowest endpoint of each source register, and how many slow ones it starts."""
    first: dict[str, Endpoint] = {}
    count: dict[str, int] = {}
    for e in slow:  # slowest first
        first.setdefault(e.source, e)
        count[e.source] = count.get(e.source, 0) + 1
    return [(e, count[s]) for s, e in first.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m optireduce.experiments.logic_depth",
        description="Rank the registers whose input paths are slowest (fixed cost per cell).",
    )
    ap.add_argument("blocks", nargs="*", help="blocks of `optireduce bench rtl`")
    ap.add_argument("--board", help="a whole board build instead (colorlight, ecpix5, ...)")
    ap.add_argument("--domain", help="with --board: only this clock domain's registers")
    ap.add_argument("--core", default="nic", choices=("nic", "loopback"),
                    help="with --board: the core inside the shell")  # fmt: skip
    ap.add_argument("--limit-ns", type=float, default=8.0, help="list paths over this (8: 125 MHz)")
    args = ap.parse_args(argv)
    if bool(args.board) == bool(args.blocks):
        ap.error("give either --board NAME or block names")
    if args.board:
        slow = board_depth(args.board, args.limit_ns, args.domain, args.core)
        where = f" in {args.domain}" if args.domain else ""
        print(f"{args.board}: {len(slow)} registers{where} with paths over {args.limit_ns} ns, "
              "by source")  # fmt: skip
        for e, n in by_source(slow)[:60]:
            print(f"  {e.ns:6.2f} ns  {e.cells:3d} cells  {n:4d} sinks  {e.source} -> {e.sink}")
        return 0
    for blk in args.blocks:
        slow = block_depth(blk, args.limit_ns)
        print(f"{blk}: {len(slow)} registers with paths over {args.limit_ns} ns")
        for e in slow[:40]:
            print(f"  {e.ns:6.2f} ns  {e.cells:3d} cells  {e.source} -> {e.sink}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
