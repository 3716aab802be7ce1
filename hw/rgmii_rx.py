"""Gigabit MAC receive path at the byte level (GMII-like, 125 MHz SDR), and its frame FIFO.

Model: IEEE 802.3 clause 3/4 framing, with `zlib.crc32` as the FCS reference
(`docs/rgmii.md`). Bytes come from the DDR layer (`hw/rgmii_io.py`) as rxd/rx_dv/rx_er,
one per cycle. The receiver finds the SFD, drops the preamble, folds every byte into
the FCS register, and writes the frame into a FrameFifo with a 5-byte delay so the 4
FCS bytes never reach the FIFO and the last data byte can carry `last`. The cycle
rx_dv falls the frame's verdict is registered, and the cycle after it is applied (the
FIFO's commit or rewind; the CRC compare and the FIFO's pointers do not fit one 125 MHz
cycle on the 25F-6). The verdicts, in this order:

  rx_error   rx_er seen inside the frame, or a preamble without SFD
  rx_runt    fewer than `min_frame` (64) bytes including the FCS
  rx_bad_fcs the FCS register is not the CRC-32 residue
  rx_overflow the FIFO ran out of room (the reader is slow or the frame is too long)
  rx_good    the frame is committed: it becomes visible on `o`

A dropped frame is rewound and never appears on `o`. The FIFO holds `fifo_bytes`
data bytes (FCS excluded), so frames up to fifo_bytes + 4 bytes are received when `o`
is drained: 2048 covers 1522-byte frames, 16384 covers 9018-byte jumbo frames.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.crc32 import CRC_INIT, CRC_RESIDUE, crc32_next
from optireduce.hw.registered_ram import RegisteredRam
from optireduce.hw.streams import frame_stream

PREAMBLE = 0x55
SFD = 0xD5
DELAY = 5  # bytes held back: 4 FCS + the last data byte, which gets `last`
COUNTER_WIDTH = 32


class FrameFifo(wiring.Component):
    """Byte FIFO with speculative writes: `commit` publishes everything written so far
    (including this cycle's write), `rewind` forgets the uncommitted bytes (and this
    cycle's write). `o` is a registered stream of committed bytes (1 per cycle).
    `room` says a write this cycle would be kept. It is a register (a cycle ago: level <
    depth - 1, or level < depth and no write), so it may say no with one byte free after
    a write, and for one cycle after a read or rewind frees space: at least depth - 1
    bytes always fit. `level` counts bytes stored."""

    def __init__(self, depth: int) -> None:
        assert depth & (depth - 1) == 0, "depth must be a power of two"
        self.depth = depth
        aw = depth.bit_length()  # one extra bit tells full from empty
        super().__init__(
            {
                "w_data": In(8),
                "w_last": In(1),
                "w_en": In(1),
                "commit": In(1),
                "rewind": In(1),
                "room": Out(1),
                "level": Out(aw),
                "o": Out(frame_stream(1)),
            }
        )

    def elaborate(self, platform):
        m = Module()
        aw = self.depth.bit_length()
        # a read that collides with a write is of an empty FIFO's slot (rp == wp: the
        # byte is not held) or of a full one's (no write then): never used
        m.submodules.mem = mem = RegisteredRam(9, self.depth)
        wp, cp, rp = Signal(aw), Signal(aw), Signal(aw)

        # `room` is a register: a write this cycle always fits (the level rises by at most
        # one a cycle), and the pointers' subtract and compare are not in front of the
        # writer's logic (125 MHz); the last byte is free after a cycle without a write
        room = Signal(init=1)
        level_full = self.level[-1]  # level == depth (it is never more)
        wrote = self.w_en & self.room
        m.d.sync += room.eq((self.level < self.depth - 1) | (~wrote & ~level_full))
        m.d.comb += [
            self.level.eq(wp - rp),
            self.room.eq(room),
            mem.w_addr.eq(wp[: aw - 1]),
            mem.w_data.eq(Cat(self.w_data, self.w_last)),
            mem.w_en.eq(wrote),
        ]
        wp_next = Signal(aw)  # the carry chain from wp alone, the write only picks
        m.d.comb += wp_next.eq(Mux(wrote, wp + 1, wp))
        with m.If(self.rewind):
            m.d.sync += wp.eq(cp)
        with m.Else():
            m.d.sync += wp.eq(wp_next)
            with m.If(self.commit):
                m.d.sync += cp.eq(wp_next)

        # Two stages: the block RAM's read, then its output register, which is `o`'s
        # payload (hw/registered_ram.py: on the ECP5 the block's own register, since a
        # DP16KD's clock-to-out without it is 5.8 ns of the 8 on the 25F-6); valid never
        # looks at ready combinationally.
        held = Signal()  # the RAM's read register holds a committed byte not yet in `o`
        out_en = ~self.o.valid | self.o.ready
        ram_en = ~held | out_en
        m.d.comb += [
            mem.r_addr.eq(rp[: aw - 1]),
            mem.r_en.eq(ram_en),
            mem.o_en.eq(out_en),
            self.o.payload.keep.eq(1),
            self.o.payload.data[0].eq(mem.r_data[:8]),
            self.o.payload.last.eq(mem.r_data[8]),
        ]
        with m.If(ram_en):
            m.d.sync += held.eq(rp != cp)
            with m.If(rp != cp):
                m.d.sync += rp.eq(rp + 1)
        with m.If(out_en):
            m.d.sync += self.o.valid.eq(held)
        return m


class RgmiiRx(wiring.Component):
    """Receive MAC: rxd/rx_dv/rx_er (one byte per cycle) in, good frames without FCS on `o`.

    LATENCY: the frame leaves 5 cycles after the cycle rx_dv falls (store and forward).
    A frame may start the cycle after its predecessor's rx_dv fell.
    """

    LATENCY = 5  # from rx_dv low to the first byte on `o`

    def __init__(self, fifo_bytes: int = 2048, min_frame: int = 64) -> None:
        self.fifo_bytes, self.min_frame = fifo_bytes, min_frame
        super().__init__(
            {
                "rxd": In(8),
                "rx_dv": In(1),
                "rx_er": In(1),
                "o": Out(frame_stream(1)),
                "rx_good": Out(COUNTER_WIDTH),
                "rx_bad_fcs": Out(COUNTER_WIDTH),
                "rx_runt": Out(COUNTER_WIDTH),
                "rx_error": Out(COUNTER_WIDTH),
                "rx_overflow": Out(COUNTER_WIDTH),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = FrameFifo(self.fifo_bytes)
        wiring.connect(m, wiring.flipped(self.o), fifo.o)

        crc = Signal(32, init=CRC_INIT)
        cnt_max = max(self.min_frame, DELAY)
        cnt = Signal(range(cnt_max + 1))  # bytes incl. FCS, saturating: only < min_frame matters
        sr = [Signal(8, name=f"sr{k}") for k in range(DELAY)]  # sr[0] newest
        err, ovf = Signal(), Signal()
        full = Signal()  # in DATA, cnt >= DELAY (a register): sr's oldest byte is a data byte

        def bump(counter):
            m.d.sync += counter.eq(counter + 1)

        # the verdict, registered the cycle rx_dv falls and applied the cycle after
        v_err, v_runt, v_fcs, v_good = Signal(), Signal(), Signal(), Signal()
        judging = Signal()  # the cycle after rx_dv fell
        m.d.sync += [judging.eq(0), v_good.eq(0)]
        # the FIFO's controls from flags, not from a decode of the FSM's state: the write
        # enable and the pointers it moves are two LUTs deep (125 MHz on the 25F-6).
        # `full` is low outside DATA, `v_good` high in the judging cycle only.
        keep = v_good & fifo.room
        m.d.comb += [
            fifo.w_data.eq(sr[DELAY - 1]),
            fifo.w_last.eq(judging),
            fifo.w_en.eq((self.rx_dv & full) | v_good),
            fifo.commit.eq(keep),
            fifo.rewind.eq(judging & ~keep),
        ]

        def start() -> None:
            """IDLE's work, also done while a verdict is applied: a frame may start then."""
            with m.If(self.rx_dv):
                m.d.sync += err.eq(self.rx_er)
                with m.If(self.rxd == SFD):
                    m.next = "DATA"
                with m.Elif(self.rxd == PREAMBLE):
                    m.next = "PRE"
                with m.Else():
                    m.next = "BAD"
            with m.Else():
                m.next = "IDLE"
            m.d.sync += [crc.eq(CRC_INIT), cnt.eq(0), ovf.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                start()
            with m.State("PRE"):
                m.d.sync += err.eq(err | self.rx_er)
                with m.If(~self.rx_dv):
                    bump(self.rx_error)  # carrier without an SFD
                    m.next = "IDLE"
                with m.Elif(self.rxd == SFD):
                    m.next = "DATA"
                with m.Elif(self.rxd != PREAMBLE):
                    m.next = "BAD"
            with m.State("BAD"), m.If(~self.rx_dv):
                bump(self.rx_error)
                m.next = "IDLE"
            with m.State("DATA"):
                with m.If(self.rx_dv):
                    m.d.sync += [
                        crc.eq(crc32_next(crc, self.rxd)),
                        err.eq(err | self.rx_er),
                        sr[0].eq(self.rxd),
                        *[sr[k].eq(sr[k - 1]) for k in range(1, DELAY)],
                    ]
                    with m.If(cnt < cnt_max):
                        m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == DELAY - 1):
                        m.d.sync += full.eq(1)
                    with m.If(full & ~fifo.room):
                        m.d.sync += ovf.eq(1)
                with m.Else():
                    runt, fcs = cnt < self.min_frame, crc != CRC_RESIDUE
                    m.d.sync += [
                        v_err.eq(err),
                        v_runt.eq(runt),
                        v_fcs.eq(fcs),
                        v_good.eq(~err & ~runt & ~fcs & ~ovf),
                        judging.eq(1),
                        full.eq(0),
                    ]
                    m.next = "JUDGE"
            with m.State("JUDGE"):
                with m.If(v_err):
                    bump(self.rx_error)
                with m.Elif(v_runt):
                    bump(self.rx_runt)
                with m.Elif(v_fcs):
                    bump(self.rx_bad_fcs)
                with m.Elif(~keep):
                    bump(self.rx_overflow)
                with m.Else():
                    bump(self.rx_good)
                start()
        return m
