"""Gigabit MAC transmit path at the byte level (GMII-like, 125 MHz SDR).

Model: IEEE 802.3 framing; the reference in the tests is scapy's Ether()/Raw bytes,
zero-padded to 60, followed by `zlib.crc32` little-endian (`docs/rgmii.md`).

Frames from `i` (frame_stream(1), one byte per beat, `last`) go into a FrameFifo, so
idle cycles inside an input frame never reach the wire. A frame starts once it is
whole in the FIFO (or the FIFO has no room: a frame longer than the FIFO is sent cut-through
and an input gap then shows as TX_ER, which any receiver drops) and once the
inter-frame gap has passed. On the wire: 7 x 0x55, 0xD5, the bytes, zeros up to
`min_payload` (60), the FCS (LSB first), then `ifg` (12) idle cycles at least.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.crc32 import CRC_INIT, crc32_next
from optireduce.hw.rgmii_rx import COUNTER_WIDTH, PREAMBLE, SFD, FrameFifo
from optireduce.hw.skid import Skid
from optireduce.hw.streams import frame_layout, frame_stream

PREAMBLE_LEN = 7


class RgmiiTx(wiring.Component):
    """Transmit MAC: `i` in, txd/tx_en/tx_er (registered, one byte per cycle) out.

    LATENCY: with an idle wire the first preamble byte leaves 3 cycles after the frame's
    last input beat is taken (store and forward); the first data byte 8 cycles later.
    """

    LATENCY = 3  # from the last input beat of a frame to the first preamble byte on txd

    def __init__(self, fifo_bytes: int = 2048, ifg: int = 12, min_payload: int = 60) -> None:
        self.fifo_bytes, self.ifg, self.min_payload = fifo_bytes, ifg, min_payload
        super().__init__(
            {
                "i": In(frame_stream(1)),
                "txd": Out(8),
                "tx_en": Out(1),
                "tx_er": Out(1),
                "tx_frames": Out(COUNTER_WIDTH),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = FrameFifo(self.fifo_bytes)
        # the FIFO's block RAM output reaches the FSM through a registered skid (125 MHz);
        # the preamble's 8 cycles hide its cycle
        m.submodules.q = q = Skid(frame_layout(1), registered=True)
        wiring.connect(m, fifo.o, q.i)
        take = self.i.valid & self.i.ready
        m.d.comb += [
            self.i.ready.eq(fifo.room),
            fifo.w_data.eq(self.i.payload.data[0]),
            fifo.w_last.eq(self.i.payload.last),
            fifo.w_en.eq(self.i.valid),
            fifo.commit.eq(1),  # bytes are visible at once; `frames` says when to start
        ]
        # Whole frames in the FIFO: +1 when a last beat goes in, -1 when one goes out. The
        # outgoing strobe is registered first (125 MHz);
        # the count is read in IDLE, which a frame's FCS and gap keep >= 16 cycles away.
        frames = Signal(range(self.fifo_bytes + 1))
        frame_in = take & self.i.payload.last
        frame_out = Signal()
        m.d.sync += [
            frame_out.eq(q.o.valid & q.o.ready & q.o.payload.last),
            frames.eq(frames + frame_in - frame_out),
        ]

        txd, tx_en, tx_er = self.txd, self.tx_en, self.tx_er
        m.d.sync += [tx_en.eq(0), tx_er.eq(0), txd.eq(0)]  # overridden below while sending

        # The FCS runs one byte behind the wire: each cycle folds in the byte sent the cycle
        # before (txd, when `upd`), so the CRC logic starts at a register, not the FIFO's
        # block RAM output (125 MHz).
        crc = Signal(32, init=CRC_INIT)
        upd = Signal()
        crc_now = Signal(32)  # crc with the byte on txd folded in
        m.d.comb += crc_now.eq(crc32_next(crc, txd))
        m.d.sync += upd.eq(0)  # set by send() below
        with m.If(upd):
            m.d.sync += crc.eq(crc_now)
        cnt = Signal(range(self.min_payload + 1))  # bytes sent, saturating at min_payload
        k = Signal(range(max(PREAMBLE_LEN + 1, 4)))
        gap = Signal(range(max(self.ifg, 1)))
        fcs = Signal(32)

        def send(byte, crc_update: bool = True):
            m.d.sync += [txd.eq(byte), tx_en.eq(1)]
            if crc_update:
                m.d.sync += upd.eq(1)
                with m.If(cnt < self.min_payload):
                    m.d.sync += cnt.eq(cnt + 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(gap != 0):
                    m.d.sync += gap.eq(gap - 1)
                with m.Elif((frames != 0) | ~fifo.room):
                    m.next = "PRE"
                m.d.sync += [k.eq(0), crc.eq(CRC_INIT), cnt.eq(0)]
            with m.State("PRE"):
                with m.If(k == PREAMBLE_LEN):
                    send(SFD, crc_update=False)
                    m.next = "DATA"
                with m.Else():
                    send(PREAMBLE, crc_update=False)
                    m.d.sync += k.eq(k + 1)
            with m.State("DATA"):
                m.d.comb += q.o.ready.eq(1)
                with m.If(q.o.valid):
                    send(q.o.payload.data[0])
                    with m.If(q.o.payload.last):
                        m.next = "FCS"
                        with m.If(cnt < self.min_payload - 1):
                            m.next = "PAD"
                with m.Else():
                    # Underrun of a cut-through frame: poison it rather than stop mid-frame.
                    m.d.sync += [tx_en.eq(1), tx_er.eq(1)]
            with m.State("PAD"):
                send(0)
                with m.If(cnt == self.min_payload - 1):
                    m.next = "FCS"
            with m.State("FCS"):
                # crc_now: the CRC with the last data or pad byte (on txd now) folded in.
                with m.If(k == PREAMBLE_LEN):  # first FCS cycle (k still at its PRE value)
                    m.d.sync += [txd.eq(~crc_now[:8]), tx_en.eq(1), fcs.eq(~crc_now >> 8),
                                 k.eq(1)]  # fmt: skip
                with m.Else():
                    m.d.sync += [txd.eq(fcs[:8]), tx_en.eq(1), fcs.eq(fcs >> 8), k.eq(k + 1)]
                    with m.If(k == 3):
                        m.d.sync += [
                            gap.eq(max(self.ifg - 1, 0)),
                            self.tx_frames.eq(self.tx_frames + 1),
                        ]
                        m.next = "IDLE"
        return m
