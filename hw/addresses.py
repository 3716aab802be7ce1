"""A rank's addresses in gateware: a build-time base plus a rank of a few bits.

A MAC is 48 bits and an IPv4 address 32, but a rank is a few bits wide. `Const(base, 48)
+ rank` is a carry chain the width of the base (24 CCU2C for a MAC), which yosys keeps
whole. Here the low bits take an adder as wide as the rank, and the high bits are one of
two constants, the base's or the base's plus the carry: per bit a wire, its inverse or a
constant.
"""

from __future__ import annotations

from amaranth import Cat, Const, Mux, Value


def plus_base(base: int, r: Value, bits: int) -> Value:
    """(base + r) mod 2^bits, `bits` wide, for an unsigned `r`."""
    w = len(r)
    if w >= bits:
        return (Const(base % (1 << bits), bits) + r)[:bits]
    lo = Const(base % (1 << w), w) + r  # w + 1 bits: the carry on top
    n_hi = bits - w
    hi, hi1 = (((base >> w) + c) % (1 << n_hi) for c in (0, 1))
    return Cat(lo[:w], Mux(lo[w], Const(hi1, n_hi), Const(hi, n_hi)))
