"""An unsigned product wider than one DSP, pipelined for 125 MHz.

`a * b` in one cycle needs a grid of ECP5 MULT18X18D plus an adder tree in the same
cycle: 17.6 ns for the aggregator's 37 x 43-bit mean (sum x reciprocal). Here the
operands are cut into CHUNK-bit pieces (one DSP each, unsigned 17 x 17 fits its 18 x 18
signed inputs), every partial product is registered, then the partials of each piece
of `a` are summed (registered), then those rows (registered): LATENCY cycles, each
stage advancing only with `en` (the owner's pipeline enable).
"""

from __future__ import annotations

from amaranth import Module, Signal

CHUNK = 17
LATENCY = 3


def pieces(v, width: int) -> list:
    return [v[k : min(k + CHUNK, width)] for k in range(0, width, CHUNK)]


def wide_multiply(m: Module, a, b, en, name: str = "wmul") -> Signal:
    """The registered product a * b (unsigned), LATENCY enabled cycles after a and b."""
    wa, wb = len(a), len(b)
    pa, pb = pieces(a, wa), pieces(b, wb)
    partial = {}
    for i, x in enumerate(pa):
        for j, y in enumerate(pb):
            partial[i, j] = Signal(len(x) + len(y), name=f"{name}_pp{i}_{j}")
            with m.If(en):
                m.d.sync += partial[i, j].eq(x * y)
    rows = []
    for i in range(len(pa)):
        row = Signal(len(pa[i]) + wb, name=f"{name}_row{i}")
        with m.If(en):
            m.d.sync += row.eq(sum(partial[i, j] << (CHUNK * j) for j in range(len(pb))))
        rows.append(row)
    out = Signal(wa + wb, name=name)
    with m.If(en):
        m.d.sync += out.eq(sum(r << (CHUNK * i) for i, r in enumerate(rows)))
    return out
