"""cocotb bench of the RGMII MAC (hw/rgmii_mac.py) with cocotbext-eth's RGMII source and sink.

RgmiiSource -> rgmii_rxd/rgmii_rx_ctl -> MAC RX -> m_axis (AxiStreamSink, backpressure), and
s_axis (AxiStreamSource, idle) -> MAC TX -> rgmii_txd/rgmii_tx_ctl -> RgmiiSink. The RGMII
clock is the design clock (125 MHz); the references are zlib.crc32 and plain byte padding.
"""

import logging
import random
import struct
import zlib

import cocotb
from cocotb.triggers import ClockCycles, Combine
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource

from optireduce.sim.axis_tb import AxisTB, pauses
from optireduce.sim.cocotb_run import bench_config


def _counter(dut, name: str) -> int:
    return int(getattr(dut, name).value)


@cocotb.test()
async def rgmii_rx_and_tx(dut):
    cfg = bench_config()
    rng = random.Random(cfg.get("seed", 0))
    # No backpressure on m_axis in the back-to-back phase: the line brings ~0.98 byte per
    # cycle, so a slower reader would (rightly) overflow the frame FIFO.
    tb = AxisTB(dut, seed=rng.randrange(1 << 16), idle=0.3, backpressure=0.0)
    src = RgmiiSource(dut.rgmii_rxd, dut.rgmii_rx_ctl, dut.clk, dut.rst)
    snk = RgmiiSink(dut.rgmii_txd, dut.rgmii_tx_ctl, dut.clk, dut.rst)
    for end in (src, snk):
        end.log.setLevel(logging.WARNING)
    await tb.reset()

    def payload(n: int) -> bytes:
        return bytes(rng.getrandbits(8) for _ in range(n))

    # RX: good frames of many sizes back to back (IFG 12), bad FCS, runts, RX_ER.
    sizes = [60, 61, 64, 127, 128, 255, 256, 511, 1000, 1500, 1514, 1518]
    sizes += [rng.randint(60, 1518) for _ in range(6)]
    kinds = ["good"] * len(sizes) + ["bad_fcs"] * 3 + ["runt"] * 3 + ["rx_er"] * 2
    lens = [*sizes, 60, 700, 1514, 1, 30, 59, 100, 60]
    order = list(range(len(kinds)))
    rng.shuffle(order)
    want_rx, counts = [], {"rx_good": 0, "rx_bad_fcs": 0, "rx_runt": 0, "rx_error": 0}
    for j in order:
        kind, n = kinds[j], lens[j]
        data = payload(n)
        body = bytearray(data + struct.pack("<L", zlib.crc32(data)))
        if kind == "bad_fcs":
            body[-1 - rng.randrange(4)] ^= 1 << rng.randrange(8)
        frame = GmiiFrame.from_raw_payload(bytes(body))
        if kind == "rx_er":
            frame.error = [0] * len(frame.data)
            frame.error[8 + rng.randrange(n)] = 1
        await src.send(frame)
        key = {"good": "rx_good", "bad_fcs": "rx_bad_fcs", "runt": "rx_runt"}.get(kind, "rx_error")
        counts[key] += 1
        if kind == "good":
            want_rx.append(data)

    # TX: frames of all sizes from the AXI-Stream side, queued back to back.
    tx_sizes = [1, 2, 13, 14, 59, 60, 61, 64, 100, 1000, 1514] + [
        rng.randint(1, 1514) for _ in range(5)
    ]
    tx_data = [payload(n) for n in tx_sizes]

    async def send_all():
        for d in tx_data:
            await tb.send(d)

    async def recv_rx():
        for want in want_rx:
            got = await tb.recv()
            assert bytes(got.tdata) == want, (
                f"rx frame of {len(want)} bytes differs: got {len(got.tdata)}",
                {n: _counter(dut, n) for n in counts},
            )

    async def recv_tx():
        for d in tx_data:
            got = await snk.recv()
            body = d + bytes(max(0, 60 - len(d)))
            assert got.get_preamble() == bytes([0x55] * 7 + [0xD5])
            assert got.get_payload(strip_fcs=False) == body + struct.pack("<L", zlib.crc32(body))
            assert got.check_fcs() and not any(got.error or [])  # compact() drops an all-zero list

    cocotb.start_soon(send_all())
    await Combine(cocotb.start_soon(recv_rx()), cocotb.start_soon(recv_tx()))
    await ClockCycles(dut.clk, 50)
    assert tb.sink.empty(), "a dropped frame reached the AXI-Stream side"

    # Phase 2: m_axis backpressure 0.5, the source leaves a long gap so the FIFO drains.
    tb.sink.set_pause_generator(pauses(random.Random(5), 0.5))
    src.ifg = 3200
    slow = [payload(n) for n in (60, 1514, 333, 64)]
    for d in slow:
        await src.send(GmiiFrame.from_payload(d))
        counts["rx_good"] += 1
    for d in slow:
        got = await tb.recv()
        assert bytes(got.tdata) == d
    await ClockCycles(dut.clk, 50)
    for name, n in counts.items():
        assert _counter(dut, name) == n, (name, _counter(dut, name), n)
    assert _counter(dut, "rx_overflow") == 0
    assert _counter(dut, "tx_frames") == len(tx_data)
