"""Figures of the RGMII MAC (hw/rgmii_mac.py): TX pins looped back to RX pins, in amaranth.sim.

cycles_per_element: cycles per payload byte in the steady state with back-to-back 1514-byte
frames (the wire adds 8 preamble/SFD + 4 FCS + 12 IFG bytes per frame, so the best possible
is 1538/1514 = 1.016; the wire itself carries 1.0 byte per 125 MHz cycle = 1 Gb/s).
latency_cycles: first input byte -> first output byte of one 64-byte frame (store and
forward on both sides: TX waits for the whole frame, RX for the FCS).
"""

from __future__ import annotations

import random

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.rgmii_mac import RgmiiMac
from optireduce.hw.streams import frame_stream
from optireduce.sim.stream_sim import run_stream

WIRE_OVERHEAD = 8 + 4 + 12  # preamble + SFD, FCS, inter-frame gap


class MacLoopback(wiring.Component):
    """The MAC with rgmii_txd/tx_ctl wired to rgmii_rxd/rx_ctl (a loopback PHY)."""

    def __init__(self, fifo_bytes: int = 2048) -> None:
        self.fifo_bytes = fifo_bytes
        super().__init__({"i": In(frame_stream(1)), "o": Out(frame_stream(1))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = RgmiiMac(fifo_bytes=self.fifo_bytes)
        wiring.connect(m, wiring.flipped(self.i), mac.i)
        wiring.connect(m, wiring.flipped(self.o), mac.o)
        m.d.comb += [mac.rgmii_rxd.eq(mac.rgmii_txd), mac.rgmii_rx_ctl.eq(mac.rgmii_tx_ctl)]
        return m


def _read(payload) -> tuple[int, int]:
    return int(payload.data[0]), int(payload.last)


def _frames(sizes: list[int]) -> list[dict]:
    rng = random.Random(0)
    return [
        {"data": [rng.getrandbits(8)], "keep": 1, "last": int(k == n - 1)}
        for n in sizes
        for k in range(n)
    ]


def figures(n_frames: int = 6, size: int = 1514) -> dict:
    run = run_stream(MacLoopback(), _frames([size] * n_frames), size * n_frames, read=_read)
    one = run_stream(MacLoopback(), _frames([64]), 64, read=_read)
    # Steady state: from the first byte of frame 2 to the first byte of the last frame.
    starts = [run.out_cycles[k * size] for k in range(n_frames)]
    per_frame = (starts[-1] - starts[1]) / (n_frames - 2)
    return {
        "cycles_per_element": per_frame / size,
        "wire_bytes_per_cycle": (size + WIRE_OVERHEAD) / per_frame,
        "line_rate_gbps_at_125mhz": 8 * 0.125 * size / per_frame,
        "latency_cycles": one.latency,
        "latency_cycles_1514": run.latency,
        "lanes": 1,
    }


def area_component() -> tuple[wiring.Component, str]:
    return RgmiiMac(fifo_bytes=2048), "rgmii_mac"


if __name__ == "__main__":
    print(figures())
