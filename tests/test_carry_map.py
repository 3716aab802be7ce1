"""sim/ecp5_carry_map.vmap, the 25F's map of adders with a constant carry-in: proved equal
to yosys's own $alu by SAT, through yosys's simulation model of the CCU2C (its LUT4, its
LUT2 and the carry between its halves), for every width class and operation it takes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from optireduce.sim.bitstream import CARRY_MAP
from optireduce.sim.toolchain import yosys

# every operation alumacc turns into an $alu with a constant carry-in and B inversion: the
# map takes all of them (the script asserts no $alu is left)
OPS = (
    "a + b", "a - b", "a + 7'd37", "$signed(a) + $signed(b)", "$signed(a) - $signed(b)",
    "{7'b0, a < b}", "{7'b0, $signed(a) < $signed(b)}", "{7'b0, a >= b}", "a + w", "w - a",
)  # fmt: skip

# the map, then (as synth_ecp5 does) undefined bits to 0, then the two passes that leave a
# chain's first CIN unconnected, then that CIN at 0 or at 1 (UNDEF): the proof holds for both
SCRIPT = """
read_verilog +/lattice/common_sim.vh +/lattice/ccu2c_sim.vh
read_verilog t.v
proc
alumacc
opt_clean
techmap -map map.v
opt_clean
select -assert-none t:$alu
select -assert-min 1 t:CCU2C
setundef -zero t
techmap -D CARRY_FREE_A -map map.v
select -assert-min 1 t:$__CCU2C_FREE_CIN
techmap -D CARRY_FREE_B -map map.v
select -assert-none t:$__CCU2C_FREE_CIN
setundef -UNDEF t
hierarchy -top t
flatten -wb
techmap
opt -fast
rename t gate
read_verilog t.v
proc
rename t gold
miter -equiv -flatten -make_assert gold gate miter
hierarchy -top miter
sat -verify -prove-asserts miter
"""


def _module(width: int) -> str:
    """Every OPS result at `width` bits (a, b of `width` bits, w narrower)."""
    ops = [op.replace("7'", f"{width}'").replace("{7'b0", f"{{{width - 1}'b0") for op in OPS]
    outs = ", ".join(f"output [{width - 1}:0] y{k}" for k in range(len(ops)))
    body = "\n".join(f"  assign y{k} = {op};" for k, op in enumerate(ops))
    return (
        f"module t(input [{width - 1}:0] a, input [{width - 1}:0] b, "
        f"input [{width // 2}:0] w, {outs});\n{body}\nendmodule\n"
    )


def _prove(
    tmp_path: Path, width: int, map_text: str, undef: str = "zero"
) -> subprocess.CompletedProcess:
    (tmp_path / "t.v").write_text(_module(width))
    (tmp_path / "map.v").write_text(map_text)
    (tmp_path / "eq.ys").write_text(SCRIPT.replace("UNDEF", undef))
    return subprocess.run([yosys(), "-q", "eq.ys"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


@pytest.mark.parametrize("undef", ("zero", "one"))
@pytest.mark.parametrize("width", (5, 6, 7, 8, 9, 16, 31, 32, 33))
def test_the_carry_map_equals_the_adders(tmp_path, width, undef):
    r = _prove(tmp_path, width, CARRY_MAP.read_text(), undef)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize(
    ("width", "old", "new"),
    [
        # the first half's carry for an even width: the carry-in dropped
        (8, "first ? ((a & b) | (C & (a | b))) : C", "first ? (a & b) : C"),
        # for an odd width: the carry-in inverted
        (7, "first ? ((a & b) | (C & (a | b))) : C", "first ? ((a & b) | (C & (a | b))) : ~C"),
        # the chain broken between two CCU2Cs
        (9, ".CIN(h == 0 ? 1'bx : COUT[h/2 - 1])", ".CIN(h == 0 ? 1'bx : 1'b0)"),
    ],
)
def test_a_wrong_map_is_refuted(tmp_path, width, old, new):
    text = CARRY_MAP.read_text()
    assert old in text
    r = _prove(tmp_path, width, text.replace(old, new), "one")
    assert r.returncode != 0 and "proof did fail" in (r.stdout + r.stderr)


KEEP = """
read_verilog -lib +/lattice/ccu2c_sim.vh
read_verilog t.v
hierarchy -top t
techmap -D CARRY_FREE_A -map map.v
select -assert-none t:$__CCU2C_FREE_CIN
select -assert-count 1 t:CCU2C
"""

# a chain's first CCU2C as yosys's own map makes it: its first half's sum reads CIN
STOCK_FIRST = """module t(input [1:0] a, input [1:0] b, output [1:0] y, output co);
  CCU2C #(.INIT0(16'h96AA), .INIT1(16'h96AA), .INJECT1_0("NO"), .INJECT1_1("NO")) c (
    .CIN(1'b0), .A0(a[0]), .B0(b[0]), .C0(1'b0), .D0(1'b1),
    .A1(a[1]), .B1(b[1]), .C1(1'b0), .D1(1'b1), .S0(y[0]), .S1(y[1]), .COUT(co));
endmodule
"""


@pytest.mark.parametrize("guard", ("INIT0[15:8] != 0 ||", None))
def test_a_first_half_that_reads_cin_keeps_it(tmp_path, guard):
    """The passes leave CIN connected where the first half's LUT4 reads it; without the
    guard on the LUT4 they would not."""
    text = CARRY_MAP.read_text()
    if guard is None:
        text = text.replace("INIT0[15:8] != 0 ||", "")
    (tmp_path / "t.v").write_text(STOCK_FIRST)
    (tmp_path / "map.v").write_text(text)
    (tmp_path / "keep.ys").write_text(KEEP)
    r = subprocess.run([yosys(), "-q", "keep.ys"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, check=False)  # fmt: skip
    assert (r.returncode == 0) == (guard is not None), r.stderr[-2000:]
