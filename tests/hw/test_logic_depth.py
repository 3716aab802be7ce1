"""experiments/logic_depth.py: times on hand-built netlists, and the compare rule of hw/deadline.py
on yosys's own netlists."""

import json
import operator

import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.experiments.fmax import ecp5_netlist
from optireduce.experiments.logic_depth import (
    CLK_TO_Q,
    NET_NS,
    OUTREG_CLK_TO_Q,
    Endpoint,
    analyse,
    by_source,
    path,
)

LUT = 0.24


def _cell(typ, ins: dict, outs: dict) -> dict:
    conns = {**ins, **outs}
    dirs = {p: "input" for p in ins} | {p: "output" for p in outs}
    return {"type": typ, "connections": conns, "port_directions": dirs}


def _netlist(tmp_path, cells: dict, netnames: dict | None = None):
    f = tmp_path / "n.json"
    f.write_text(json.dumps({"modules": {"top": {"cells": cells, "netnames": netnames or {}}}}))
    return f


def test_two_luts_between_registers(tmp_path):
    # a_FF -> LUT -> LUT -> b_FF, and c_FF -> the second LUT (a shorter path to b)
    cells = {
        "a_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [1], "DI": [9]}, {"Q": [2]}),
        "c_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [1], "DI": [9]}, {"Q": [3]}),
        "l1": _cell("LUT4", {"A": [2], "B": ["0"], "C": ["0"], "D": ["0"]}, {"Z": [4]}),
        "l2": _cell("LUT4", {"A": [4], "B": [3], "C": ["0"], "D": ["0"]}, {"Z": [5]}),
        "b_TRELLIS_FF_Q_3": _cell("TRELLIS_FF", {"CLK": [1], "DI": [5]}, {"Q": [9]}),
    }
    eps, memo = analyse(_netlist(tmp_path, cells), "top")
    b = next(e for e in eps if e.sink == "b")
    assert b.source == "a" and b.cells == 2
    assert b.ns == pytest.approx(CLK_TO_Q["TRELLIS_FF"] + 3 * NET_NS + 2 * LUT, abs=0.01)
    assert [s.split()[1] for s in path(b, memo)] == ["a_TRELLIS_FF_Q.Q", "l1.Z", "l2.Z"]


def test_each_endpoint_names_its_clock(tmp_path):
    # two registers on two clocks: each endpoint carries its own clock net, mapped to its
    # domain as nextpnr's report is (sim/bitstream.py _domain)
    from optireduce.sim.bitstream import _domain

    cells = {
        "a_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [1], "DI": [4]}, {"Q": [2]}),
        "b_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [6], "DI": [2]}, {"Q": [4]}),
    }
    # and a two-clock block RAM: written on port A (sync), read on port B (core), whose
    # address comes through a LUT, so the slowest input is on the B side
    cells["l"] = _cell("LUT4", {"A": [4], "B": ["0"], "C": ["0"], "D": ["0"]}, {"Z": [5]})
    cells["m"] = _cell("DP16KD", {"CLKA": [1], "CLKB": [6], "DIA0": [2], "ADB5": [5]},
                       {"DOB0": [8]})  # fmt: skip
    names = {"clk": {"bits": [1]}, "core_clk": {"bits": [6]}, "shell.core.clk": {"bits": [6]}}
    eps, _ = analyse(_netlist(tmp_path, cells, names), "top")
    clocks = {e.sink: _domain(e.clock) for e in eps}
    assert clocks == {"a": "sync", "b": "core", "m": "core"}


def test_a_block_ram_read_through_its_output_register_starts_late_no_more(tmp_path):
    # two block RAMs, each into a flip-flop: one plain, one with REGMODE_B OUTREG
    # (hw/registered_ram.py); only the second's clock-to-out is its register's
    cells = {}
    for name, mode, q in (("plain", "NOREG", 2), ("outreg", "OUTREG", 3)):
        cells[name] = _cell("DP16KD", {"CLKB": [1]}, {"DOB0": [q]})
        cells[name]["parameters"] = {"REGMODE_B": mode}
        cells[f"{name}_q_TRELLIS_FF_Q"] = _cell("TRELLIS_FF", {"CLK": [1], "DI": [q]}, {"Q": [9]})
    eps, _ = analyse(_netlist(tmp_path, cells), "top")
    ns = {e.sink: e.ns for e in eps if e.sink.endswith("_q")}
    assert ns["plain_q"] == pytest.approx(CLK_TO_Q["DP16KD"] + NET_NS)
    assert ns["outreg_q"] == pytest.approx(OUTREG_CLK_TO_Q + NET_NS)


def test_a_carry_chain_has_no_net_between_its_cells(tmp_path):
    # a_FF -> CCU2C (A0) -COUT-> CCU2C (CIN) -S0-> b_FF: one fabric net in, one out
    cells = {
        "a_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [1], "DI": [9]}, {"Q": [2]}),
        "c0": _cell("CCU2C", {"A0": [2]}, {"COUT": [3], "S0": [7]}),
        "c1": _cell("CCU2C", {"CIN": [3]}, {"COUT": [8], "S0": [4]}),
        "b_TRELLIS_FF_Q": _cell("TRELLIS_FF", {"CLK": [1], "DI": [4]}, {"Q": [9]}),
    }
    eps, _ = analyse(_netlist(tmp_path, cells), "top")
    b = next(e for e in eps if e.sink == "b")
    chain = 0.45 + 0.40  # into the carry, carry to the sum
    assert b.ns == pytest.approx(CLK_TO_Q["TRELLIS_FF"] + 2 * NET_NS + chain, abs=0.01)


class _Compare(wiring.Component):
    def __init__(self, op) -> None:
        self.op = op
        super().__init__({"a": In(48), "b": In(48), "o": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a, b, o = Signal(48), Signal(48), Signal()
        m.d.sync += [a.eq(self.a), b.eq(self.b), o.eq(self.op(a, b))]
        m.d.comb += self.o.eq(o)
        return m


def test_yosys_maps_lt_and_ge_to_the_chain_alone():
    """Why hw/deadline.py writes every compare as < or >=: at 48 bits yosys gives `>` and
    `<=` an equality tree beside the carry chain, and their path more logic."""
    cells = {}
    for name in ("lt", "ge", "gt", "le"):
        comp = _Compare(getattr(operator, name))
        eps, _ = analyse(ecp5_netlist(comp, f"cmp48_{name}"), f"cmp48_{name}")
        cells[name] = next(e for e in eps if e.sink == "o").cells
    assert cells["lt"] <= 2 and cells["ge"] <= 2, cells
    assert min(cells["gt"], cells["le"]) >= cells["lt"] + 2, cells


def test_by_source_keeps_each_sources_slowest_path_and_counts_them():
    slow = [Endpoint(9.5, "x", "a", 5), Endpoint(9.0, "y", "b", 4), Endpoint(8.5, "z", "a", 3),
            Endpoint(8.2, "w", "a", 2)]  # fmt: skip
    got = [(e.sink, e.source, n) for e, n in by_source(slow)]
    assert got == [("x", "a", 3), ("y", "b", 1)]
