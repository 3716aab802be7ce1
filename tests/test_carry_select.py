"""hw/carry_select.py: the ECP5 forms (a CCU2C chain with the select in its LUTs) proved
equal by SAT to a + (keep ? b : 0) and to (neg ? -x : x), through yosys's simulation
model of the CCU2C, after the board build's carry passes (sim/ecp5_carry_map.vmap) have
left each chain's first CIN unconnected (at 0 and at 1: the proof holds for both); and
the plain forms elsewhere, in Amaranth's simulator."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from amaranth import Module, signed
from amaranth.back import rtlil
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from optireduce.hw.carry_select import masked_add, negate_if
from optireduce.sim.bitstream import CARRY_MAP
from optireduce.sim.toolchain import yosys

ECP5 = SimpleNamespace(family="ecp5")

SCRIPT = """
read_verilog +/lattice/common_sim.vh +/lattice/ccu2c_sim.vh
read_rtlil gate.il
proc
select -assert-count COUNT top/t:CCU2C
techmap -D CARRY_FREE_A -map map.v
select -assert-count 3 top/t:$__CCU2C_FREE_CIN
techmap -D CARRY_FREE_B -map map.v
setundef -UNDEF top
hierarchy -top top
flatten -wb
techmap
opt -fast
rename top gate
read_verilog gold.v
proc
miter -equiv -flatten -make_assert gold gate miter
hierarchy -top miter
sat -verify -prove-asserts miter
"""


class Top(wiring.Component):
    """y = masked_add(a, b, s), z = negate_if(b, s), w = negate_if(b, s, zero=a[0])
    (width wa)."""

    def __init__(self, wa: int, wb: int, b_signed: bool):
        self.wa = wa
        super().__init__({"a": In(wa), "b": In(signed(wb) if b_signed else wb), "s": In(1),
                          "y": Out(wa), "z": Out(wa), "w": Out(wa)})  # fmt: skip

    def elaborate(self, platform):
        m = Module()
        y = masked_add(m, self.a, self.b, self.s, platform=platform, name="madd")
        z = negate_if(m, self.b, self.s, self.wa, platform=platform, name="neg")
        w = negate_if(m, self.b, self.s, self.wa, platform=platform, name="negz",
                      zero=self.a[0])  # fmt: skip
        m.d.comb += [self.y.eq(y), self.z.eq(z), self.w.eq(w)]
        return m


def _gold(wa: int, wb: int, b_signed: bool) -> str:
    sb = "signed " if b_signed else ""
    return (f"module gold(input [{wa - 1}:0] a, input {sb}[{wb - 1}:0] b, input s, "
            f"output [{wa - 1}:0] y, output [{wa - 1}:0] z, output [{wa - 1}:0] w);\n"
            f"  wire [{wa - 1}:0] bx = b;\n"  # extended by b's signedness
            f"  assign y = a + (s ? bx : {wa}'d0);\n"
            f"  assign z = s ? -bx : bx;\n"
            f"  assign w = a[0] ? {wa}'d0 : z;\nendmodule\n")  # fmt: skip


@pytest.mark.parametrize("undef", ("zero", "one"))
@pytest.mark.parametrize(("wa", "wb", "b_signed"),
                         [(1, 1, False), (2, 2, False), (5, 4, True), (8, 8, False),
                          (9, 8, True), (6, 9, True), (40, 39, True)])  # fmt: skip
def test_the_ccu2c_chains_equal_the_selects(tmp_path: Path, wa, wb, b_signed, undef):
    (tmp_path / "gate.il").write_text(rtlil.convert(Top(wa, wb, b_signed), platform=ECP5))
    (tmp_path / "gold.v").write_text(_gold(wa, wb, b_signed))
    (tmp_path / "map.v").write_text(CARRY_MAP.read_text())
    count = 3 * ((wa + 2) // 2)  # per chain: a carry-in half, then one half per bit
    script = SCRIPT.replace("UNDEF", undef).replace("COUNT", str(count))
    (tmp_path / "eq.ys").write_text(script)
    r = subprocess.run([yosys(), "-q", "eq.ys"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_the_plain_forms_in_simulation():
    dut = Top(6, 5, True)
    cases = [(a, b, s) for a in (0, 1, 31, 63) for b in (-16, -1, 0, 7, 15) for s in (0, 1)]
    got = []

    async def bench(ctx):
        for a, b, s in cases:
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            ctx.set(dut.s, s)
            got.append((ctx.get(dut.y), ctx.get(dut.z), ctx.get(dut.w)))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for a, b, s in cases:
        z = (-b if s else b) % 64
        want.append(((a + (b if s else 0)) % 64, z, 0 if a & 1 else z))
    assert got == want
