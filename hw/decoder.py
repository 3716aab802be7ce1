"""The RX decode chain: gather buffer -> inverse FWHT -> block divider -> signs -> float32.

Model: host/model/codec.py `decode` (on the gather buffer's z and have). The DRAIN command
of the gather buffer starts an op's decode; its context (op id, exponent, length) rides
in small FIFOs to the stages that need it, each of which takes its entry with the op's
first beat, so several ops can be in the pipeline at once. The sign key's seed is the
job's (`seed`, configuration: static while ops run).
The last stage trims the padding: an op of n elements leaves as exactly n floats,
`last` on the n-th (n must be a multiple of p.lanes). With p.fwht_shared the inverse
FWHT is the core's SharedFwht: the gather buffer's blocks leave on `to_fwht`, the
transform comes back on `from_fwht`. A decoder given a gather buffer with a memory port
(SdramGatherBuffer) has that port as `gather_mem` and its `fault` as `gather_fault`.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.host.model.codec import decode
from optireduce.hw.block_divider import BlockDivider
from optireduce.hw.dequantizer import Dequantizer
from optireduce.hw.forward_ports import forward_ports
from optireduce.hw.fwht import Fwht, external_fwht_ports, fwht_latency, through_external_fwht
from optireduce.hw.gather_buffer import (
    GatherBuffer,
    GatherOp,
    command_layout,
    histogram_ports,
    placement_ports,
)
from optireduce.hw.sign_flip_ahead import SignFlipAhead, sign_words
from optireduce.hw.streams import element_stream, float_stream
from optireduce.params import NicParams

CTX_DEPTH = 4  # ops whose decode may be in flight between the DRAIN and the output


def decode_command_layout(p: NicParams, slots: int | None = None) -> data.StructLayout:
    """A gather-buffer command plus the op context the decode needs."""
    return data.StructLayout(
        {"gather": command_layout(p, slots), "op_id": 32, "exponent": signed(8)}
    )


class Decoder(wiring.Component):
    MODEL = decode

    def __init__(
        self, p: NicParams, slots: int | None = None, gather: GatherBuffer | None = None
    ) -> None:
        """`slots`: ops the gather buffer holds (default p.ops_in_flight); `gather`: the
        buffer, if not the on-chip one."""
        self.p = p
        self.gather = GatherBuffer(p, slots) if gather is None else gather
        self.n_slots = self.gather.n_slots
        g_members = self.gather.signature.members
        memory = {f"gather_{n}": g_members[n] for n in ("mem", "fault") if n in g_members}
        self.external = p.rht and p.fwht_shared  # the FWHT is outside (SharedFwht)
        fwht_ports = {}
        if self.external:
            fwht_ports = external_fwht_ports(p, p.w_wire)
        elif p.rht:
            self.fwht = Fwht(p, p.w_wire)
        if p.rht:
            self.divider = BlockDivider(p, p.w_inv)
            width = self.divider.width_out
            self.signs = SignFlipAhead(p, width)
        else:
            width = p.w_wire
        self.deq = Dequantizer(p, width)
        super().__init__(
            {
                **fwht_ports,
                "i": In(element_stream(p.w_wire, p.lanes)),
                **placement_ports(p, self.n_slots),
                "cmd": In(stream.Signature(decode_command_layout(p, self.n_slots))),
                "seed": In(32),  # the job's sign key (configuration: static while ops run)
                "o": Out(float_stream(p.lanes)),
                "clear": In(1),
                "sat_output": Out(p.op_count_bits),
                **histogram_ports(p, self.n_slots),  # the gather buffer's
                **memory,
            }
        )

    def elaborate(self, platform):
        m = Module()
        p, g = self.p, self.gather
        m.submodules.gather, m.submodules.deq = g, self.deq
        wiring.connect(m, wiring.flipped(self.i), g.i)
        forward_ports(m, self, g, placement_ports(p, self.n_slots))
        m.d.comb += [self.deq.clear.eq(self.clear), self.sat_output.eq(self.deq.saturated)]
        forward_ports(m, self, g, histogram_ports(p, self.n_slots))
        if "mem" in g.signature.members:
            wiring.connect(m, g.mem, wiring.flipped(self.gather_mem))
            m.d.comb += self.gather_fault.eq(g.fault)

        # One context FIFO per consumer, all written when a DRAIN is taken; each keeps
        # only the fields its consumer reads (a whole command is 100-odd bits).
        cmd = self.cmd
        n_cmd = cmd.payload.gather.n
        given = {"exponent": cmd.payload.exponent, "n": n_cmd,
                 "op_id": cmd.payload.op_id, "words": sign_words(m, p, n_cmd)}  # fmt: skip
        wants = {"deq": ("exponent",), "trim": ("n",), "marks": ("n",)}
        if p.rht:
            wants["signs"] = ("op_id", "words")  # the seed is the job's (`seed`)
        layouts = {
            name: data.StructLayout({f: given[f].shape() for f in fields})
            for name, fields in wants.items()
        }
        fifos = {}
        for name, lay in layouts.items():
            f = SyncFIFOBuffered(width=lay.size, depth=CTX_DEPTH)
            m.submodules[f"ctx_{name}"] = fifos[name] = f
        is_drain = cmd.payload.gather.op == GatherOp.DRAIN
        room = Signal()
        m.d.comb += room.eq(1)
        for f in fifos.values():
            room_next = Signal()
            m.d.comb += room_next.eq(room & f.w_rdy)
            room = room_next
        m.d.comb += [
            g.cmd.payload.eq(cmd.payload.gather),
            g.cmd.valid.eq(cmd.valid & (room | ~is_drain)),
            cmd.ready.eq(g.cmd.ready & (room | ~is_drain)),
        ]
        for name, f in fifos.items():
            m.d.comb += [
                f.w_data.eq(Cat(*(given[field] for field in wants[name]))),
                f.w_en.eq(cmd.valid & cmd.ready & is_drain),
            ]

        def head(name):
            return data.View(layouts[name], fifos[name].r_data)

        def take_on_first(name, port):
            m.d.comb += fifos[name].r_en.eq(port.valid & port.ready & port.payload.first)

        def op_marks(src, dst) -> None:
            """The gather buffer marks blocks (the divider needs them); the signs count
            elements from an op's first beat and the trim ends at its last: turn the
            block marks into op marks."""
            blocks = Signal(range(p.c // p.b + 1))
            n = head("marks").n
            total = Signal(range(p.c // p.b + 1))
            op_first, op_last = Signal(), Signal()
            m.d.comb += [
                total.eq(Mux(n > p.b, (n + p.b - 1) >> p.log2_b, 1)),
                op_first.eq(src.payload.first & (blocks == 0)),
                op_last.eq(src.payload.last & (blocks == total - 1)),
                dst.valid.eq(src.valid),
                src.ready.eq(dst.ready),
                dst.payload.data.eq(src.payload.data),
                dst.payload.first.eq(op_first),
                dst.payload.last.eq(op_last),
                fifos["marks"].r_en.eq(src.valid & src.ready & op_last),
            ]
            with m.If(src.valid & src.ready & src.payload.last):
                m.d.sync += blocks.eq(Mux(op_last, 0, blocks + 1))

        # Data path, in the order the data flows.
        if p.rht:
            dv, sg = self.divider, self.signs
            m.submodules.divider, m.submodules.signs = dv, sg
            if self.external:
                through_external_fwht(m, self, g.o, dv.i)
            else:
                m.submodules.fwht = fw = self.fwht
                wiring.connect(m, g.o, fw.i)
                wiring.connect(m, fw.o, dv.i)
            # k of each block waits for its block to leave the FWHT; full, it holds the
            # gather buffer at a block's start only (the blocks ahead drain by themselves)
            depth = max(4, 2 + fwht_latency(p) // p.b)
            kf = SyncFIFOBuffered(width=len(g.k.payload), depth=depth)
            m.submodules.k_fifo = kf
            m.d.comb += [
                kf.w_data.eq(g.k.payload), kf.w_en.eq(g.k.valid), g.k.ready.eq(kf.w_rdy),
                dv.k.payload.eq(kf.r_data), dv.k.valid.eq(kf.r_rdy), kf.r_en.eq(dv.k.ready),
                dv.plain.eq(p.estimator == "plain"),
            ]  # fmt: skip
            op_marks(dv.o, sg.i)
            wiring.connect(m, sg.o, self.deq.i)
            # the op's key from its DRAIN on: its words are made before its beats come
            ctx, kfifo = head("signs"), fifos["signs"]
            m.d.comb += [
                sg.seed.eq(self.seed),
                sg.key.payload.op_id.eq(ctx.op_id),
                sg.key.payload.words.eq(ctx.words),
                sg.key.valid.eq(kfifo.r_rdy),
                kfifo.r_en.eq(sg.key.ready),
            ]
        else:
            m.d.comb += g.k.ready.eq(1)
            op_marks(g.o, self.deq.i)
        m.d.comb += self.deq.exponent.eq(head("deq").exponent)
        take_on_first("deq", self.deq.i)

        # Trim the padding: pass the op's first n elements, drop the rest.
        d, o = self.deq.o, self.o
        n = head("trim").n
        count = Signal(range(p.c + 1))  # elements of the op already passed or dropped (<= C)
        keep = Signal()
        end = Signal()  # this beat is the op's last padded beat
        m.d.comb += [
            keep.eq(count < n),
            end.eq(d.payload.last),
            o.payload.data.eq(d.payload.data),
            o.payload.first.eq(d.payload.first),
            o.payload.last.eq(count + p.lanes >= n),
            o.valid.eq(d.valid & keep),
            d.ready.eq(o.ready | ~keep),
            fifos["trim"].r_en.eq(d.valid & d.ready & end),
        ]
        with m.If(d.valid & d.ready):
            m.d.sync += count.eq(count + p.lanes)
            with m.If(end):
                m.d.sync += count.eq(0)
        return m
