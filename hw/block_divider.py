"""Decode estimator: divide each inverse-transformed block by D, rounding half away from zero.

Model: `host/model/codec.py: decode`, the step after the inverse FWHT,

    v = sign(t) * floor((2|t| + D) / (2D))      (codec.div_round)

with D = p.b for the "plain" estimator and D = k * p.p for "unbiased", where k
(1..b/p) is the number of reduced packets the block received. A block with k = 0
outputs zeros (in decode such a block is all zeros already, so t = 0).

No divider: a multiply by a reciprocal-table entry and a shift (the same scheme
as `host/model/aggregator.py: reciprocal_table / mean_by_reciprocal`). `divide_model`
below is that arithmetic in Python; the tests check it, and the gateware, against
`codec.div_round`.

Derivation (p = 2^a, D = k p, P_b = b/p packets per block, w = width_in):

1. D is a multiple of 2^a, so the a low bits of 2|t| + D can be dropped first
   (floor(floor(X / p) / 2k) = floor(X / 2kp) for positive integers):

       floor((2|t| + D) / 2D) = floor(N / 2k),   N = (2|t| >> a) + k.

2. Reciprocal: m_k = ceil(2^s / 2k), e = m_k * 2k - 2^s with 0 <= e < 2k. Write
   N = q * 2k + r (0 <= r < 2k). Then

       N m_k / 2^s = q + r / 2k + N e / (2k 2^s),

   and the floor is q exactly when N e < 2^s (the two fractions stay below 1, worst
   case r = 2k - 1). Since e < 2k <= 2 P_b, it suffices that N_max * 2 P_b <= 2^s.

3. Bound: for every |t| < 2^w (more than a w-bit signed input can hold),
   2|t| < 2^(w+1), so N < 2^(w+1-a) + P_b <= 2^(w+2-a); with 2 P_b = 2^(log2 P_b + 1),

       s = w + 3 - a + log2(P_b)                       (SHIFT; 43 with the defaults)

   makes the quotient exact for every such t and every D in {p, 2p, ..., b}.
   m_k equals ceil(2^(s+a) / 2D): the table is the brief's ceil(2^S / 2D) with S = s + a.

4. Output width: a w-bit signed t has |t| <= 2^(w-1), so |v| <= floor((2^w + p) / 2p)
   = 2^(w-1-a) (the smallest D = p gives the largest quotient; for p >= 2 the + p/2p
   rounds down). The largest positive result is floor((2^w - 2 + p) / 2p), also
   2^(w-1-a) for p >= 2, so it needs w + 1 - a bits signed (37 with the defaults:
   w_inv = 44, p = 256). `quotient_width` computes it exactly for any p.

Interface:
- `i`: element_stream(width_in, lanes), `first`/`last` mark each block of b elements.
- `k`: a side stream, one value per block (0..b/p), taken with the block's first
  beat: i stalls on a first beat until k is valid. The gather buffer emits it when it
  starts a block; put a FIFO between the two as deep as the blocks in flight in the
  inverse transform.
- `plain`: estimator select (1 = plain, D = b; 0 = unbiased, D = k p), sampled with
  each block's k.
- `o`: element_stream(width_out, lanes), markers passed through.

Pipeline: register (N, sign, m) -> partial products of N by 18-bit slices of m
(one DSP column each) -> sum, shift, sign -> o. One element per lane per cycle;
the stages advance together whenever o can take a beat. With few packets per block
(P_b <= 4 or so: `uses_digits`) the quotient floor(N / 2k) comes instead from
`hw/digit_divider.py` (block-RAM digit tables, a stage per digit; k = 0 selects the
table of zeros), with no multiplier: register (N, sign, k) -> the digit stages -> sign
-> o (`LATENCY` then counts the stages).
"""

from __future__ import annotations

from amaranth import Array, Const, Module, Mux, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.codec import div_round
from optireduce.hw import digit_divider
from optireduce.hw.carry_select import negate_if
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams

_SLICE = 18  # ECP5 MULT18X18D operand width


