"""A block RAM read through the block's own output register: read LATENCY 2, and the
first flip-flop after the RAM is inside it.

A DP16KD read into a register in the fabric costs the RAM's clock-to-out (5.6–5.8 ns
on the ECP5-6 in nextpnr's model) plus the route to that register: at 125 MHz on the
25F the route decided whether the clock was met (the MACs' frame FIFOs, the host
adapter's result buffer). With the block's output register (REGMODE OUTREG) the
clock-to-out is the register's, about 1 ns. yosys does not infer that register, so on
an ECP5 platform this module instantiates the DP16KD itself, wired as yosys's own
mapping wires it (share/lattice/brams_map_16kd.v; tests/hw/test_registered_ram.py
compares the two netlists). Anywhere else (Amaranth's simulator, Verilator, other vendors) it is the
two registers in the fabric, the first folded into the RAM by the tools; so is a
memory shallower than hw/board_fit.py's LUTRAM_DEPTH, which the block RAM budget
counts as LUTs (the result buffer's short last bank).

One write port and one read port in one clock domain; no initial contents. A read of
the address written in the same cycle is undefined (hw/block_ram.py): the simulation
poisons it. `r_en` is the RAM's read enable (its register holds while low), `o_en` the
output register's (it holds while low): `r_data` takes the word read two cycles after
`r_addr`, when both stages moved. Users raise `o_en` only with `r_en` (a FIFO's output
stage moves only when its RAM stage may): whether a DP16KD's CE also gates its output
register is then never asked. Neither register is reset (the block's RST is tied low).
"""

from __future__ import annotations

from amaranth import ClockSignal, Const, Instance, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.block_ram import block_ram, read_port
from optireduce.hw.board_fit import LUTRAM_DEPTH, MODES

# The 14 address pins count units of the 16K-deep mode: a word's address sits above
# the pins under it (the lowest of those carry a write's byte enables at 18 and 36
# wide). The 36-wide mode (board_fit.MODES) is the pseudo-dual-port one: write on port
# A, read on port B, each 36 wide; the rest are true dual port, written on A.
ADDR_PINS = 14


def dp16kd_mode(width: int, depth: int) -> tuple[int, int] | None:
    """The narrowest DP16KD mode (words, width) that holds `depth` words of `width`
    bits, or None."""
    return next(((d, w) for d, w in MODES if w >= width and d >= depth), None)


def memory_ports(width: int, depth: int) -> dict:
    """The members of a memory with one write port and one read port."""
    addr = range(max(2, depth))
    return {
        "w_addr": In(addr),
        "w_data": In(width),
        "w_en": In(1),
        "r_addr": In(addr),
        "r_data": Out(width),
    }


def is_ecp5(platform) -> bool:
    return getattr(platform, "family", None) == "ecp5"


