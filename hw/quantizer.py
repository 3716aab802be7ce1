"""float32 -> w_in-bit fixed point with the op's shared exponent, zero-padded to whole blocks.

Model: host/model/quantize.py `quantize` (docs/numerics.md section 2), followed by the zero
padding of host/model/codec.py `encode`. The bit-field algorithm is folded into one shifter:

    sh = k + 1 = max(e_f, 1) - 149 - E          (k = e2 - E)
    t  = floor(mant * 2^sh)                      (sh clamped to [-24, w_in], see below)
    mag = (t + 1) >> 1

For k >= 0, t = mant << (k + 1) is even and mag = mant << k. For k < 0 (r = -k),
floor((mant + 2^(r-1)) / 2^r) = floor((floor(mant / 2^(r-1)) + 1) / 2), i.e. round half
away from zero on the magnitude. Clamping sh at w_in keeps any nonzero mant at or above
2^(w_in-1) > q_max (still saturates); clamping at -24 still gives t = 0 (mant < 2^24).

Pipeline (LATENCY = 5): input register | fields and shift code | shift | round, saturate |
clamp, sign.
The whole pipeline advances when the output register is free, so it runs at one beat per
cycle and holds its state under backpressure.

Op framing: `first` marks an op's first beat, `last` its last. The exponent port is sampled
with the `first` beat and held for the op. After the `last` beat the block emits zero beats
until the op is a whole number of blocks of p.b elements, with `last` on the final padded
beat, and stalls `i` meanwhile. With lanes > 1 an op must be a multiple of `lanes` elements
(every input beat is full).

Counters count an element when it enters stage 4. A `clear` strobe sets them to what is
counted in that same cycle, so no element is ever lost between read and clear.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.quantize import quantize
from optireduce.hw.carry_select import negate_if
from optireduce.hw.streams import element_stream, float_stream
from optireduce.params import NicParams

SUPPORTED_LANES = (1, 2, 4)


def _popcount(bits: list) -> object:
    total = Const(0, range(len(bits) + 1))
    for b in bits:
        total = total + b
    return total


class Quantizer(wiring.Component):
    """Quantizer(p): i float_stream(p.lanes) -> o element_stream(p.w_in, p.lanes).

    Ports: exponent (signed 8, sampled at `first`), clear (strobe), saturated and nonfinite
    (per-op counts, NicParams.op_count_bits wide, counted like host/model/quantize.py
    `quantize`: NaN -> 0 is nonfinite, inf -> +-q_max is nonfinite and saturated, a finite
    clamp is saturated).
    """

    LATENCY = 5
    MODEL = quantize  # and the zero padding of codec.encode

    def __init__(self, p: NicParams) -> None:
        if p.lanes not in SUPPORTED_LANES:
            raise ValueError(f"Quantizer supports lanes in {SUPPORTED_LANES}, not {p.lanes}")
        self.p = p
        super().__init__(
            {
                "i": In(float_stream(p.lanes)),
                "o": Out(element_stream(p.w_in, p.lanes)),
                "exponent": In(signed(8)),
                "clear": In(1),
                "saturated": Out(p.op_count_bits),
                "nonfinite": Out(p.op_count_bits),
            }
        )

    def _beat(self, m: Module, en) -> tuple:
        """Stage 0: an input beat, or a padding beat that completes the last block; the
        exponent of the op the beat belongs to."""
        p, lanes = self.p, self.p.lanes
        beats_per_block = p.b // lanes
        padding = Signal()
        idx = Signal(range(beats_per_block))  # beat index inside the current block
        exp_held = Signal(signed(8))
        take = Signal()
        m.d.comb += [
            self.i.ready.eq(en & ~padding),
            take.eq(self.i.valid & self.i.ready),
        ]
        cur = Signal(range(beats_per_block))
        m.d.comb += cur.eq(Mux(self.i.payload.first, 0, idx))
        block_end = cur == beats_per_block - 1
        exp_now = Mux(take & self.i.payload.first, self.exponent, exp_held)
        with m.If(take & self.i.payload.first):
            m.d.sync += exp_held.eq(self.exponent)

        s0_valid = Signal()
        s0_first = Signal()
        s0_last = Signal()
        s0_bits = [Signal(32, name=f"s0_bits{k}") for k in range(lanes)]
        with m.If(padding):
            m.d.comb += [s0_valid.eq(1), s0_last.eq(idx == beats_per_block - 1)]
            with m.If(en):
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == beats_per_block - 1):
                    m.d.sync += padding.eq(0)
        with m.Else():
            m.d.comb += [
                s0_valid.eq(take),
                s0_first.eq(self.i.payload.first),
                s0_last.eq(self.i.payload.last & block_end),
            ]
            m.d.comb += [s0_bits[k].eq(self.i.payload.data[k]) for k in range(lanes)]
            with m.If(take):
                m.d.sync += idx.eq(cur + 1)
                with m.If(self.i.payload.last & ~block_end):
                    m.d.sync += padding.eq(1)
        return s0_valid, s0_first, s0_last, s0_bits, exp_now

    def elaborate(self, platform):
        m = Module()
        p, lanes, w_in = self.p, self.p.lanes, self.p.w_in
        code_max = w_in + 24  # shift code c = clamp(sh, -24, w_in) + 24
        t_width = w_in + 24  # t = (mant << code) >> 24 < 2^(w_in + 24)

        en = Signal()  # the whole pipeline moves one step
        m.d.comb += en.eq(self.o.ready | ~self.o.valid)

        s0_valid, s0_first, s0_last, s0_bits, exp_now = self._beat(m, en)

        # Stage 1: register the beat, and turn the exponent into the constants of the shift
        # code c = sh + 24 = max(e_f, 1) - 125 - E, so that stage 2 has a single adder and two
        # comparisons side by side: c < 0 <=> max(e_f, 1) < 125 + E, c > code_max <=>
        # max(e_f, 1) > code_max + 125 + E.
        v0, f0, l0 = Signal(), Signal(), Signal()
        c_off = Signal(signed(10))  # -125 - E
        c_lo = Signal(signed(10))  # 125 + E
        c_hi = Signal(signed(10))  # code_max + 125 + E
        bits0 = [Signal(32, name=f"bits0_{k}") for k in range(lanes)]
        ef0 = [Signal(signed(10), name=f"ef0_{k}") for k in range(lanes)]  # max(e_f, 1)
        with m.If(en):
            m.d.sync += [
                v0.eq(s0_valid),
                f0.eq(s0_first),
                l0.eq(s0_last),
                c_off.eq(-125 - exp_now),
                c_lo.eq(125 + exp_now),
                c_hi.eq(code_max + 125 + exp_now),
            ]
            for k in range(lanes):
                ef = s0_bits[k][23:31]
                m.d.sync += [bits0[k].eq(s0_bits[k]), ef0[k].eq(Mux(ef == 0, 1, ef))]

        # Stage 2: bit fields, specials and the shift code.
        v1, f1, l1 = Signal(), Signal(), Signal()
        sign1 = [Signal(name=f"sign1_{k}") for k in range(lanes)]
        nan1 = [Signal(name=f"nan1_{k}") for k in range(lanes)]
        inf1 = [Signal(name=f"inf1_{k}") for k in range(lanes)]
        mant1 = [Signal(24, name=f"mant1_{k}") for k in range(lanes)]
        code1 = [Signal(range(code_max + 1), name=f"code1_{k}") for k in range(lanes)]
        with m.If(en):
            m.d.sync += [v1.eq(v0), f1.eq(f0), l1.eq(l0)]
            for k in range(lanes):
                bits = bits0[k]
                ef, frac = bits[23:31], bits[0:23]
                ef1 = ef0[k]
                c = Signal(signed(11), name=f"c0_{k}")
                m.d.comb += c.eq(ef1 + c_off)
                code = Mux(ef1 < c_lo, 0, Mux(ef1 > c_hi, code_max, c))
                m.d.sync += [
                    sign1[k].eq(bits[31]),
                    nan1[k].eq((ef == 0xFF) & (frac != 0)),
                    inf1[k].eq((ef == 0xFF) & (frac == 0)),
                    mant1[k].eq(Cat(frac, ef != 0)),
                    code1[k].eq(code),
                ]

        # Stage 3: t = floor(mant * 2^(code - 24)).
        v2, f2, l2 = Signal(), Signal(), Signal()
        sign2 = [Signal(name=f"sign2_{k}") for k in range(lanes)]
        nan2 = [Signal(name=f"nan2_{k}") for k in range(lanes)]
        inf2 = [Signal(name=f"inf2_{k}") for k in range(lanes)]
        t2 = [Signal(t_width, name=f"t2_{k}") for k in range(lanes)]
        with m.If(en):
            m.d.sync += [v2.eq(v1), f2.eq(f1), l2.eq(l1)]
            for k in range(lanes):
                wide = Signal(24 + code_max, name=f"wide1_{k}")
                m.d.comb += wide.eq(mant1[k] << code1[k])
                m.d.sync += [
                    sign2[k].eq(sign1[k]),
                    nan2[k].eq(nan1[k]),
                    inf2[k].eq(inf1[k]),
                    t2[k].eq(wide[24:]),
                ]

        # Stage 4: round half away from zero; saturation straight from t (no carry chain):
        # mag = (t + 1) >> 1 > q_max = 2^(w_in-1) - 1  <=>  t >= 2^w_in - 1.
        v3, f3, l3 = Signal(), Signal(), Signal()
        sign3 = [Signal(name=f"sign3_{k}") for k in range(lanes)]
        nan3 = [Signal(name=f"nan3_{k}") for k in range(lanes)]
        over3 = [Signal(name=f"over3_{k}") for k in range(lanes)]
        mag3 = [Signal(w_in - 1, name=f"mag3_{k}") for k in range(lanes)]
        sat_bits, nf_bits = [], []
        with m.If(en):
            m.d.sync += [v3.eq(v2), f3.eq(f2), l3.eq(l2)]
            for k in range(lanes):
                t = t2[k]
                over = ~nan2[k] & (inf2[k] | t[w_in:].any() | t[:w_in].all())
                m.d.sync += [
                    sign3[k].eq(sign2[k]),
                    nan3[k].eq(nan2[k]),
                    over3[k].eq(over),
                    mag3[k].eq((t[:w_in] + 1) >> 1),
                ]
                sat_bits.append(v2 & over)
                nf_bits.append(v2 & (nan2[k] | inf2[k]))

        # Stage 5: clamp and sign.
        with m.If(en):
            m.d.sync += [
                self.o.valid.eq(v3),
                self.o.payload.first.eq(f3),
                self.o.payload.last.eq(l3),
            ]
            for k in range(lanes):
                clamped = Mux(nan3[k], 0, Mux(over3[k], p.q_max, mag3[k]))
                out = self.o.payload.data[k]
                signed_ = negate_if(m, clamped, sign3[k], len(out), platform=platform,
                                    name=f"q_signed{k}")  # fmt: skip
                m.d.sync += out.eq(signed_)

        sat_inc = Mux(en, _popcount(sat_bits), 0)
        nf_inc = Mux(en, _popcount(nf_bits), 0)
        with m.If(self.clear):
            m.d.sync += [self.saturated.eq(sat_inc), self.nonfinite.eq(nf_inc)]
        with m.Else():
            m.d.sync += [
                self.saturated.eq(self.saturated + sat_inc),
                self.nonfinite.eq(self.nonfinite + nf_inc),
            ]
        return m
