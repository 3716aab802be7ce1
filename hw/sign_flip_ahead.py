"""Random signs of an op whose key comes ahead of its data: SignFlip's signs, with the
sign words made before the beats arrive instead of while they wait.

Model: host/model/signs.py `sign_bits` / `apply_signs` (as SignFlip: element i is
negated when bit (i mod 32) of Speck32/64_K(i div 32) is set, K = (op_id, seed)).

SignFlip learns an op's key from its first beat, so its beats wait in a FIFO of about
Speck3264.LATENCY beats while the first word is made (on the 25F's decoder, 22 LUT RAM
cells and a 64-bit key select). The decoder knows each op's key and length when its
DRAIN is taken, a block's inverse transform (a thousand cycles and more) before the
op's first beat comes out of the divider. Here the ops' keys come on `key` (op id and
words, in the ops' order): the cores make each op's words in order into a small FIFO,
as far ahead as it has room, and a beat only joins its word on the way through (one
register). A beat whose word is not made yet waits (exact either way; the lead only
keeps the stream at a beat a cycle). Lanes as in SignFlip (lanes divides 32, cores
round robin).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.host.model.signs import apply_signs
from optireduce.hw.carry_select import negate_if
from optireduce.hw.speck import Speck3264
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams

WORD = 32  # signs per Speck block


def key_layout(p: NicParams) -> data.StructLayout:
    """One op's key on `key`: its op id and the number of 32-element words it has."""
    return data.StructLayout({"op_id": 32, "words": range(-(-p.c // WORD) + 1)})


def sign_words(m: Module, p: NicParams, n: Value) -> Signal:
    """The sign words of an op of n elements once padded to whole blocks (at least one),
    as the encoder's quantizer pads it and the decoder's divider gives it."""
    words = Signal(key_layout(p)["words"].shape, name="sign_words")
    blocks = Mux(n > p.b, (n + p.b - 1) >> p.log2_b, 1)
    m.d.comb += words.eq(((blocks << p.log2_b) + WORD - 1) >> 5)
    return words


class SignFlipAhead(wiring.Component):
    """SignFlipAhead(p, width): `key` (one per op, in order), `i` element_stream(width,
    p.lanes) -> `o`, same shape; `seed` (32 bits, the job's: static while ops run)."""

    MODEL = apply_signs
    LATENCY = 1  # a beat in to its beat out, its word made (the output register)

    def __init__(self, p: NicParams, width: int) -> None:
        self.n_cores = Speck3264.cores_for(p.lanes, WORD)
        self.p, self.width = p, width
        self.beats_per_word = WORD // p.lanes
        # words made ahead (the FIFO's depth): twice the cores', a power of two
        self.ahead = 1 << (2 * self.n_cores - 1).bit_length()
        super().__init__(
            {
                "key": In(stream.Signature(key_layout(p))),
                "seed": In(32),
                "i": In(element_stream(width, p.lanes)),
                "o": Out(element_stream(width, p.lanes)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        words = SyncFIFOBuffered(width=WORD, depth=self.ahead)
        m.submodules.words = words
        cores = [Speck3264() for _ in range(self.n_cores)]
        for n, core in enumerate(cores):
            m.submodules[f"speck{n}"] = core
        self._make_words(m, cores, words)
        self._join(m, words, platform)
        return m

    def _make_words(self, m: Module, cores: list, words) -> None:
        """The head op's words 0..words-1 to the cores round robin, while the FIFO has
        room for every word asked for; the words back in the same order."""
        n_cores, key = self.n_cores, self.key.payload
        ctr = Signal.like(key.words, name="ctr")  # the head op's next word
        asked = Signal(range(self.ahead + 1), name="asked")  # asked for, not in the FIFO
        issue = Signal(range(n_cores), name="issue")
        collect = Signal(range(n_cores), name="collect")
        room = Signal(name="room")
        m.d.comb += room.eq(words.level + asked < self.ahead)
        ask = Signal(name="ask")
        for n, core in enumerate(cores):
            m.d.comb += [
                core.req.payload.key.eq(Cat(self.seed, key.op_id)),
                core.req.payload.pt.eq(ctr),
                core.req.valid.eq(self.key.valid & (key.words != 0) & room & (issue == n)),
            ]
            with m.If(issue == n):
                m.d.comb += ask.eq(core.req.valid & core.req.ready)
        last_word = ctr == key.words - 1
        m.d.comb += self.key.ready.eq((ask & last_word) | (self.key.valid & (key.words == 0)))
        with m.If(ask):
            m.d.sync += [
                ctr.eq(Mux(last_word, 0, ctr + 1)),
                issue.eq(Mux(issue == n_cores - 1, 0, issue + 1)),
            ]
        push = Signal(name="push")
        for n, core in enumerate(cores):
            with m.If(collect == n):
                m.d.comb += [
                    push.eq(core.ct.valid & words.w_rdy),
                    words.w_data.eq(core.ct.payload),
                    core.ct.ready.eq(words.w_rdy),
                ]
        m.d.comb += words.w_en.eq(push)
        with m.If(push):
            m.d.sync += collect.eq(Mux(collect == n_cores - 1, 0, collect + 1))
        m.d.sync += asked.eq(asked + ask - push)

    def _join(self, m: Module, words, platform) -> None:
        """Each beat with its word's signs, through one register; a word leaves the FIFO
        with its last beat (or the op's)."""
        lanes, width = self.p.lanes, self.width
        bpw = self.beats_per_word
        off_bits = (bpw - 1).bit_length()
        off = Signal(max(1, off_bits), name="off")  # the beat's index in its word
        cur = Mux(self.i.payload.first, 0, off) if off_bits else 0
        en = self.o.ready | ~self.o.valid
        go = Signal(name="go")
        m.d.comb += [
            go.eq(en & self.i.valid & words.r_rdy),
            self.i.ready.eq(en & words.r_rdy),
        ]
        word_end = self.i.payload.last | (cur == bpw - 1 if off_bits else 1)
        m.d.comb += words.r_en.eq(go & word_end)
        if off_bits:
            with m.If(go):
                m.d.sync += off.eq(Mux(word_end, 0, cur + 1))
        signs = Signal(lanes, name="signs")
        m.d.comb += signs.eq(words.r_data >> (cur * lanes) if off_bits else words.r_data)
        with m.If(en):
            m.d.sync += self.o.valid.eq(go)
        with m.If(go):
            m.d.sync += [
                self.o.payload.first.eq(self.i.payload.first),
                self.o.payload.last.eq(self.i.payload.last),
            ]
            for k in range(lanes):
                d = negate_if(m, self.i.payload.data[k].as_signed(), signs[k], width,
                              platform=platform, name=f"flip{k}")  # fmt: skip
                m.d.sync += self.o.payload.data[k].eq(d)