class RegisteredRam(wiring.Component):
    """`depth` words of `width` bits: write w_addr/w_data/w_en; read r_addr with r_en,
    then o_en a cycle later; r_data LATENCY cycles after the address."""

    LATENCY = 2  # the RAM's read register, then its output register

    def __init__(self, width: int, depth: int, *, domain: str = "sync") -> None:
        if width < 1 or depth < 1:
            raise ValueError("RegisteredRam: width and depth >= 1")
        self.width, self.depth, self.domain = width, depth, domain
        enables = {"r_en": In(1, init=1), "o_en": In(1, init=1)}
        super().__init__(memory_ports(width, depth) | enables)

    def elaborate(self, platform):
        if is_ecp5(platform) and self.depth >= LUTRAM_DEPTH:
            return self._dp16kd(*self._block_mode())
        m = Module()
        m.submodules.mem = mem = block_ram(shape=self.width, depth=self.depth)
        wr = mem.write_port(domain=self.domain)
        rd = read_port(m, mem, (wr,), platform=platform, domain=self.domain)
        m.d.comb += [
            wr.addr.eq(self.w_addr),
            wr.data.eq(self.w_data),
            wr.en.eq(self.w_en),
            rd.addr.eq(self.r_addr),
            rd.en.eq(self.r_en),
        ]
        # no reset, as the block's output register has none (its RST is tied low)
        out = Signal.like(self.r_data, reset_less=True)
        m.d.comb += self.r_data.eq(out)
        with m.If(self.o_en):
            m.d[self.domain] += out.eq(rd.data)
        return m

    def _block_mode(self) -> tuple[int, int]:
        mode = dp16kd_mode(self.width, self.depth)
        if mode is None:
            raise ValueError(
                f"RegisteredRam({self.width}, {self.depth}) on the ECP5: one DP16KD holds "
                f"at most {MODES} (words, width); split the memory into banks"
            )
        return mode

    def _dp16kd(self, words: int, w: int) -> Module:
        m = Module()
        low = ADDR_PINS - (words - 1).bit_length()  # pins under a word
        pdp = w == 36
        di, do = Signal(36), Signal(36)
        m.d.comb += [di.eq(self.w_data), self.r_data.eq(do[: self.width])]
        clk = ClockSignal(self.domain)

        def addr(a: Signal, byte_enables: list) -> list:
            bits = byte_enables + [Const(0, 1)] * (low - len(byte_enables))
            bits += [a[k] for k in range(len(a))]
            return (bits + [Const(0, 1)] * ADDR_PINS)[:ADDR_PINS]

        # 18 wide and narrower: port A writes, port B reads (each w wide); at 18 the
        # write enable is on A's two byte enables too. 36 wide: port A writes all 36
        # (its data pins, then B's), B reads them (A's outputs, then B's), and the
        # write's enable is its four byte enables, with WEA on.
        byte_enables = [self.w_en] * {36: 4, 18: 2}.get(w, 0)
        write_enable = Const(1, 1) if pdp else self.w_en
        a_addr = addr(self.w_addr, byte_enables)
        b_addr = addr(self.r_addr, [])
        pins = {}
        for k in range(ADDR_PINS):
            pins[f"i_ADA{k}"] = a_addr[k]
            pins[f"i_ADB{k}"] = b_addr[k]
        for k in range(18):
            pins[f"i_DIA{k}"] = di[k]
            pins[f"i_DIB{k}"] = di[18 + k] if pdp else Const(0, 1)
            pins[f"o_DOB{k}"] = do[18 + k] if pdp else do[k]
            if pdp:
                pins[f"o_DOA{k}"] = do[k]
        for k in range(3):
            pins[f"i_CSA{k}"] = pins[f"i_CSB{k}"] = Const(0, 1)
        # yosys's modes: read-before-write on both ports of a true dual port block (no
        # port here reads what it writes), the default in the 36-bit mode
        write_modes = {} if pdp else dict.fromkeys(("p_WRITEMODE_A", "p_WRITEMODE_B"),
                                                   "READBEFOREWRITE")  # fmt: skip
        m.submodules.dp16kd = Instance(
            "DP16KD",
            p_DATA_WIDTH_A=w,
            p_DATA_WIDTH_B=w,
            p_REGMODE_A="OUTREG" if pdp else "NOREG",
            p_REGMODE_B="OUTREG",
            p_RESETMODE="ASYNC",  # as yosys sets them; RST is tied low
            p_ASYNC_RESET_RELEASE="ASYNC",
            p_CSDECODE_A="0b000",
            p_CSDECODE_B="0b000",
            **write_modes,
            p_GSR="AUTO",
            p_CLKAMUX="CLKA",
            p_CLKBMUX="CLKB",
            i_CLKA=clk,
            i_CEA=Const(1, 1),
            i_WEA=write_enable,
            i_OCEA=self.o_en if pdp else Const(1, 1),
            i_RSTA=Const(0, 1),
            i_CLKB=clk,
            i_CEB=self.r_en,
            i_WEB=Const(0, 1),
            i_OCEB=self.o_en,
            i_RSTB=Const(0, 1),
            **pins,
        )
        return m
