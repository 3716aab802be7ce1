"""RGMII MAC (hw/rgmii_mac.py): CRC vs zlib, TX and RX at the pins in amaranth.sim, cocotb
with cocotbext-eth's RGMII source/sink under Verilator. References: scapy + zlib."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from optireduce.hw.axis import AxisWrapper
from optireduce.hw.crc32 import CRC_INIT, Crc32
from optireduce.hw.rgmii_mac import RX_COUNTERS, RgmiiMac
from optireduce.sim.cocotb_run import run_bench

PRE = bytes([0x55] * 7 + [0xD5])


def ref_frame(n: int, rng: random.Random) -> bytes:
    """An n-byte frame: scapy Ether()/Raw when a header fits, else random bytes."""
    if n < 14:
        return bytes(rng.getrandbits(8) for _ in range(n))
    load = bytes(rng.getrandbits(8) for _ in range(n - 14))
    src = "02:00:00:{:02x}:{:02x}:{:02x}".format(*tuple(rng.getrandbits(8) for _ in range(3)))
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=src, type=0x88B5) / Raw(load=load))


def ref_wire(frame: bytes) -> bytes:
    """What the MAC must put on the wire after the SFD: padded to 60, then the FCS."""
    body = frame + bytes(max(0, 60 - len(frame)))
    return body + struct.pack("<L", zlib.crc32(body))


def test_crc32_matches_zlib():
    rng = random.Random(1)
    msgs = [b"", b"\x00", b"\xff" * 7, bytes(range(256))]
    msgs += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 80))) for _ in range(12)]
    dut = Crc32()
    got = []

    async def bench(ctx):
        for msg in msgs:
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            ctx.set(dut.en, 1)
            for b in msg:
                ctx.set(dut.data, b)
                await ctx.tick()
            ctx.set(dut.en, 0)
            got.append(ctx.get(dut.fcs))
        assert ctx.get(dut.crc) != CRC_INIT  # the last message moved the register

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == [zlib.crc32(msg) for msg in msgs]


class MacSim:
    """The MAC in amaranth.sim with pin-level drivers: the RX driver mirrors cocotbext-eth's
    RgmiiSource (low nibble + EN after the falling edge, high nibble + EN^ER after the
    rising edge); the TX monitor reads the pins in the middle of each half cycle."""

    def __init__(self, fifo_bytes: int = 2048) -> None:
        self.mac = RgmiiMac(fifo_bytes=fifo_bytes)
        self.top = Module()
        self.top.domains.sync = self.cd = ClockDomain()
        self.top.submodules.mac = self.mac

    def run(
        self,
        tx_frames: list[bytes] = (),
        rx_wire: list[tuple[bytes, set[int], int]] = (),
        n_rx_out: int = 0,
        *,
        idle: float = 0.0,
        backpressure: float = 0.0,
        seed: int = 0,
        max_cycles: int = 200_000,
    ) -> dict:
        mac, clk = self.mac, self.cd.clk
        rng = random.Random(seed)
        res = {"tx_bytes": [], "rx_out": [], "counters": {}}
        done = {"rx": False}

        async def tx_driver(ctx):
            for frame in tx_frames:
                for k, b in enumerate(frame):
                    while idle and rng.random() < idle:
                        ctx.set(mac.i.valid, 0)
                        await ctx.tick()
                    ctx.set(mac.i.valid, 1)
                    ctx.set(mac.i.payload, {"data": [b], "keep": 1, "last": k == len(frame) - 1})
                    await ctx.tick().until(mac.i.ready)
            ctx.set(mac.i.valid, 0)

        async def tx_monitor(ctx):
            while True:
                await ctx.negedge(clk)
                await ctx.delay(2e-9)
                lo, en = ctx.get(mac.rgmii_txd), ctx.get(mac.rgmii_tx_ctl)
                await ctx.posedge(clk)
                await ctx.delay(2e-9)
                hi, ctl2 = ctx.get(mac.rgmii_txd), ctx.get(mac.rgmii_tx_ctl)
                res["tx_bytes"].append((lo | hi << 4, en, en ^ ctl2))

        async def rx_driver(ctx):
            for wire, errs, ifg in rx_wire:
                for k, b in enumerate(list(wire) + [None] * ifg):
                    en, er, d = (0, 0, 0) if b is None else (1, int(k in errs), b)
                    await ctx.negedge(clk)
                    ctx.set(mac.rgmii_rxd, d & 15)
                    ctx.set(mac.rgmii_rx_ctl, en)
                    await ctx.posedge(clk)
                    ctx.set(mac.rgmii_rxd, d >> 4)
                    ctx.set(mac.rgmii_rx_ctl, en ^ er)
            done["rx"] = True

        async def main(ctx):
            cur = []
            for _ in range(max_cycles):
                ready = not (backpressure and rng.random() < backpressure)
                ctx.set(mac.o.ready, ready)
                if ready and ctx.get(mac.o.valid):
                    p = ctx.get(mac.o.payload)
                    assert p.keep == 1
                    cur.append(int(p.data[0]))
                    if p.last:
                        res["rx_out"].append(bytes(cur))
                        cur = []
                await ctx.tick()
                if (
                    done["rx"]
                    and len(res["rx_out"]) >= n_rx_out
                    and ctx.get(mac.tx_frames) >= len(tx_frames)
                ):
                    break
            else:
                raise TimeoutError(f"rx out {len(res['rx_out'])}/{n_rx_out}")
            await ctx.tick().repeat(40)  # the last frame's tail and IFG on the pins
            res["counters"] = {n: ctx.get(getattr(mac, n)) for n in ("tx_frames", *RX_COUNTERS)}
            assert not cur, "a partial frame was left on o"

        sim = Simulator(self.top)
        sim.add_clock(8e-9, domain=self.cd)
        sim.add_testbench(tx_driver, background=True)
        sim.add_testbench(tx_monitor, background=True)
        sim.add_testbench(rx_driver, background=True)
        sim.add_testbench(main)
        sim.run()
        return res


def split_wire(tx_bytes) -> tuple[list[bytes], list[int], list[list[int]]]:
    """Frames (runs of EN), idle bytes between consecutive frames, error flags per frame."""
    frames, gaps, errs, cur, cur_e, idle, seen = [], [], [], [], [], 0, False
    for b, en, er in tx_bytes:
        if en:
            if not cur and seen:
                gaps.append(idle)
            cur.append(b)
            cur_e.append(er)
        elif cur:
            frames.append(bytes(cur))
            errs.append(cur_e)
            cur, cur_e, idle, seen = [], [], 1, True
        else:
            idle += 1
    return frames, gaps, errs


@pytest.mark.parametrize(("sizes", "idle", "b2b"), [
    ([1, 13, 14, 59, 60, 61, 64, 200, 1514], 0.3, False),
    ([100, 100, 100, 64, 60, 1, 17, 17], 0.0, True),
])  # fmt: skip
def test_tx_framing_padding_fcs_ifg(sizes, idle, b2b):
    rng = random.Random(len(sizes))
    frames = [ref_frame(n, rng) for n in sizes]
    res = MacSim().run(tx_frames=frames, idle=idle, seed=5)
    wire, gaps, errs = split_wire(res["tx_bytes"])
    assert len(wire) == len(frames)
    for got, frame, er in zip(wire, frames, errs, strict=True):
        assert got[:8] == PRE
        assert got[8:] == ref_wire(frame)
        assert not any(er)
    assert all(g >= 12 for g in gaps), gaps
    if b2b:  # every frame waits in the FIFO: the gap is exactly the minimum
        assert gaps == [12] * (len(frames) - 1)
    assert res["counters"]["tx_frames"] == len(frames)


def rx_case(rng: random.Random, kind: str, n: int) -> tuple[bytes, set[int], bytes | None]:
    """(wire bytes incl. preamble, RX_ER byte indices, expected output or None if dropped)."""
    frame = ref_frame(n, rng)  # n data bytes, FCS added below
    fcs = struct.pack("<L", zlib.crc32(frame))
    if kind == "bad_fcs":
        k = rng.randrange(4)
        fcs = fcs[:k] + bytes([fcs[k] ^ (1 << rng.randrange(8))]) + fcs[k + 1 :]
    if kind == "bad_data":
        k = rng.randrange(n)
        frame = frame[:k] + bytes([frame[k] ^ 0x10]) + frame[k + 1 :]
    wire = PRE + frame + fcs
    errs = {rng.randrange(8, len(wire))} if kind == "rx_er" else set()
    return wire, errs, frame if kind == "good" else None


EXPECT = {"good": "rx_good", "bad_fcs": "rx_bad_fcs", "bad_data": "rx_bad_fcs",
          "runt": "rx_runt", "rx_er": "rx_error"}  # fmt: skip


@pytest.mark.parametrize(("bp", "ifg"), [(0.0, 12), (0.3, 12), (0.0, 1), (0.3, 2)])
def test_rx_good_bad_runt_error_counted(bp, ifg):
    rng = random.Random(7)
    cases = [("good", n) for n in (60, 61, 63, 64, 100, 255, 1000, 1514, 1518)]
    cases += [("good", rng.randint(60, 400)) for _ in range(8)]
    cases += [("bad_fcs", 60), ("bad_fcs", 300), ("bad_data", 90), ("bad_data", 1514)]
    cases += [("runt", n) for n in (1, 4, 5, 20, 59)]  # < 64 bytes with the FCS
    cases += [("rx_er", 60), ("rx_er", 500), ("rx_er", 10)]
    rng.shuffle(cases)
    built = [rx_case(rng, kind, n) for kind, n in cases]
    wire = [(w, e, ifg) for w, e, _ in built]
    want = [x for _, _, x in built if x is not None]
    res = MacSim().run(rx_wire=wire, n_rx_out=len(want), backpressure=bp, seed=3)
    assert res["rx_out"] == want
    counts = {name: 0 for name in RX_COUNTERS}
    for kind, n in cases:
        counts["rx_runt" if kind != "rx_er" and n + 4 < 64 else EXPECT[kind]] += 1
    got = {k: v for k, v in res["counters"].items() if k != "tx_frames"}
    assert got == counts


def test_rx_overflow_and_loopback_small_fifo():
    """A 64-byte FIFO: a frame longer than it is dropped as overflow; short ones pass."""
    rng = random.Random(11)
    good = [ref_frame(n, rng) for n in (60, 64, 60)]
    big = ref_frame(100, rng)
    wire = []
    for f in (good[0], big, good[1], good[2]):
        wire.append((PRE + f + struct.pack("<L", zlib.crc32(f)), set(), 12))
    res = MacSim(fifo_bytes=64).run(rx_wire=wire, n_rx_out=3, seed=1)
    assert res["rx_out"] == good
    assert res["counters"]["rx_overflow"] == 1 and res["counters"]["rx_good"] == 3


def test_tx_cut_through_underrun_marks_tx_er():
    """A frame longer than a 64-byte TX FIFO goes out cut-through; an input gap inside it
    shows as TX_ER (the frame is poisoned, never silently shortened)."""
    rng = random.Random(2)
    frame = ref_frame(300, rng)
    res = MacSim(fifo_bytes=64).run(tx_frames=[frame], idle=0.5, seed=9)
    wire, _gaps, errs = split_wire(res["tx_bytes"])
    assert len(wire) == 1 and any(errs[0])
    kept = bytes(b for b, e in zip(wire[0], errs[0], strict=True) if not e)
    assert kept[:8] == PRE and kept[8:] == ref_wire(frame)


def test_cocotb_rgmii_source_sink():
    run_bench(AxisWrapper(RgmiiMac(fifo_bytes=2048)), "rgmii_mac_top",
              f"{__package__}.benches.tb_rgmii_mac", {"seed": 1})  # fmt: skip


def test_board_code_path_elaborates():
    """The board variant (platform DDR buffers, RX on its own clock with CDC) elaborates and
    converts with a stand-in platform whose DDR buffers are empty; not simulated here."""
    from types import SimpleNamespace

    from amaranth.back import rtlil
    from amaranth.lib import io

    class FakePlatform:
        def __init__(self):
            self.buffers = []

        def get_io_buffer(self, buffer):
            self.buffers.append((buffer.direction, len(buffer.port)))
            return Module()

    pads = SimpleNamespace(
        tx_clk=io.SimulationPort("o", 1), tx_ctl=io.SimulationPort("o", 1),
        tx_data=io.SimulationPort("o", 4), rx_ctl=io.SimulationPort("i", 1),
        rx_data=io.SimulationPort("i", 4),
    )  # fmt: skip
    mac = RgmiiMac(pads=pads, rx_domain="rgmii_rx")
    assert "rgmii_txd" not in mac.signature.members
    top = Module()
    top.domains.sync = ClockDomain()
    top.domains.rgmii_rx = ClockDomain()
    top.submodules.mac = mac
    plat = FakePlatform()
    ports = [mac.i.valid, mac.o.valid, mac.o.payload.as_value(), mac.rx_good]
    text = rtlil.convert(top, platform=plat, ports=ports)
    assert sorted((d.value, w) for d, w in plat.buffers) == [
        ("i", 1), ("i", 4), ("o", 1), ("o", 1), ("o", 4)
    ]  # fmt: skip
    assert "rx_good_gray" in text
