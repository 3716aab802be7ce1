"""The aggregator's readout: the means of each ended op, slot by slot, through a
digit-table divider.

Model: `host/model/aggregator.py: Aggregator.means` (`mean_by_reciprocal`, which is
exactly mean = sign(S) * floor((2|S| + n) / 2n) for a slot's sum S of n contributions);
here the quotient comes from `hw/digit_divider.py` (block-RAM tables, no multiplier) when
the divisors are few (n_max = 8: 10 stages), else from the reciprocal multiply. A slot of
no contribution (n = 0) gives 0, as the model's table entry 0 does. The aggregator
queues the contexts of ended ops that own slots (`push`, in end order); this block takes
them one at a time while the aggregator is not in a payload (`hold`): for each owned row,
the slot's contributor count from the bitmap memory (`bm_*`), then its P / lanes
accumulator words (`acc_*`, one a cycle) through the pipeline onto `o`, with the op id,
the slot index (rank + row * world) and the count.

The aggregator owns the memories and muxes their read ports: this block asks for the
bitmap row (`bm_read`, `bm_addr`) and the accumulator word (`acc_issue`, `acc_addr`,
`acc_en` = the pipeline moves), and gets their outputs a cycle later. Accumulators in
SDRAM fetch a row first: `row_fetch` strobes as a row's count is read, and the row's
words stream once `acc_ready` says it is in (on chip it is always high). `busy` holds until
the memory's last output is taken: an event's payload would otherwise drive the read port
while `o` stalls the readout.

Pipeline (each stage a register, 125 MHz): 1 the memory output, 2 its register, 3 |S|,
4 2|S| + n, then the divider's stages (one per quotient digit), then `o`; a slot's beats
go one a cycle, and two cycles between slots read its count.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.aggregator import reciprocal_shift, reciprocal_table
from optireduce.hw import digit_divider
from optireduce.hw import wide_multiplier as wmul
from optireduce.hw.carry_select import negate_if
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


class MeanReadout(wiring.Component):
    """Means of ended ops onto `o` (see the module docstring).

    `head` is the context at the queue's head, `head_mine` its slot count (rows to read);
    `ctx` the context being read and `op` its op id, both looked up by the owner.
    """

    def __init__(self, p: NicParams, n_ctx: int, rows_max: int, w_acc: int) -> None:
        self.p, self.n_ctx, self.rows_max, self.w_acc = p, n_ctx, rows_max, w_acc
        self.beats = p.p // p.lanes
        self.npk_max = p.c // p.p
        cb, rb, bb = _bits(n_ctx), _bits(rows_max), _bits(self.beats)
        n_cnt = range(p.n_max + 1)
        rcv_shape = range(rows_max + 1)
        super().__init__(
            {
                "rank": In(range(p.n_max)),
                "world": In(range(p.n_max + 1)),
                # the queue of ended contexts
                "push": In(1),
                "push_ctx": In(cb),
                "pending": Out(1),
                "hold": In(1),
                "busy": Out(1),
                "head": Out(cb),
                "head_mine": In(rcv_shape),
                "ctx": Out(cb),
                "op": In(32),
                # memory reads
                "bm_read": Out(1),
                "bm_addr": Out(rb + cb),
                "bm_count": In(n_cnt),
                "row_fetch": Out(1),
                "acc_ready": In(1, init=1),
                "acc_en": Out(1),
                "acc_issue": Out(1),
                "acc_addr": Out(bb + rb + cb),
                "acc_data": In(p.lanes * w_acc),
                # the means
                "o": Out(element_stream(p.w_wire, p.lanes)),
                "o_op": Out(32),
                "o_index": Out(range(self.npk_max)),
                "o_count": Out(n_cnt),
            }
        )

    def elaborate(self, platform):
        m = Module()
        p, n_ctx, beats = self.p, self.n_ctx, self.beats
        cb, rb, bb = _bits(n_ctx), _bits(self.rows_max), _bits(beats)

        # readout queue (context indices, in end order)
        q = Array(Signal(cb, name=f"q{k}") for k in range(n_ctx))
        q_head, q_tail = Signal(cb), Signal(cb)
        q_n = Signal(range(n_ctx + 1))
        q_pop = Signal()
        with m.If(self.push):
            m.d.sync += [q[q_tail].eq(self.push_ctx), q_tail.eq(q_tail + 1)]
        with m.If(q_pop):
            m.d.sync += q_head.eq(q_head + 1)
        m.d.sync += q_n.eq(q_n + self.push - q_pop)
        m.d.comb += [self.pending.eq(q_n != 0), self.head.eq(q[q_head])]

        ro_c = Signal(cb)
        ro_mine = Signal(range(self.rows_max + 1))  # the op's slot count: the rows to read
        ro_row = Signal(rb + 1)
        ro_beat = Signal(bb + 1)
        ro_idx = Signal(range(self.npk_max + p.n_max + 1))
        ro_n = Signal(range(p.n_max + 1))
        adv = Signal()
        issue = Signal()
        m.d.comb += [adv.eq(~self.o.valid | self.o.ready), self.ctx.eq(ro_c)]

        with m.FSM() as ro:
            with m.State("IDLE"), m.If((q_n != 0) & ~self.hold):
                m.d.comb += q_pop.eq(1)
                m.d.sync += [
                    ro_c.eq(self.head),
                    ro_mine.eq(self.head_mine),
                    ro_row.eq(0),
                    ro_idx.eq(self.rank),
                ]
                m.next = "ROW"
            with m.State("ROW"):
                # the read does not wait for the compare (a row past the last is not used)
                m.d.comb += [self.bm_read.eq(1), self.bm_addr.eq(Cat(ro_row[:rb], ro_c))]
                with m.If(ro_row == ro_mine):
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.row_fetch.eq(1)
                    m.next = "COUNT"
            with m.State("COUNT"):
                m.d.sync += [
                    ro_n.eq(self.bm_count),
                    ro_beat.eq(0),
                ]
                with m.If(self.acc_ready):
                    m.next = "STREAM"
                with m.Else():  # the row is on its way: keep its count coming
                    m.d.comb += [self.bm_read.eq(1), self.bm_addr.eq(Cat(ro_row[:rb], ro_c))]
            with m.State("STREAM"), m.If(adv):
                m.d.comb += issue.eq(1)
                m.d.sync += ro_beat.eq(ro_beat + 1)
                with m.If(ro_beat == beats - 1):
                    m.d.sync += [ro_row.eq(ro_row + 1), ro_idx.eq(ro_idx + self.world)]
                    m.next = "ROW"

        m.d.comb += [
            self.acc_en.eq(adv),
            self.acc_issue.eq(issue),
            self.acc_addr.eq(Cat(ro_beat[:bb], ro_row[:rb], ro_c)),
        ]
        s1 = self._means(m, adv, platform)
        m.d.comb += self.busy.eq(~ro.ongoing("IDLE") | s1.v)
        with m.If(adv):
            m.d.sync += [
                s1.v.eq(issue),
                s1.first.eq(ro_beat == 0),
                s1.last.eq(ro_beat == beats - 1),
                s1.n.eq(ro_n),
                s1.op.eq(self.op),
                s1.idx.eq(ro_idx),
            ]
        return m

    @staticmethod
    def divisors(p: NicParams) -> list[int]:
        """The divider's divisors: 2n for n = 1..n_max, selected by n - 1."""
        return [2 * n for n in range(1, p.n_max + 1)]

    @staticmethod
    def uses_digits(p: NicParams, w_acc: int | None = None) -> bool:
        """The digit-table divider (few, small divisors), else the reciprocal multiply
        (`mean_by_reciprocal`: a grid of DSPs and their adders; n_max above 8 or so).
        `w_acc`: the accumulators' width (NicParams.w_acc unless a test narrows it)."""
        w = p.w_acc if w_acc is None else w_acc
        return digit_divider.fits(w + 2, MeanReadout.divisors(p))

    @staticmethod
    def divider_latency(p: NicParams, w_acc: int | None = None) -> int:
        """The divider's stages for the numerator 2|S| + n (w_acc + 2 bits)."""
        w = p.w_acc if w_acc is None else w_acc
        if MeanReadout.uses_digits(p, w):
            return digit_divider.latency(w + 2, MeanReadout.divisors(p))
        return wmul.LATENCY

    def _means(self, m: Module, adv, platform):
        """The pipeline from the accumulator word to `o`; returns its first stage's
        registers (the word's facts, loaded by the caller as the read is issued)."""
        p, w_acc, lanes = self.p, self.w_acc, self.p.lanes
        divisors, lat = self.divisors(p), self.divider_latency(p, w_acc)
        stage = data.StructLayout(
            {
                "v": 1,
                "first": 1,
                "last": 1,
                "n": range(p.n_max + 1),
                "op": 32,
                "idx": range(self.npk_max),
            }
        )
        s1, sr, sm, s2 = Signal(stage), Signal(stage), Signal(stage), Signal(stage)
        sp = [Signal(stage, name=f"sp{d}") for d in range(lat)]  # beside the quotient
        num2 = [Signal(w_acc + 2, name=f"num2_{k}") for k in range(lanes)]
        neg2 = [Signal(name=f"neg2_{k}") for k in range(lanes)]
        with m.If(adv):
            m.d.sync += [
                sr.eq(s1),
                sm.eq(sr),
                s2.eq(sm),
                sp[0].eq(s2),
                *(sp[d].eq(sp[d - 1]) for d in range(1, lat)),
                self.o.valid.eq(sp[-1].v),
                self.o.payload.first.eq(sp[-1].first),
                self.o.payload.last.eq(sp[-1].last),
                self.o_op.eq(sp[-1].op),
                self.o_index.eq(sp[-1].idx),
                self.o_count.eq(sp[-1].n),
            ]
        table = reciprocal_table(p)  # the multiply's (when the digit tables do not fit)
        recips = Array(Const(v, max(table).bit_length()) for v in table)
        for k in range(lanes):
            sv = Signal(signed(w_acc), name=f"sv_{k}")
            mag = Signal(w_acc, name=f"mag_{k}")
            neg_m = Signal(name=f"negm_{k}")
            with m.If(adv):
                m.d.sync += [
                    sv.eq(self.acc_data[k * w_acc : (k + 1) * w_acc].as_signed()),
                    mag.eq(negate_if(m, sv, sv < 0, w_acc, platform=platform, name=f"mag{k}")),
                    neg_m.eq(sv < 0),
                    num2[k].eq((mag << 1) + sm.n),
                    neg2[k].eq(neg_m),
                ]
            neg = digit_divider.delay(m, neg2[k], lat, adv, f"neg_{k}")
            zero = digit_divider.delay(m, s2.n == 0, lat, adv, f"zero_{k}")  # n = 0: mean 0
            if self.uses_digits(p, w_acc):
                sel = (s2.n - 1)[: (len(divisors) - 1).bit_length()]
                q_mag = digit_divider.digit_divide(m, num2[k], sel, divisors, adv, f"div_{k}")
            else:  # the reciprocal looked up where the product takes it
                prod = wmul.wide_multiply(m, num2[k], recips[s2.n], adv, name=f"prod_{k}")
                q_mag = prod >> reciprocal_shift(p)
            with m.If(adv):
                out = self.o.payload.data[k]
                signed_ = negate_if(m, q_mag, neg, len(out), platform=platform,
                                    name=f"mean{k}", zero=zero)  # fmt: skip
                m.d.sync += out.eq(signed_)
        return s1
