"""a + (b if keep else 0) in one carry chain: on the ECP5, the mask in the chain's LUTs.

An adder behind a select (`Mux(keep, a + b, a)`) maps to a CCU2C chain and a LUT per bit
for the select. Each half of a CCU2C is a LUT4 whose output is the bit's propagate, and
the adder uses two of its inputs (A, B): the mask fits in a third (C). With D at 1 the
LUT4 reads the top byte of INIT, propagate = A ^ (B & C); the generate reads the low
nibble with A, B alone, and A is right there: where the propagate is 0 the two addends
are equal. So the select costs no LUT. The chain starts with a half whose propagate and
generate are 0, so its carry out is 0 without a carry-in (the form sim/ecp5_carry_map.vmap
leaves unconnected: nextpnr puts no cell in front to feed a constant).

Elsewhere (simulation, other FPGAs) it is the plain expression. tests/test_masked_add.py
proves the chain equal to it through yosys's model of the CCU2C.
"""

from __future__ import annotations

from amaranth import Cat, Const, Instance, Module, Mux, Signal, Value

# INIT of a half: top byte by (C, B, A) with D = 1, low nibble by (B, A)
PROPAGATE = sum(1 << (8 + k) for k in range(8) if (k & 1) ^ ((k >> 1) & (k >> 2) & 1))
GENERATE_A = 0b1010  # the generate is A
INIT = PROPAGATE | GENERATE_A


def uses_ccu2c(platform) -> bool:
    """Whether `platform` is an ECP5 (whose builds can take CCU2C instances)."""
    return getattr(platform, "family", None) == "ecp5"


def masked_add(m: Module, a: Value, b: Value, keep: Value, *, platform, name: str) -> Signal:
    """a + (b if keep else 0), len(a) bits (b is sign- or zero-extended by its shape, then
    cut to len(a); the sum wraps)."""
    width = len(a)
    out = Signal(width, name=name)
    b_ext = Value.cast(b)
    b_ext = b_ext.as_signed() if b_ext.shape().signed else b_ext
    b_bits = Signal(width, name=f"{name}_b")
    m.d.comb += b_bits.eq(b_ext)
    if not uses_ccu2c(platform):
        m.d.comb += out.eq(a + Mux(keep, b_bits, 0))
        return out
    a_bits = Value.cast(a)
    # halves: a first one that makes the carry 0, then one per bit
    halves = [(None, None)] + [(a_bits[j], b_bits[j]) for j in range(width)]
    if len(halves) % 2:
        halves.append((None, None))
    carry = Const(0)  # the carry map's last passes leave the first CIN unconnected
    sums = []
    for k in range(0, len(halves), 2):
        ports, params = {}, {}
        for h in (0, 1):
            ab = halves[k + h]
            used = ab[0] is not None
            params[f"p_INIT{h}"] = INIT if used else 0
            params[f"p_INJECT1_{h}"] = "NO"
            s = Signal(name=f"{name}_s{k + h}")
            ports |= {f"i_A{h}": ab[0] if used else 0, f"i_B{h}": ab[1] if used else 0,
                      f"i_C{h}": keep if used else 0, f"i_D{h}": 1, f"o_S{h}": s}  # fmt: skip
            if used:
                sums.append(s)
        cout = Signal(name=f"{name}_c{k // 2 + 1}")
        m.submodules[f"{name}_ccu{k // 2}"] = Instance(
            "CCU2C", **params, i_CIN=carry, o_COUT=cout, **ports
        )
        carry = cout
    m.d.comb += out.eq(Cat(*sums))
    return out
