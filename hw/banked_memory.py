"""A deep memory as banks of one block RAM each, every bank's output registered before
the bank is picked.

A memory deeper than one DP16KD (512 x 36) is built by yosys as a cascade whose read data
goes through a mux tree straight out of the block RAMs: the RAM's clock-to-out plus the
tree is a whole 8 ns cycle at 125 MHz (the host adapter's result buffer, 17 blocks at
C = 8192). Here each bank's data lands in a register first, and the mux runs from those
registers: read LATENCY 2 (address -> data), one write port, one read port.
"""

from __future__ import annotations

from amaranth import Array, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

BANK_DEPTH = 512  # one DP16KD at 36 bits wide


class BankedMemory(wiring.Component):
    """`depth` words of `width` bits; write: w_addr/w_data/w_en; read: r_addr, then
    r_data LATENCY cycles later."""

    LATENCY = 2

    def __init__(self, width: int, depth: int, bank_depth: int = BANK_DEPTH) -> None:
        if depth < 1 or bank_depth < 1 or bank_depth & (bank_depth - 1):
            raise ValueError("BankedMemory: depth >= 1, bank_depth a power of two")
        self.width, self.depth, self.bank_depth = width, depth, bank_depth
        self.n_banks = -(-depth // bank_depth)
        addr = range(max(2, depth))
        super().__init__(
            {
                "w_addr": In(addr),
                "w_data": In(width),
                "w_en": In(1),
                "r_addr": In(addr),
                "r_data": Out(width),
            }
        )

    def elaborate(self, platform):
        m = Module()
        lo = (self.bank_depth - 1).bit_length()  # address bits inside a bank
        outs = []
        for k in range(self.n_banks):
            d = min(self.bank_depth, self.depth - k * self.bank_depth)
            m.submodules[f"bank{k}"] = mem = Memory(shape=self.width, depth=d, init=[])
            wr, rd = mem.write_port(), mem.read_port()
            q = Signal(self.width, name=f"bank{k}_q")
            m.d.comb += [
                wr.addr.eq(self.w_addr[:lo]),
                wr.data.eq(self.w_data),
                wr.en.eq(self.w_en & ((self.w_addr >> lo) == k)),
                rd.addr.eq(self.r_addr[:lo]),
            ]
            m.d.sync += q.eq(rd.data)
            outs.append(q)
        # which bank, delayed with the data (the read, then its register)
        sel1, sel2 = Signal(range(self.n_banks)), Signal(range(self.n_banks))
        m.d.sync += [sel1.eq(self.r_addr >> lo), sel2.eq(sel1)]
        m.d.comb += self.r_data.eq(Array(outs)[sel2])
        return m