def recip_shift(p: NicParams, width_in: int) -> int:
    """s of the derivation in the module docstring."""
    a = p.p.bit_length() - 1
    return width_in + 3 - a + (p.packets_per_block.bit_length() - 1)


def recip_table(p: NicParams, width_in: int) -> list[int]:
    """m_k = ceil(2^s / 2k) for k = 0..b/p (entry 0 is 0: an empty block gives zeros)."""
    s = recip_shift(p, width_in)
    return [0] + [-(-(1 << s) // (2 * k)) for k in range(1, p.packets_per_block + 1)]


def quotient_width(p: NicParams, width_in: int) -> int:
    """Smallest signed width holding v for every w-bit signed t and every D >= p."""
    lo, hi = -(1 << (width_in - 1)), (1 << (width_in - 1)) - 1
    vmax = (2 * hi + p.p) // (2 * p.p)  # largest positive result (t = hi, D = p)
    vneg = (2 * abs(lo) + p.p) // (2 * p.p)
    w = 1
    while not (vmax <= (1 << (w - 1)) - 1 and vneg <= 1 << (w - 1)):
        w += 1
    return w


def divide_model(t: int, k: int, plain: bool, p: NicParams, width_in: int) -> int:
    """One element as the gateware computes it (reciprocal multiply, no divider)."""
    if k == 0:
        return 0
    kk = p.packets_per_block if plain else k
    a = p.p.bit_length() - 1
    n = ((2 * abs(t)) >> a) + kk
    mag = (n * recip_table(p, width_in)[kk]) >> recip_shift(p, width_in)
    return -mag if t < 0 else mag


class BlockDivider(wiring.Component):
    """v = round(t / D) per block, D from the block's k (see the module docstring)."""

    LATENCY = 3
    MODEL = div_round  # decode's rounding division after the inverse FWHT

    def __init__(self, p: NicParams, width_in: int | None = None) -> None:
        self.p = p
        self.width_in = p.w_inv if width_in is None else width_in
        self.width_out = quotient_width(p, self.width_in)
        self.shift = recip_shift(p, self.width_in)
        self.table = recip_table(p, self.width_in)
        ppb = p.packets_per_block
        a = p.p.bit_length() - 1
        self.w_n = self.width_in + 1 - a  # N <= 2^(w-a) + P_b
        # divisors by k: 0 (an empty block: zeros), then 2k
        self.divisors = [0] + [2 * k for k in range(1, ppb + 1)]
        self.uses_digits = digit_divider.fits(self.w_n, self.divisors)
        if self.uses_digits:
            self.LATENCY = 2 + digit_divider.latency(self.w_n, self.divisors)
        super().__init__(
            {
                "i": In(element_stream(self.width_in, p.lanes)),
                "k": In(stream.Signature(range(ppb + 1))),
                "plain": In(1),
                "o": Out(element_stream(self.width_out, p.lanes)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        p, lanes = self.p, self.p.lanes
        a = p.p.bit_length() - 1
        ppb = p.packets_per_block
        w_n = self.w_n
        w_m = max(v.bit_length() for v in self.table)
        n_slices = -(-w_m // _SLICE)

        # One enable for the whole pipeline: it moves whenever the output can move.
        adv = Signal()
        m.d.comb += adv.eq(self.o.ready | ~self.o.valid)

        # Current block's reciprocal: taken from k with the first beat, held for the block.
        cur_m = Signal(w_m)
        rom = Array(Const(v, w_m) for v in self.table)
        k_eff = Signal(range(ppb + 1))
        m.d.comb += k_eff.eq(Mux(self.plain & (self.k.payload != 0), ppb, self.k.payload))
        first = self.i.payload.first
        m.d.comb += [
            self.i.ready.eq(adv & (~first | self.k.valid)),
            self.k.ready.eq(adv & self.i.valid & first),
        ]
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)
        m_now = Signal(w_m)
        m.d.comb += m_now.eq(Mux(first, rom[k_eff], cur_m))
        with m.If(take & first):
            m.d.sync += cur_m.eq(rom[k_eff])

        # Stage 1: N = (2|t| >> a) + k, the sign, m.
        v1, first1, last1 = Signal(), Signal(), Signal()
        n1 = [Signal(w_n, name=f"n1_{j}") for j in range(lanes)]
        neg1 = [Signal(name=f"neg1_{j}") for j in range(lanes)]
        m1 = Signal(w_m)
        # k of the recipe (the plain estimator's b/p already folded in), held for the block.
        cur_k, kk = Signal(range(ppb + 1)), Signal(range(ppb + 1))
        m.d.comb += kk.eq(Mux(first, k_eff, cur_k))
        with m.If(take & first):
            m.d.sync += cur_k.eq(k_eff)
        with m.If(adv):
            m.d.sync += [
                v1.eq(take),
                first1.eq(first),
                last1.eq(self.i.payload.last),
                m1.eq(m_now),
            ]
            for j in range(lanes):
                t = self.i.payload.data[j]
                mag = Signal(unsigned(self.width_in), name=f"mag_{j}")
                m.d.comb += mag.eq(negate_if(m, t, t < 0, self.width_in, platform=platform,
                                             name=f"tmag{j}"))  # fmt: skip
                m.d.sync += [n1[j].eq(((mag << 1) >> a) + kk), neg1[j].eq(t < 0)]

        if self.uses_digits:
            k1 = Signal(range(ppb + 1))
            with m.If(adv):
                m.d.sync += k1.eq(kk)
            self._digit_stages(m, adv, n1, neg1, k1, (v1, first1, last1), platform)
            return m

        # Stage 2: partial products, one per 18-bit slice of m.
        v2, first2, last2 = Signal(), Signal(), Signal()
        pp2 = [
            [Signal(w_n + _SLICE, name=f"pp2_{j}_{q}") for q in range(n_slices)]
            for j in range(lanes)
        ]
        neg2 = [Signal(name=f"neg2_{j}") for j in range(lanes)]
        with m.If(adv):
            m.d.sync += [v2.eq(v1), first2.eq(first1), last2.eq(last1)]
            for j in range(lanes):
                m.d.sync += neg2[j].eq(neg1[j])
                for q in range(n_slices):
                    sl = m1[q * _SLICE : min(w_m, (q + 1) * _SLICE)]
                    m.d.sync += pp2[j][q].eq(n1[j] * sl)

        # Stage 3: sum, shift, sign -> output register.
        with m.If(adv):
            m.d.sync += [
                self.o.valid.eq(v2),
                self.o.payload.first.eq(first2),
                self.o.payload.last.eq(last2),
            ]
            for j in range(lanes):
                total = sum(pp2[j][q] << (q * _SLICE) for q in range(n_slices))
                q_mag = Signal(self.width_out, name=f"q_{j}")
                m.d.comb += q_mag.eq(total >> self.shift)
                m.d.sync += self.o.payload.data[j].eq(Mux(neg2[j], -q_mag, q_mag))
        return m

    def _digit_stages(self, m: Module, adv, n1: list, neg1: list, k1, marks: tuple,
                      platform) -> None:  # fmt: skip
        """Stage 1's N through the digit tables (floor(N / 2k), 0 for k = 0), its sign and
        markers alongside, then the signed quotient on `o`."""
        lat = digit_divider.latency(self.w_n, self.divisors)
        delayed = [digit_divider.delay(m, sig, lat, adv, sig.name) for sig in (*marks, *neg1)]
        (v, first, last), negs = delayed[:3], delayed[3:]
        with m.If(adv):
            m.d.sync += [
                self.o.valid.eq(v),
                self.o.payload.first.eq(first),
                self.o.payload.last.eq(last),
            ]
        for j, n in enumerate(n1):
            q = digit_divider.digit_divide(m, n, k1, self.divisors, adv, name=f"q_{j}")
            q_mag = q[: self.width_out]
            out = self.o.payload.data[j]
            q_signed = negate_if(m, q_mag, negs[j], len(out), platform=platform, name=f"qs{j}")
            with m.If(adv):
                m.d.sync += out.eq(q_signed)
