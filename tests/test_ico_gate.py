"""sim/ico_gate.py: a Verilated model whose input-combinational region runs only when an
input changed gives the same values at every eval as the circuit itself (a Python
reference), with inputs that change before the edge, at the edge, or not at all."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from optireduce.sim.ico_gate import PatchError, gate_ico
from optireduce.sim.toolchain import use_verilator

# y depends on the inputs and on state; q on state alone; r counts by a
VERILOG = """
module t(input clk, input [7:0] a, input [7:0] b, output [7:0] y, output [7:0] q);
  reg [7:0] r = 8'd0;
  always @(posedge clk) r <= r + a;
  assign y = (a ^ r) + b;
  assign q = r;
endmodule
"""
# per step: a, b, then "edge" (clk 0 -> 1 with the inputs as set), "low" (clk 0 eval),
# "same" (an eval with nothing changed); the values printed after every eval
HARNESS = r"""
#include "Vt.h"
#include <cstdio>
int main() {
    Vt t;
    t.clk = 0; t.a = 0; t.b = 0; t.eval();
    unsigned a, b; char what[8];
    while (std::scanf("%u %u %7s", &a, &b, what) == 3) {
        t.a = a; t.b = b;
        if (what[0] == 'e') { t.clk = 1; t.eval(); t.clk = 0; }
        t.eval();
        std::printf("%u %u\n", t.y, t.q);
    }
}
"""


def _build(tmp_path, gated: bool):
    root = use_verilator()
    d = tmp_path / ("gated" if gated else "plain")
    d.mkdir()
    (d / "t.v").write_text(VERILOG)
    (d / "main.cpp").write_text(HARNESS)
    cmd = [str(root / "bin" / "verilator"), "--cc", "--exe", "-O3", "-Wno-fatal",
           "--top-module", "t", "--Mdir", str(d / "obj"), "-o", str(d / "exe"),
           str(d / "t.v"), str(d / "main.cpp")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    compared = gate_ico(d / "obj", "Vt") if gated else []
    subprocess.run(["make", "-C", str(d / "obj"), "-f", "Vt.mk", "-j", "2"], check=True,
                   capture_output=True)  # fmt: skip
    return d / "exe", compared


def _reference(steps):
    r, out = 0, []
    for a, b, what in steps:
        if what == "edge":
            r = (r + a) & 0xFF
        out.append((((a ^ r) + b) & 0xFF, r))
    return out


def test_gated_model_equals_the_circuit_and_compares_only_the_data_inputs(tmp_path):
    rng = np.random.default_rng(3)
    steps, a, b = [], 0, 0
    for _ in range(400):
        k = rng.integers(0, 4)  # new a, new b, both, or neither
        a = int(rng.integers(0, 256)) if k in (0, 2) else a
        b = int(rng.integers(0, 256)) if k in (1, 2) else b
        steps.append((a, b, str(rng.choice(["edge", "edge", "low", "same"]))))
    text = "".join(f"{x} {y} {w}\n" for x, y, w in steps)
    want = _reference(steps)
    for gated in (False, True):
        exe, compared = _build(tmp_path, gated)
        got = subprocess.run([str(exe)], input=text, capture_output=True, text=True,
                             check=True, timeout=60).stdout.split("\n")  # fmt: skip
        got = [tuple(map(int, line.split())) for line in got if line]
        assert got == want, f"gated={gated}: first difference at step " + str(
            next(i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w)
        )
        if gated:
            assert compared == ["a", "b"]  # the clock drives no input-combinational logic


def test_unexpected_generated_code_is_refused(tmp_path):
    (tmp_path / "Vt___024root.h").write_text("VL_IN8(a,7,0);\n")
    (tmp_path / "Vt___024root__0.cpp").write_text("void unrelated() {}\n")
    with pytest.raises(PatchError, match="no inputs or no ico logic"):
        gate_ico(tmp_path, "Vt")
