"""Random signs of an op: element i is negated when bit (i mod 32) of Speck32/64_K(i div 32)
is set, K = (op_id, seed) latched with the op's `first` beat. Its own inverse, so the same
block serves encode (after the quantizer) and decode (after the inverse transform).

Model: host/model/signs.py `sign_bits` / `apply_signs`.

Structure. The key is only known when an op's first beat arrives, and its first sign word
takes a Speck core 23 cycles. Rather than stall the input, the beats wait in a data FIFO:
each beat that starts a 32-element word pushes a request (key, word index) when it enters,
the Speck cores work on it while the beat crosses the FIFO, and the output stage joins the
beat with its word. The FIFO holds about LATENCY beats in steady state, which is what gives
every later word (and the next op's first word) its head start, so the stream runs at one
beat per cycle with no bubbles, across op boundaries too, when every op is a multiple of 32
elements long (every op after the quantizer's padding is, for b >= 32). Other lengths are
exact but may leave a gap after an op's partial last word (a core takes 24 cycles a word).

Lanes: lane k of beat j is element j*lanes + k, so a beat never straddles two words (lanes
divides 32). One core makes a word per 24 cycles and a word lasts 32/lanes beats, so
ceil(24 * lanes / 32) cores (1, 2, 3 for lanes 1, 2, 4) take the words round robin.

Word indexes count up to c / 32: an op must be at most p.c elements. Negation is in `width`
bits: the input range must be symmetric (no -2^(width-1)), as everywhere in the datapath.
"""

from __future__ import annotations

import math

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.host.model.signs import apply_signs
from optireduce.hw.speck import Speck3264
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams

WORD = 32  # signs per Speck block


class SignFlip(wiring.Component):
    """SignFlip(p, width): i element_stream(width, p.lanes) -> o, same shape.

    Ports: seed and op_id (32 bits each), sampled with the `first` beat.
    """

    # first beat in -> request FIFO (1) -> Speck core (23) -> output register (1)
    LATENCY = Speck3264.LATENCY + 2
    MODEL = apply_signs  # its sign_bits

    def __init__(self, p: NicParams, width: int) -> None:
        self.n_cores = Speck3264.cores_for(p.lanes, WORD)
        self.p, self.width = p, width
        self.beats_per_word = WORD // p.lanes
        # The FIFO must hold the beats that arrive while the first word is computed.
        self.fifo_depth = 1 << math.ceil(math.log2(self.LATENCY + 4))
        super().__init__(
            {
                "i": In(element_stream(width, p.lanes)),
                "o": Out(element_stream(width, p.lanes)),
                "seed": In(32),
                "op_id": In(32),
            }
        )

    def elaborate(self, platform):
        m = Module()
        p, lanes, width = self.p, self.p.lanes, self.width
        bpw = self.beats_per_word
        off_bits = (bpw - 1).bit_length()
        max_beats = max(2, p.c // lanes)
        ctr_bits = max(1, (max_beats - 1).bit_length() - off_bits)

        beat_layout = data.StructLayout(
            {
                "data": data.ArrayLayout(width, lanes),
                "first": 1,
                "last": 1,
                "new_word": 1,  # this beat takes the next word from the cores
                "off": max(1, off_bits),  # beat index inside its word
            }
        )
        req_layout = data.StructLayout({"key": 64, "ctr": ctr_bits})

        m.submodules.beats = beats = SyncFIFOBuffered(width=beat_layout.size, depth=self.fifo_depth)
        m.submodules.reqs = reqs = SyncFIFO(width=req_layout.size, depth=4)
        cores = [Speck3264() for _ in range(self.n_cores)]
        for n, core in enumerate(cores):
            m.submodules[f"speck{n}"] = core

        # Input: number the beats of the op, request a word at each word start.
        beat = Signal(range(max_beats))
        key_held = Signal(64)
        cur = Signal(range(max_beats))
        first = self.i.payload.first
        m.d.comb += cur.eq(Mux(first, 0, beat))
        key = Mux(first, Cat(self.seed, self.op_id), key_held)
        off = cur[:off_bits] if off_bits else 0
        new_word = (off == 0) if off_bits else 1
        take = Signal()
        m.d.comb += [
            self.i.ready.eq(beats.w_rdy & reqs.w_rdy),
            take.eq(self.i.valid & self.i.ready),
        ]
        w_beat = beat_layout(beats.w_data)
        w_req = req_layout(reqs.w_data)
        m.d.comb += [
            w_beat.data.eq(self.i.payload.data),
            w_beat.first.eq(first),
            w_beat.last.eq(self.i.payload.last),
            w_beat.new_word.eq(new_word),
            w_beat.off.eq(off),
            beats.w_en.eq(take),
            w_req.key.eq(key),
            w_req.ctr.eq(cur[off_bits:]),
            reqs.w_en.eq(take & new_word),
        ]
        with m.If(take):
            m.d.sync += beat.eq(cur + 1)
            with m.If(first):
                m.d.sync += key_held.eq(Cat(self.seed, self.op_id))

        # Requests go to the cores round robin, and words come back in the same order.
        r_req = req_layout(reqs.r_data)
        issue = Signal(range(self.n_cores))
        collect = Signal(range(self.n_cores))
        for n, core in enumerate(cores):
            m.d.comb += [
                core.req.payload.key.eq(r_req.key),
                core.req.payload.pt.eq(r_req.ctr),
                core.req.valid.eq(reqs.r_rdy & (issue == n)),
            ]
            with m.If(issue == n):
                m.d.comb += reqs.r_en.eq(core.req.ready)
        with m.If(reqs.r_rdy & reqs.r_en):
            m.d.sync += issue.eq(Mux(issue == self.n_cores - 1, 0, issue + 1))

        word_valid = Signal()
        word = Signal(WORD)
        for n, core in enumerate(cores):
            with m.If(collect == n):
                m.d.comb += [word_valid.eq(core.ct.valid), word.eq(core.ct.payload)]

        # Output: join the head beat with its word.
        head = beat_layout(beats.r_data)
        word_held = Signal(WORD)
        en = self.o.ready | ~self.o.valid
        go = Signal()
        m.d.comb += go.eq(en & beats.r_rdy & (~head.new_word | word_valid))
        m.d.comb += beats.r_en.eq(go)
        use = Mux(head.new_word, word, word_held)
        signs = Signal(lanes)
        m.d.comb += signs.eq(use >> (head.off * lanes if off_bits else 0))
        pop_word = go & head.new_word
        for n, core in enumerate(cores):
            m.d.comb += core.ct.ready.eq(pop_word & (collect == n))
        with m.If(pop_word):
            m.d.sync += [
                word_held.eq(word),
                collect.eq(Mux(collect == self.n_cores - 1, 0, collect + 1)),
            ]
        with m.If(en):
            m.d.sync += self.o.valid.eq(go)
        with m.If(go):
            m.d.sync += [
                self.o.payload.first.eq(head.first),
                self.o.payload.last.eq(head.last),
            ]
            for k in range(lanes):
                d = head.data[k].as_signed()
                m.d.sync += self.o.payload.data[k].eq(Mux(signs[k], -d, d))
        return m
