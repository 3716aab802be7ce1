"""Sums behind a select, with the select in the ECP5's carry chain: `masked_add` is
a + (b if keep else 0), `negate_if` is (-x if neg else x).

An adder behind a select (`Mux(keep, a + b, a)`, `Mux(neg, -x, x)`) maps to a CCU2C
chain and a LUT per bit for the select. Each half of a CCU2C is a LUT4 whose output is
its bit's propagate, and an adder uses two of its inputs (A, B): the select fits in a
third (C). With D at 1 the LUT4 reads the top byte of INIT, so the propagate is any
function of A, B, C; the generate reads the low nibble with A and B alone. A sum
x + y where x is A itself and y any function of B and C works: where the propagate is
0, x = y, so the generate is A. So
- masked_add: x = a, y = b & keep;
- negate_if: x = 0, y = x ^ neg, and a carry-in of neg (two's complement); with
  `zero`, y = (x ^ neg) & ~zero on A, B, C and a carry-in of neg & ~zero (x is 0, so
  the generate is 0).
A chain starts with a half whose propagate is 0 and whose generate is its A: the
carry-in (0, or neg), made without a CIN, in the form sim/ecp5_carry_map.vmap leaves
unconnected (nextpnr puts no cell in front of the chain to feed a constant).

Elsewhere (simulation, other FPGAs) both are the plain expressions.
tests/test_carry_select.py proves the chains equal to them through yosys's model of
the CCU2C, after the board build's carry passes.
"""

from __future__ import annotations

from amaranth import Cat, Const, Instance, Module, Mux, Signal, Value


def _init(propagate, generate=lambda a, b: a) -> int:
    """A half's INIT: the propagate in the top byte, by (C, B, A) with D = 1; the
    generate in the low nibble, by (B, A) (A by default)."""
    top = sum(1 << (8 + k) for k in range(8) if propagate(k & 1, (k >> 1) & 1, (k >> 2) & 1))
    low = sum(1 << k for k in range(4) if generate(k & 1, (k >> 1) & 1))
    return top | low << 4 | low  # the nibble twice, as yosys's own adders have it


MASKED = _init(lambda a, b, c: a ^ (b & c))  # a + (b & c)
NEGATED = _init(lambda a, b, c: b ^ c)  # 0 + (b ^ c), A at 0
CARRY_IN = _init(lambda a, b, c: 0)  # propagate 0, generate A: the chain's carry-in
# with a zero input on A: 0 + ((b ^ c) & ~a), generate 0; the carry-in A & ~B
NEGATED_OR_ZERO = _init(lambda a, b, c: (b ^ c) & (1 - a), lambda a, b: 0)
CARRY_IN_UNLESS = _init(lambda a, b, c: 0, lambda a, b: a & (1 - b))


def uses_ccu2c(platform) -> bool:
    """Whether `platform` is an ECP5 (whose builds can take CCU2C instances)."""
    return getattr(platform, "family", None) == "ecp5"


def _extended(v: Value, width: int) -> Value:
    """`v` sign- or zero-extended (by its shape) to `width` bits, or cut to them."""
    v = Value.cast(v)
    if len(v) >= width:
        return v[:width]
    pad = v[-1].replicate(width - len(v)) if v.shape().signed else Const(0, width - len(v))
    return Cat(v, pad)


def _chain(m: Module, halves: list, name: str, width: int) -> Value:
    """A CCU2C chain of `halves` (INIT, A, B, C), the first the carry-in half; returns
    the sums of the `width` halves after it. No statements are added to `m`'s domains
    (only the instances), so it may be called under any `m.If`."""
    if len(halves) % 2:
        halves = [*halves, (0, 0, 0, 0)]
    carry, sums = Const(0), []
    for k in range(0, len(halves), 2):
        ports, params = {}, {}
        for h in (0, 1):
            init, a, b, c = halves[k + h]
            s = Signal(name=f"{name}_s{k + h}")
            params |= {f"p_INIT{h}": init, f"p_INJECT1_{h}": "NO"}
            ports |= {f"i_A{h}": a, f"i_B{h}": b, f"i_C{h}": c, f"i_D{h}": 1, f"o_S{h}": s}
            sums.append(s)
        cout = Signal(name=f"{name}_c{k // 2 + 1}")
        m.submodules[f"{name}_ccu{k // 2}"] = Instance(
            "CCU2C", **params, i_CIN=carry, o_COUT=cout, **ports
        )
        carry = cout
    return Cat(*sums[1 : 1 + width])


def masked_add(m: Module, a: Value, b: Value, keep: Value, *, platform, name: str,
               width: int | None = None) -> Value:  # fmt: skip
    """a + (b if keep else 0), `width` bits (len(a) by default; a and b sign- or
    zero-extended by their shapes, then cut to it; the sum wraps). A value: it adds no
    statements to `m`."""
    width = len(Value.cast(a)) if width is None else width
    a, bb = _extended(a, width), _extended(b, width)
    if not uses_ccu2c(platform):
        return (a + Mux(keep, bb, 0))[:width]
    halves = [(CARRY_IN, 0, 0, 0)] + [(MASKED, a[j], bb[j], keep) for j in range(width)]
    return _chain(m, halves, name, width)


def negate_if(m: Module, x: Value, neg: Value, width: int, *, platform, name: str,
              zero: Value | None = None) -> Value:  # fmt: skip
    """-x if neg else x, `width` bits (x sign- or zero-extended by its shape, then cut
    to `width`; the result wraps, as Mux(neg, -x, x) assigned to `width` bits does); 0
    instead while `zero` (if given). A value: it adds no statements to `m`."""
    xx = _extended(x, width)
    if not uses_ccu2c(platform):
        out = Mux(neg, -xx, xx)[:width]
        return out if zero is None else Mux(zero, 0, out)
    if zero is None:
        halves = [(CARRY_IN, neg, 0, 0)] + [(NEGATED, 0, xx[j], neg) for j in range(width)]
    else:
        halves = [(CARRY_IN_UNLESS, neg, zero, 0)]
        halves += [(NEGATED_OR_ZERO, zero, xx[j], neg) for j in range(width)]
    return _chain(m, halves, name, width)
