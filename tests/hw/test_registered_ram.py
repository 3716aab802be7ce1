"""hw/registered_ram.py: a block RAM read through its output register.

In simulation (the fabric's two registers) it is checked against a Python list: data two
cycles after the address, the read register held while r_en is low, the output register
while o_en is low, a read of the address being written poisoned. On an ECP5 platform it
is a DP16KD instance: yosys's own mapping of the same memory (inferred from
hw/block_ram.py) is the reference its pins and widths are compared with, after
`synth_ecp5`, for every width a DP16KD has; only the output register differs."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import rtlil

from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.board_colorlight import ColorlightPlatform
from optireduce.hw.registered_ram import RegisteredRam
from optireduce.sim.stream_sim import simulate
from optireduce.sim.toolchain import yosys


def test_reads_against_a_list():
    dut = RegisteredRam(8, depth=16)
    rng = random.Random(3)
    model = [0] * 16
    seen = {"reads": 0, "collisions": 0, "ram_held": 0, "out_held": 0}

    async def bench(ctx):
        ram = None  # what the read register holds (None: nothing read yet)
        out = None  # what the output register holds
        for _ in range(1500):
            w_addr, w_data, w_en = rng.randrange(16), rng.getrandbits(8), rng.random() < 0.5
            r_addr, r_en, o_en = rng.randrange(16), rng.random() < 0.7, rng.random() < 0.7
            for sig, v in ((dut.w_addr, w_addr), (dut.w_data, w_data), (dut.w_en, w_en),
                           (dut.r_addr, r_addr), (dut.r_en, r_en), (dut.o_en, o_en)):  # fmt: skip
                ctx.set(sig, v)
            if out is not None:
                assert ctx.get(dut.r_data) == out
                seen["reads"] += 1
            if o_en:
                out = ram
            else:
                seen["out_held"] += out is not None
            if r_en:
                collides = w_en and w_addr == r_addr
                seen["collisions"] += collides
                ram = ~model[r_addr] & 0xFF if collides else model[r_addr]
            else:
                seen["ram_held"] += ram is not None
            if w_en:
                model[w_addr] = w_data
            await ctx.tick()

    simulate(dut, bench)
    assert seen["reads"] > 1400 and seen["collisions"] > 20
    assert seen["ram_held"] > 300 and seen["out_held"] > 300


class _Inferred(Elaboratable):
    """The same memory as yosys infers it: block_ram read into its own register."""

    def __init__(self, width: int, depth: int) -> None:
        bits = max(2, depth - 1).bit_length()
        self.width, self.depth = width, depth
        self.w_addr, self.w_data = Signal(bits, name="w_addr"), Signal(width, name="w_data")
        self.w_en, self.r_en = Signal(name="w_en"), Signal(name="r_en")
        self.r_addr, self.r_data = Signal(bits, name="r_addr"), Signal(width, name="r_data")

    def ports(self) -> list:
        return [self.w_addr, self.w_data, self.w_en, self.r_addr, self.r_en, self.r_data]

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = block_ram(shape=self.width, depth=self.depth)
        wr = mem.write_port()
        rd = read_port(m, mem, (wr,), platform=platform)
        m.d.comb += [
            wr.addr.eq(self.w_addr), wr.data.eq(self.w_data), wr.en.eq(self.w_en),
            rd.addr.eq(self.r_addr), rd.en.eq(self.r_en), self.r_data.eq(rd.data),
        ]  # fmt: skip
        return m


def _synth(il: str, tmp_path, name: str) -> dict:
    """The top module of a design after yosys's `synth_ecp5` (its JSON netlist)."""
    (tmp_path / f"{name}.il").write_text(il)
    script = f"read_rtlil {name}.il; synth_ecp5 -top top; write_json {name}.json"
    r = subprocess.run([yosys(), "-q", "-p", script], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((tmp_path / f"{name}.json").read_text())["modules"]["top"]


def _dp16kd(il: str, tmp_path, name: str) -> dict:
    """The one DP16KD of a design after `synth_ecp5`: parameters, and each pin as the top
    port bit it is wired to ("w_addr[3]"), a constant, or "internal"."""
    top = _synth(il, tmp_path, name)
    names = {b: f"{p}[{i}]" for p, v in top["ports"].items() for i, b in enumerate(v["bits"])}
    cells = [c for c in top["cells"].values() if c["type"] == "DP16KD"]
    assert len(cells) == 1 and len(top["cells"]) == 1, sorted(top["cells"])
    (cell,) = cells
    pins = {}
    for pin, (bit,) in cell["connections"].items():
        bit = "0" if bit == "x" else bit  # an undriven input is a constant low
        pins[pin] = names.get(bit, "internal") if isinstance(bit, int) else bit
    # an output that drives nothing is as good as not connected
    unused = [p for p, v in pins.items() if p.startswith("DO") and v == "internal"]
    # an initial value of zeros is the default (the instance has no initial contents)
    params = {k: v for k, v in cell["parameters"].items()
              if not (k.startswith("INITVAL_") and set(v) == {"0"})}  # fmt: skip
    return {"params": params, "pins": {p: pins[p] for p in pins if p not in unused}}


SHAPES = [(9, 2048), (32, 512), (36, 512), (18, 1024), (4, 3000), (2, 8192), (1, 9000)]


@pytest.mark.parametrize("width,depth", SHAPES)
def test_the_dp16kd_is_wired_as_yosys_wires_it(width, depth, tmp_path):
    plat = ColorlightPlatform()
    ref = _Inferred(width, depth)
    want = _dp16kd(rtlil.convert(ref, platform=plat, ports=ref.ports()), tmp_path, "ref")
    got = _dp16kd(rtlil.convert(RegisteredRam(width, depth), platform=plat), tmp_path, "dut")
    pdp = width > 18
    # only the output register differs: its mode, and its enable (o_en) on the read
    # port's side, both sides' in the 36-bit mode
    out_pins = {"OCEB", "OCEA"} if pdp else {"OCEB"}
    assert {p: got["pins"][p] for p in out_pins} == dict.fromkeys(out_pins, "o_en[0]")
    assert want["params"]["REGMODE_B"] == "NOREG" and got["params"]["REGMODE_B"] == "OUTREG"
    assert got["params"]["REGMODE_A"] == ("OUTREG" if pdp else "NOREG")
    for side in (want, got):
        for p in out_pins:
            del side["pins"][p]
    assert got["pins"] == want["pins"]
    for side in (want, got):
        for key in ("REGMODE_A", "REGMODE_B"):
            del side["params"][key]
    assert got["params"] == want["params"]
    # the data really is wired: every bit of r_data comes from the block's pins
    assert {f"r_data[{i}]" for i in range(width)} <= set(got["pins"].values())


def test_a_shallow_memory_stays_of_luts_on_the_ecp5(tmp_path):
    il = rtlil.convert(RegisteredRam(32, 20), platform=ColorlightPlatform())
    kinds = {c["type"] for c in _synth(il, tmp_path, "small")["cells"].values()}
    assert "TRELLIS_DPR16X4" in kinds and "DP16KD" not in kinds


def test_a_memory_larger_than_one_block_is_refused_on_the_ecp5():
    with pytest.raises(ValueError, match="split the memory into banks"):
        rtlil.convert(RegisteredRam(32, 1024), platform=ColorlightPlatform())
