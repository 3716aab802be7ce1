"""A deep memory as banks of one block RAM each, every bank's output registered before
the bank is picked.

A memory deeper than one DP16KD (512 x 36) is built by yosys as a cascade whose read data
goes through a mux tree straight out of the block RAMs: the RAM's clock-to-out plus the
tree is a whole 8 ns cycle at 125 MHz (the host adapter's result buffer, 17 blocks at
C = 8192). Here each bank's data lands in a register first (zero unless the read was
for that bank), and the OR of those registers lands in a register of its own: read
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
from amaranth.lib.wiring import In, Out

from optireduce.hw.block_ram import block_ram, read_port

BANK_DEPTH = 512  # one DP16KD at 36 bits wide


class BankedMemory(wiring.Component):
    """`depth` words of `width` bits; write: w_addr/w_data/w_en; read: r_addr, then
    r_data LATENCY cycles later."""

    LATENCY = 3  # the block RAM, its bank register, the OR's register
    WRITE_LATENCY = 1  # the write's register

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
        sel = Signal(range(self.n_banks))  # the bank of the read on rd.data now
        m.d.sync += sel.eq(self.r_addr >> lo)
        w_addr, w_data, w_en = Signal.like(self.w_addr), Signal.like(self.w_data), Signal()
        m.d.sync += [w_addr.eq(self.w_addr), w_data.eq(self.w_data), w_en.eq(self.w_en)]
        outs = []
        for k in range(self.n_banks):
            d = min(self.bank_depth, self.depth - k * self.bank_depth)
            m.submodules[f"bank{k}"] = mem = block_ram(shape=self.width, depth=d)
            wr = mem.write_port()
            rd = read_port(m, mem, (wr,), platform=platform)
            # the bank's register keeps its read only if the read was for this bank, and
            # is zero otherwise (no domain reset: the clear is the flip-flop's own
            # synchronous reset, not a LUT after the block RAM)
            q = Signal(self.width, name=f"bank{k}_q", reset_less=True)
            m.d.comb += [
                wr.addr.eq(w_addr[:lo]),
                wr.data.eq(w_data),
                wr.en.eq(w_en & ((w_addr >> lo) == k)),
                rd.addr.eq(self.r_addr[:lo]),
            ]
            m.d.sync += q.eq(Mux(sel == k, rd.data, 0))
            outs.append(q)
        # so the output is the OR of the banks' registers, registered: no select wider
        # than a bank's own compare fans out over 17 x 32 bits (125 MHz)
        m.d.sync += self.r_data.eq(reduce(operator.or_, outs))
        return m
