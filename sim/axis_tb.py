"""Shared cocotb test-bench pieces: clock, reset, AXI-Stream source/sink with
random idle and backpressure, and element packing to and from tdata bytes."""

from __future__ import annotations

import logging
import random

import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource


def pack(values, width: int, lanes: int = 1) -> bytes:
    """Elements (signed ints) into little-endian tdata words of lanes*width bits."""
    nbytes = -(-(width * lanes) // 8)
    mask = (1 << width) - 1
    out = bytearray()
    v = [int(x) for x in np.asarray(values).ravel()]
    for k in range(0, len(v), lanes):
        word = 0
        for lane, x in enumerate(v[k : k + lanes]):
            word |= (x & mask) << (lane * width)
        out += word.to_bytes(nbytes, "little")
    return bytes(out)


def unpack(data: bytes, width: int, lanes: int = 1, signed: bool = True) -> np.ndarray:
    nbytes = -(-(width * lanes) // 8)
    mask = (1 << width) - 1
    out = []
    for k in range(0, len(data), nbytes):
        word = int.from_bytes(data[k : k + nbytes], "little")
        for lane in range(lanes):
            x = (word >> (lane * width)) & mask
            if signed and x >> (width - 1):
                x -= 1 << width
            out.append(x)
    return np.array(out, dtype=np.int64)


def pauses(rng: random.Random, p_pause: float):
    """An endless pause pattern: True (idle) with probability p_pause."""
    while True:
        yield rng.random() < p_pause


class AxisTB:
    """Owns the clock, reset and both AXI-Stream ends of a block's shell."""

    def __init__(self, dut, *, seed: int = 0, idle: float = 0.0, backpressure: float = 0.0):
        self.dut = dut
        Clock(dut.clk, 8, unit="ns").start()
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        for end in (self.source, self.sink):
            end.log.setLevel(logging.WARNING)  # one INFO line per frame slows long runs
        rng = random.Random(seed)
        if idle:
            self.source.set_pause_generator(pauses(rng, idle))
        if backpressure:
            self.sink.set_pause_generator(pauses(rng, backpressure))

    async def reset(self, **ports: int) -> None:
        """Reset, with the named configuration ports held at their values meanwhile."""
        for name, value in ports.items():
            getattr(self.dut, name).value = value
        self.dut.rst.value = 1
        for _ in range(4):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def send(self, data: bytes, first: bool = False) -> None:
        """One frame; tuser (first) set on its first beat when asked."""
        frame = AxiStreamFrame(data)
        if first:  # tuser is per byte; the beat takes its last lane's value
            lanes = self.source.byte_lanes
            frame.tuser = [1] * lanes + [0] * (len(data) - lanes)
        await self.source.send(frame)

    async def recv(self) -> AxiStreamFrame:
        return await self.sink.recv()

    async def op(self, data: bytes) -> AxiStreamFrame:
        """One op: its frame in (first beat marked), its output frame out."""
        await self.send(data, first=True)
        return await self.recv()

    async def ops(self, ops: list[dict], width: int, lanes: int, ports: tuple[str, ...]):
        """Each op in turn ({"v": its values, port: value, ...}): its `ports` set, its
        frame in and its output out; yields (op, values, output bytes)."""
        for op in ops:
            v = np.array(op["v"], dtype=np.int64)
            for name in ports:
                getattr(self.dut, name).value = op[name]
            yield op, v, (await self.op(pack(v, width, lanes))).tdata
