"""Speck32/64 encryptor: an iterative core, one round per cycle, round keys on the fly.

Model: host/model/signs.py `round_keys` and `speck_encrypt`. The key schedule of Speck is the
round function itself with the round index as key, so the core runs it in step with the
data rounds from the key given with each request: round i uses k_i while the schedule
produces k_(i+1) and l_(i+3). Nothing is stored per key; a new key costs nothing.

A request is accepted in one cycle and the 22 rounds take the next 22; the ciphertext is
held on `ct` until taken, and the next request is accepted in the cycle after that, so a
core encrypts one block every PERIOD = 24 cycles.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.signs import speck_encrypt

ROUNDS = 22

# key = (l2, l1, l0, k0) as the designers print it, l2 in the top 16 bits;
# block = (x, y), x in the top 16 bits (host/model/signs.py: x = ctr >> 16, y = ctr & 0xFFFF).
request_layout = data.StructLayout({"key": 64, "pt": 32})


def _ror(x, r: int):
    return x.rotate_right(r)


def _rol(x, r: int):
    return x.rotate_left(r)


class Speck3264(wiring.Component):
    """Speck3264(): req stream {key: 64, pt: 32} -> ct stream (32 bits), LATENCY cycles."""

    LATENCY = ROUNDS + 1  # request accepted at cycle 0, ciphertext valid at cycle 23
    PERIOD = ROUNDS + 2  # back to back, one block per PERIOD cycles

    @staticmethod
    def cores_for(lanes: int, word: int = 32) -> int:
        """Cores that keep up with `lanes` elements a cycle at `word` signs a block, taking
        the words round robin (a word never straddles a beat: lanes must divide it)."""
        if word % lanes:
            raise ValueError(f"signs need lanes dividing {word}, not {lanes}")
        return -(-(Speck3264.PERIOD * lanes) // word)

    MODEL = speck_encrypt  # with round_keys

    def __init__(self) -> None:
        super().__init__(
            {"req": In(stream.Signature(request_layout)), "ct": Out(stream.Signature(32))}
        )

    def elaborate(self, platform):
        m = Module()
        x, y = Signal(16), Signal(16)
        k, l0, l1, l2 = Signal(16), Signal(16), Signal(16), Signal(16)
        rnd = Signal(range(ROUNDS))
        busy = Signal()  # computing, or holding a ciphertext
        done = Signal()  # holding a ciphertext (a register: it feeds the consumer's join)

        m.d.comb += [
            self.ct.valid.eq(done),
            self.ct.payload.eq(Cat(y, x)),
            self.req.ready.eq(~busy),  # not "or taken now": keeps ct.ready off the load path
        ]

        # Data round with k_i; key schedule round with i as its key.
        x_next = (_ror(x, 7) + y)[:16] ^ k
        y_next = _rol(y, 2) ^ x_next
        l_next = (k + _ror(l0, 7))[:16] ^ rnd
        k_next = _rol(k, 2) ^ l_next

        with m.If(self.req.valid & self.req.ready):
            key, pt = self.req.payload.key, self.req.payload.pt
            m.d.sync += [
                busy.eq(1),
                done.eq(0),
                rnd.eq(0),
                x.eq(pt[16:32]),
                y.eq(pt[0:16]),
                k.eq(key[0:16]),
                l0.eq(key[16:32]),
                l1.eq(key[32:48]),
                l2.eq(key[48:64]),
            ]
        with m.Elif(done & self.ct.ready):
            m.d.sync += [busy.eq(0), done.eq(0)]
        with m.Elif(busy & ~done):
            m.d.sync += [
                x.eq(x_next),
                y.eq(y_next),
                k.eq(k_next),
                l0.eq(l1),
                l1.eq(l2),
                l2.eq(l_next),
                rnd.eq(rnd + 1),
                done.eq(rnd == ROUNDS - 1),
            ]
        return m
