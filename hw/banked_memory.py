"""A deep memory as banks of one block RAM each, each read through its block's output
register before the bank is picked.

A memory deeper than one DP16KD (512 x 36) is built by yosys as a cascade whose read data
goes through a mux tree straight out of the block RAMs: the RAM's clock-to-out plus the
tree is a whole 8 ns cycle at 125 MHz (the host adapter's result buffer, 17 blocks at
C = 8192). Here each bank is a RegisteredRam (hw/registered_ram.py: on the ECP5 the
block's own output register, about 1 ns clock-to-out instead of 5.6), and the banks'
words, each masked by a registered one-hot pick, are ORed into a register: read
LATENCY 3 (address -> data), one write port, one read port. A write is registered
before it reaches the banks (WRITE_LATENCY 1: its address decode and data are not in
front of the block RAMs' pins), so a read sees the writes offered two cycles before it
and earlier; a read of the address offered for writing the cycle before is undefined
(hw/block_ram.py): the user never uses one.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring

from optireduce.hw.registered_ram import RegisteredRam, memory_ports

BANK_DEPTH = 512  # one DP16KD at 36 bits wide


class BankedMemory(wiring.Component):
    """`depth` words of `width` bits; write: w_addr/w_data/w_en; read: r_addr, then
    r_data LATENCY cycles later."""

    LATENCY = 3  # the block RAM, its output register, the OR's register
    WRITE_LATENCY = 1  # the write's register

    def __init__(self, width: int, depth: int, bank_depth: int = BANK_DEPTH) -> None:
        if depth < 1 or bank_depth < 1 or bank_depth & (bank_depth - 1):
            raise ValueError("BankedMemory: depth >= 1, bank_depth a power of two")
        self.width, self.depth, self.bank_depth = width, depth, bank_depth
        self.n_banks = -(-depth // bank_depth)
        super().__init__(memory_ports(width, depth))

    def elaborate(self, platform):
        m = Module()
        lo = (self.bank_depth - 1).bit_length()  # address bits inside a bank
        # the bank of the read in the RAMs' read registers, then of the one in their
        # output registers (one-hot: each bank's mask is one flip-flop, not a compare)
        sel = Signal(range(self.n_banks))
        pick = Signal(self.n_banks)
        m.d.sync += [sel.eq(self.r_addr >> lo), pick.eq(1 << sel)]
        w_addr, w_data, w_en = Signal.like(self.w_addr), Signal.like(self.w_data), Signal()
        m.d.sync += [w_addr.eq(self.w_addr), w_data.eq(self.w_data), w_en.eq(self.w_en)]
        outs = []
        for k in range(self.n_banks):
            d = min(self.bank_depth, self.depth - k * self.bank_depth)
            m.submodules[f"bank{k}"] = ram = RegisteredRam(self.width, d)
            m.d.comb += [
                ram.w_addr.eq(w_addr[:lo]),
                ram.w_data.eq(w_data),
                ram.w_en.eq(w_en & ((w_addr >> lo) == k)),
                ram.r_addr.eq(self.r_addr[:lo]),
            ]
            outs.append(Mux(pick[k], ram.r_data, 0))
        m.d.sync += self.r_data.eq(reduce(operator.or_, outs))
        return m
