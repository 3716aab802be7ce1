"""The TX encode chain: quantize -> random signs -> FWHT -> saturate to the wire width.

Model: host/model/codec.py `encode`. Blocks are joined with wiring.connect in the order
the data flows; the op's exponent is latched by the quantizer on the op's `first` beat,
and its sign key comes ahead on `key` (op id and sign words, one per op, in order: the
core gives it when it takes the op's START, so the op's first sign word is made before
its data come; hw/sign_flip_ahead.py); `seed` is the job's. With p.rht off the chain
is quantize -> saturate (`key` is taken and unused). With p.fwht_shared the FWHT
is the core's SharedFwht: the signs leave on `to_fwht` and the transform comes back on
`from_fwht` (LATENCY then counts this block's own stages only).
"""

from __future__ import annotations

from amaranth import Module, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.codec import encode
from optireduce.hw.fwht import Fwht, external_fwht_ports, through_external_fwht
from optireduce.hw.quantizer import Quantizer
from optireduce.hw.saturate import Saturate
from optireduce.hw.sign_flip_ahead import SignFlipAhead, key_layout
from optireduce.hw.streams import element_stream, float_stream
from optireduce.params import NicParams


class Encoder(wiring.Component):
    MODEL = encode

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.quantizer = Quantizer(p)
        self.stages: list[wiring.Component] = [self.quantizer]
        self.external = p.rht and p.fwht_shared  # the FWHT is outside (SharedFwht)
        fwht_ports = {}
        if p.rht:
            self.signs = SignFlipAhead(p, p.w_in)
            self.saturate = Saturate(p, p.w_fwd, p.w_wire)
            if self.external:
                self.stages += [self.signs]
                fwht_ports = external_fwht_ports(p, p.w_in)
            else:
                self.fwht = Fwht(p, p.w_in)
                self.stages += [self.signs, self.fwht]
            self.stages += [self.saturate]
        # Without the transform nothing grows: w_in bits are sign-extended to the wire.
        self.LATENCY = sum(s.LATENCY for s in self.stages)
        super().__init__(
            {
                **fwht_ports,
                "i": In(float_stream(p.lanes)),
                "o": Out(element_stream(p.w_wire, p.lanes)),
                "exponent": In(signed(8)),
                "seed": In(32),  # the job's sign key seed (static while ops run)
                "key": In(stream.Signature(key_layout(p))),
                "clear": In(1),
                "sat_quantize": Out(p.op_count_bits),
                "nonfinite": Out(p.op_count_bits),
                "sat_transform": Out(p.op_count_bits),
            }
        )

    def elaborate(self, platform):
        m = Module()
        for k, stage in enumerate(self.stages):
            m.submodules[f"stage{k}_{type(stage).__name__.lower()}"] = stage
        wiring.connect(m, wiring.flipped(self.i), self.quantizer.i)
        for a, b in zip(self.stages, self.stages[1:], strict=False):
            if self.external and a is self.signs:  # through the shared FWHT
                through_external_fwht(m, self, a.o, b.i)
            else:
                wiring.connect(m, a.o, b.i)
        last = self.stages[-1]
        if self.p.rht:
            wiring.connect(m, last.o, wiring.flipped(self.o))
            m.d.comb += self.sat_transform.eq(self.saturate.count)
        else:
            m.d.comb += [
                self.o.valid.eq(last.o.valid),
                last.o.ready.eq(self.o.ready),
                self.o.payload.first.eq(last.o.payload.first),
                self.o.payload.last.eq(last.o.payload.last),
            ]
            for k in range(self.p.lanes):
                m.d.comb += self.o.payload.data[k].eq(last.o.payload.data[k])
        q = self.quantizer
        m.d.comb += [
            q.exponent.eq(self.exponent),
            q.clear.eq(self.clear),
            self.sat_quantize.eq(q.saturated),
            self.nonfinite.eq(q.nonfinite),
        ]
        if self.p.rht:
            wiring.connect(m, wiring.flipped(self.key), self.signs.key)
            m.d.comb += self.signs.seed.eq(self.seed)
        else:
            m.d.comb += self.key.ready.eq(1)
        return m
