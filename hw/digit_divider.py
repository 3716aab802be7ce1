"""Division by one of a few small divisors through block-RAM digit tables: no multiplier.

q = floor(num / divisors[sel]) for an unsigned `num`, exactly, as long division: the
quotient comes DIGIT bits at a time from the most significant end. Stage k divides
r * 2^g + (digit k of num) by d, where r < d is the remainder so far; a table in block
RAM, addressed by (sel, r, digit), gives the quotient digit (< 2^g, since r < d) and the
new remainder. One table serves every stage: each DP16KD's two ports are two stages.

It replaces a reciprocal multiply where the divisors are few and small (the mean
readout's 2n, n <= n_max): that product was a grid of DSPs and about 500 LUTs of
partial-product adders on the 25F; here the stages are flip-flops and block RAM.

Every stage advances only with `en` (the owner's pipeline enable): the quotient of a
`num` given with `sel` is out `latency` enabled cycles later. A divisor 0 stands for "the
quotient is 0" (an empty block: its table entries are all 0).
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal, Value
from amaranth.lib.memory import Memory

ADDRESS_BITS = 11  # a DP16KD as 2048 x 9
DATA_BITS = 9


MAX_STAGES = 12  # beyond this many digits (6 DP16KD) the reciprocal multiply is kept


def _remainder_bits(divisors: list[int]) -> int:
    """Bits of a remainder r < max(divisors) (a divisor 0 has none)."""
    return (max(max(divisors), 1) - 1).bit_length()


def delay(m: Module, value: Value, n: int, en: Value, name: str) -> Value:
    """`value` n enabled cycles later: a chain of registers that move with `en` (what
    travels beside the divider's stages)."""
    for d in range(n):
        r = Signal(len(Value.cast(value)), name=f"{name}_d{d}")
        with m.If(en):
            m.d.sync += r.eq(value)
        value = r
    return value


def digit_bits(divisors: list[int]) -> int:
    """The widest quotient digit g whose table fits a DP16KD: (sel, remainder, digit) in
    ADDRESS_BITS, (quotient digit, remainder) in DATA_BITS (0: none fits)."""
    rb = _remainder_bits(divisors)
    sb = (len(divisors) - 1).bit_length()
    return max(0, min(ADDRESS_BITS - rb - sb, DATA_BITS - rb))


def fits(width: int, divisors: list[int]) -> bool:
    """The divider is worth its block RAM: a table fits and at most MAX_STAGES digits."""
    g = digit_bits(divisors)
    return g > 0 and -(-width // g) <= MAX_STAGES


def digit_table(divisors: list[int]) -> list[int]:
    """The table: at (sel, r, digit), (r * 2^g + digit) // d | ((..) % d) << g for
    d = divisors[sel] and r < d (other remainders never occur: 0)."""
    g = digit_bits(divisors)
    rb = _remainder_bits(divisors)
    out = [0] * (len(divisors) << (rb + g))
    for s, d in enumerate(divisors):
        for r in range(d):  # d = 0: no entry, the quotient is 0
            for digit in range(1 << g):
                v = (r << g) | digit
                out[(s << (rb + g)) | (r << g) | digit] = (v // d) | ((v % d) << g)
    return out


def latency(width: int, divisors: list[int]) -> int:
    """Enabled cycles from `num` to its quotient: one per digit."""
    return -(-width // digit_bits(divisors))


def digit_divide(m: Module, num: Value, sel: Value, divisors: list[int], en: Value,
                 name: str = "ddiv") -> Signal:  # fmt: skip
    """floor(num / divisors[sel]), registered, `latency(len(num), divisors)` enabled cycles
    after `num` and `sel` (see the module docstring)."""
    if any(d < 0 for d in divisors) or digit_bits(divisors) < 1:
        raise ValueError(f"digit_divide: divisors {divisors} do not fit a table")
    g = digit_bits(divisors)
    rb = _remainder_bits(divisors)
    n = latency(len(num), divisors)
    width = n * g
    table = digit_table(divisors)
    mems = []
    for j in range(-(-n // 2)):
        mem = Memory(shape=g + rb, depth=len(table), init=table)
        m.submodules[f"{name}_table{j}"] = mem
        mems.append(mem)

    def digit(value, k: int):
        """Digit k of a value, from the most significant (value zero-extended to width)."""
        lo = width - g * (k + 1)
        return Cat(value, Signal(width - len(value)))[lo : lo + g]

    nums, sels, out = [num], [sel], []
    rem = Signal(rb, name=f"{name}_r_in")  # the remainder before the first digit: 0
    for k in range(n):
        port = mems[k // 2].read_port(domain="sync")
        m.d.comb += [
            port.addr.eq(Cat(digit(nums[k], k), rem, sels[k])),
            port.en.eq(en),
        ]
        q, rem = port.data[:g], port.data[g:]
        out.append(q)
        nk, sk = (
            Signal(len(num), name=f"{name}_num{k + 1}"),
            Signal(len(sel), name=f"{name}_sel{k + 1}"),
        )
        with m.If(en):
            m.d.sync += [nk.eq(nums[k]), sk.eq(sels[k])]
        nums.append(nk)
        sels.append(sk)
    # quotient digit k is out at enabled cycle k + 1: each is delayed to cycle n
    digits = [delay(m, q, n - 1 - k, en, f"{name}_q{k}") for k, q in enumerate(out)]
    quotient = Signal(width, name=name)
    m.d.comb += quotient.eq(Cat(*reversed(digits)))
    return quotient
