"""Chain figure: floats in -> encoder (quantize, signs, FWHT, saturate) -> packetizer -> frames.

Measured at the default NicParams on one whole chunk C in amaranth.sim with no
backpressure: input elements per cycle over the chunk (cycles_per_element) and the
cycles from the first float to the first frame byte (latency_cycles).
"""

from __future__ import annotations

import numpy as np
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce import ubt
from optireduce.host.model.quantize import propose_exponent
from optireduce.hw.encoder import Encoder
from optireduce.hw.packetizer import Packetizer
from optireduce.hw.streams import float_stream, frame_stream
from optireduce.params import NicParams
from optireduce.sim.stream_sim import run_stream

WORLD, RANK = 4, 1


class EncodePacketize(wiring.Component):
    """Encoder into packetizer, with a fixed op context (one op per run)."""

    def __init__(self, p: NicParams, op_len: int, exponent: int) -> None:
        self.p, self.op_len, self.exponent_value = p, op_len, exponent
        self.enc, self.pkt = Encoder(p), Packetizer(p)
        super().__init__({"i": In(float_stream(p.lanes)), "o": Out(frame_stream(8 * p.lanes))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.enc, m.submodules.pkt = self.enc, self.pkt
        wiring.connect(m, wiring.flipped(self.i), self.enc.i)
        wiring.connect(m, self.enc.o, self.pkt.i)
        wiring.connect(m, self.pkt.o, wiring.flipped(self.o))
        p, pkt = self.p, self.pkt
        # the op's sign key, given once (op 0; its words: the op padded to whole blocks)
        keyed = Signal()
        with m.If(self.enc.key.ready):
            m.d.sync += keyed.eq(1)
        blocks = max(1, -(-self.op_len // p.b))
        m.d.comb += [
            self.enc.key.valid.eq(~keyed), self.enc.key.payload.op_id.eq(0),
            self.enc.key.payload.words.eq(-(-blocks * p.b // 32)),
        ]  # fmt: skip
        m.d.comb += [
            self.enc.exponent.eq(self.exponent_value), self.enc.seed.eq(p.seed),
            pkt.msg_type.eq(ubt.MSG_SCATTER), pkt.rank.eq(RANK),
            pkt.world.eq(WORLD), pkt.job_id.eq(p.job_id), pkt.op_id.eq(0),
            pkt.exponent.eq(self.exponent_value), pkt.op_len.eq(self.op_len),
            pkt.t_c_us.eq(1000), pkt.own.ready.eq(1),
        ]  # fmt: skip
        return m


def figures(p: NicParams | None = None) -> dict:
    p = p or NicParams()
    n = p.c
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    bits = x.view(np.uint32)
    dut = EncodePacketize(p, n, propose_exponent(x, p))
    payloads = [
        {"data": [int(v) for v in bits[k : k + p.lanes]], "first": int(k == 0),
         "last": int(k + p.lanes >= n)}
        for k in range(0, n, p.lanes)
    ]  # fmt: skip
    frames = sum(1 for i in range(p.packets_for(n)) if i % WORLD != RANK)
    beats = frames * dut.pkt.frame_beats
    run = run_stream(dut, payloads, beats, read=lambda pl: 0, max_cycles=8 * n + 100_000)
    return {
        "cycles_per_element": (run.in_cycles[-1] - run.in_cycles[0] + 1) / n,
        "latency_cycles": run.latency,
        "elements_per_cycle_end_to_end": n / (run.out_cycles[-1] - run.in_cycles[0] + 1),
    }
