"""A FIFO between two clocks whose flags are registers with one LUT of logic after the
other side's pointer, for the 125 MHz side of the 25F-6.

amaranth.lib.fifo.AsyncFIFO computes its flags and its read address from the pointer's
next value: the compare of two gray pointers, the read's enable, a carry chain and the
memory's address in one cycle (10.3 ns routed on the 25F-6, where a cycle is 8). Here
each side keeps its pointer and that pointer plus one, both in binary and gray, in
registers; a move only picks between them, and the flag for the next cycle is a pick
between two compares of registers.

Same ports and meaning as AsyncFIFO: `w_data`, `w_en`, `w_rdy` (room for a write this
cycle); `r_data`, `r_en`, `r_rdy` (`r_data` holds the oldest entry this cycle). `depth`
is a power of two; the memory is read asynchronously (LUT RAM), so `r_data` comes from
the read pointer's register through the RAM alone. Both domains leave reset together
(the boards' resets do; a side reset alone loses the pointers' agreement).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out


def gray(v):
    return v ^ (v >> 1)


class AsyncFifo(wiring.Component):
    """`w_*` in `w_domain`, `r_*` in `r_domain`; `depth` entries of `width` bits."""

    def __init__(self, *, width: int, depth: int, w_domain: str, r_domain: str) -> None:
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"AsyncFifo depth must be a power of two >= 2, not {depth}")
        self.width, self.depth = width, depth
        self.w_domain, self.r_domain = w_domain, r_domain
        super().__init__(
            {
                "w_data": In(width),
                "w_en": In(1),
                "w_rdy": Out(1),
                "r_data": Out(width),
                "r_en": In(1),
                "r_rdy": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        bits = self.depth.bit_length()  # one more than the address: full vs empty
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
        wr = mem.write_port(domain=self.w_domain)
        rd = mem.read_port(domain="comb")
        w = _pointer(m, self.w_domain, "w", self.w_en, self.w_rdy, bits)
        r = _pointer(m, self.r_domain, "r", self.r_en, self.r_rdy, bits)
        w_at_r, r_at_w = Signal(bits), Signal(bits)
        m.submodules.w_to_r = FFSynchronizer(w.gray, w_at_r, o_domain=self.r_domain)
        m.submodules.r_to_w = FFSynchronizer(r.gray, r_at_w, o_domain=self.w_domain)
        # room: the write pointer not a lap ahead of the read pointer (in gray: the top two
        # bits inverted, the rest equal); data: the pointers differ. Each is a register,
        # for the pointer as it will be after this cycle, against the other side's as
        # seen now (a cycle late at worst: a flag may say no once too often, never yes).
        lap = 0b11 << (bits - 2)
        _flag(m, w, lambda g: g != (r_at_w ^ lap))
        _flag(m, r, lambda g: g != w_at_r)
        m.d.comb += [
            wr.addr.eq(w.ptr[: bits - 1]),
            wr.data.eq(self.w_data),
            wr.en.eq(w.move),
            rd.addr.eq(r.ptr[: bits - 1]),
            self.r_data.eq(rd.data),
        ]
        return m


def _pointer(m: Module, domain: str, side: str, en, rdy, bits: int) -> SimpleNamespace:
    """One side's pointer, now and plus one, binary and gray: all registers, a move picks."""
    p = SimpleNamespace(domain=domain, rdy=rdy, move=Signal(name=f"{side}_move"))
    p.ptr, p.ptr1 = Signal(bits, name=f"{side}_ptr"), Signal(bits, name=f"{side}_ptr1", init=1)
    p.gray, p.gray1 = Signal(bits, name=f"{side}_gray"), Signal(bits, name=f"{side}_gray1", init=1)
    m.d.comb += p.move.eq(en & rdy)
    after = (p.ptr1 + 1)[:bits]  # wraps: its gray code must not see the carry
    with m.If(p.move):
        m.d[domain] += [p.ptr.eq(p.ptr1), p.ptr1.eq(after), p.gray.eq(p.gray1),
                        p.gray1.eq(gray(after))]  # fmt: skip
    return p


def _flag(m: Module, p: SimpleNamespace, open_) -> None:
    """The side's flag for the next cycle: open_(its gray pointer after this cycle)."""
    m.d[p.domain] += p.rdy.eq(Mux(p.move, open_(p.gray1), open_(p.gray)))
