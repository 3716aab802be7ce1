"""Fixed point (width <= 48 bits) -> float32, nearest even, with the op's shared exponent.

Model: host/model/quantize.py `dequantize` (docs/numerics.md section 7). With m = |v| of bit
length L, the result is the float32 nearest to m * 2^E. Normalizing m to the top of a
W-bit field (W = max(width, 26)) puts the 24 kept bits, the guard bit and the sticky bits
at fixed places, so rounding needs no variable mask:

    N = m << (W - L);  q = N[W-24:W],  g = N[W-25],  s = |N[0:W-25]
    kept = q + (g & (s | q[0]))                 round to nearest, ties to even
    e_field = L + 126 + E (+1 if kept carried into bit 24)

Subnormal results need e_field <= 0. With |m| < 2^48 and E >= -128 that only happens for
L <= 2 (e_field is 0 or -1): then q >> (1 - e_field) is exact and nothing rounds. An
e_field >= 255 clamps to +-FLT_MAX and counts in `saturated`.

Pipeline (LATENCY = 5): |v| | leading-zero count | normalize | round | assemble, clamp.
The exponent port is sampled with the `first` beat and held for the op; it travels down
the pipeline with each beat, so ops with different exponents may follow back to back.
A `clear` strobe sets `saturated` to what is counted in that same cycle.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.quantize import dequantize
from optireduce.hw.carry_select import negate_if
from optireduce.hw.streams import element_stream, float_stream
from optireduce.params import NicParams

FLT_MAX_BITS = 0x7F7FFFFF
MAX_WIDTH = 48


def _popcount(bits: list) -> object:
    total = Const(0, range(len(bits) + 1))
    for b in bits:
        total = total + b
    return total


def _leading_zeros(x) -> tuple[object, object]:
    """(x == 0, leading zeros of x) for len(x) a power of two, as a balanced tree: log2
    levels of 2:1 muxes instead of a priority chain through every bit."""
    n = len(x)
    if n == 1:
        return ~x[0], Const(0, 0)  # a 1-bit field has no leading-zero count bits
    lo_zero, lo_lz = _leading_zeros(x[: n // 2])
    hi_zero, hi_lz = _leading_zeros(x[n // 2 :])
    # hi all zero: n/2 + lz(lo), i.e. the top bit set and lz(lo) below it
    return hi_zero & lo_zero, Mux(hi_zero, Cat(lo_lz, 1), Cat(hi_lz, 0))


class Dequantizer(wiring.Component):
    """Dequantizer(p, width): i element_stream(width, p.lanes) -> o float_stream(p.lanes).

    Ports: exponent (signed 8, sampled at `first`), clear (strobe), saturated (the per-op
    count, NicParams.op_count_bits wide, of results clamped to +-FLT_MAX).
    """

    LATENCY = 5
    MODEL = dequantize

    def __init__(self, p: NicParams, width: int) -> None:
        if not 2 <= width <= MAX_WIDTH:
            raise ValueError(f"Dequantizer width must be in 2..{MAX_WIDTH}, not {width}")
        self.p, self.width = p, width
        super().__init__(
            {
                "i": In(element_stream(width, p.lanes)),
                "o": Out(float_stream(p.lanes)),
                "exponent": In(signed(8)),
                "clear": In(1),
                "saturated": Out(p.op_count_bits),
            }
        )

    def elaborate(self, platform):
        m = Module()
        lanes, width = self.p.lanes, self.width
        big = max(width, 26)  # field W: at least 24 kept bits, a guard bit and a sticky bit

        en = Signal()
        m.d.comb += [en.eq(self.o.ready | ~self.o.valid), self.i.ready.eq(en)]
        take = self.i.valid & en

        exp_held = Signal(signed(8))
        exp_now = Mux(self.i.payload.first, self.exponent, exp_held)
        with m.If(take & self.i.payload.first):
            m.d.sync += exp_held.eq(self.exponent)

        def stage(prefix: str) -> tuple[Signal, Signal, Signal, Signal]:
            return (
                Signal(name=f"{prefix}_valid"),
                Signal(name=f"{prefix}_first"),
                Signal(name=f"{prefix}_last"),
                Signal(signed(8), name=f"{prefix}_exp"),
            )

        def lane_sigs(shape, prefix: str) -> list[Signal]:
            return [Signal(shape, name=f"{prefix}_{k}") for k in range(lanes)]

        # Stage 1: sign and magnitude.
        v1, f1, l1, e1 = stage("s1")
        sign1, mag1 = lane_sigs(1, "s1_sign"), lane_sigs(big, "s1_mag")
        with m.If(en):
            m.d.sync += [
                v1.eq(self.i.valid),
                f1.eq(self.i.payload.first),
                l1.eq(self.i.payload.last),
                e1.eq(exp_now),
            ]
            for k in range(lanes):
                x = self.i.payload.data[k]
                mag = negate_if(m, x, x < 0, len(mag1[k]), platform=platform, name=f"mag{k}")
                m.d.sync += [sign1[k].eq(x < 0), mag1[k].eq(mag)]

        # Stage 2: leading zeros.
        v2, f2, l2, e2 = stage("s2")
        sign2, mag2 = lane_sigs(1, "s2_sign"), lane_sigs(big, "s2_mag")
        lz2 = lane_sigs(range(big + 1), "s2_lz")
        with m.If(en):
            m.d.sync += [v2.eq(v1), f2.eq(f1), l2.eq(l1), e2.eq(e1)]
            for k in range(lanes):
                pow2 = 1 << (big - 1).bit_length()
                _, lz = _leading_zeros(Cat(Const(0, pow2 - big), mag1[k]))  # zeros at the LSBs
                m.d.sync += [
                    sign2[k].eq(sign1[k]),
                    mag2[k].eq(mag1[k]),
                    lz2[k].eq(Mux(mag1[k] == 0, big, lz)),
                ]

        # Stage 3: normalize; biased exponent before rounding.
        v3, f3, l3, _ = stage("s3")
        sign3, norm3 = lane_sigs(1, "s3_sign"), lane_sigs(big, "s3_norm")
        zero3, eraw3 = lane_sigs(1, "s3_zero"), lane_sigs(signed(11), "s3_eraw")
        with m.If(en):
            m.d.sync += [v3.eq(v2), f3.eq(f2), l3.eq(l2)]
            for k in range(lanes):
                m.d.sync += [
                    sign3[k].eq(sign2[k]),
                    norm3[k].eq(mag2[k] << lz2[k]),
                    zero3[k].eq(lz2[k] == big),
                    eraw3[k].eq(big - lz2[k] + 126 + e2),  # L + 126 + E
                ]

        # Stage 4: round to nearest even.
        v4, f4, l4, _ = stage("s4")
        sign4, zero4, kept4 = (
            lane_sigs(1, "s4_sign"),
            lane_sigs(1, "s4_zero"),
            lane_sigs(25, "s4_kept"),
        )
        eraw4, sub4 = lane_sigs(signed(11), "s4_eraw"), lane_sigs(23, "s4_sub")
        big4, edge4 = lane_sigs(1, "s4_big"), lane_sigs(1, "s4_edge")
        with m.If(en):
            m.d.sync += [v4.eq(v3), f4.eq(f3), l4.eq(l3)]
            for k in range(lanes):
                n = norm3[k]
                q = n[big - 24 :]
                guard = n[big - 25]
                sticky = n[: big - 25].any()
                m.d.sync += [
                    sign4[k].eq(sign3[k]),
                    zero4[k].eq(zero3[k]),
                    kept4[k].eq(q + (guard & (sticky | q[0]))),
                    eraw4[k].eq(eraw3[k]),
                    sub4[k].eq(Mux(eraw3[k] == 0, q >> 1, q >> 2)),  # exact: nothing rounds
                    big4[k].eq(eraw3[k] >= 255),
                    edge4[k].eq(eraw3[k] == 254),  # overflows if the rounding carries
                ]

        # Stage 5: assemble the bits, clamp to FLT_MAX.
        over_bits = []
        with m.If(en):
            m.d.sync += [
                self.o.valid.eq(v4),
                self.o.payload.first.eq(f4),
                self.o.payload.last.eq(l4),
            ]
            for k in range(lanes):
                kept = kept4[k]
                over = Signal(name=f"s4_over_{k}")
                m.d.comb += over.eq(~zero4[k] & (big4[k] | (edge4[k] & kept[24])))
                normal = Cat(kept[:23], (eraw4[k] + kept[24])[:8])
                mag_bits = Mux(
                    zero4[k], 0, Mux(over, FLT_MAX_BITS, Mux(eraw4[k] <= 0, sub4[k], normal))
                )
                m.d.sync += self.o.payload.data[k].eq(Cat(mag_bits[:31], sign4[k]))
                over_bits.append(v4 & over)

        inc = Mux(en, _popcount(over_bits), 0)
        with m.If(self.clear):
            m.d.sync += self.saturated.eq(inc)
        with m.Else():
            m.d.sync += self.saturated.eq(self.saturated + inc)
        return m
