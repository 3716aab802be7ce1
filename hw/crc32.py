"""Ethernet FCS: CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), one byte per cycle.

`crc32_next(crc, byte)` is the combinational byte step as a pure XOR network, derived here
from the bitwise algorithm by tracking which input bits each state bit depends on. With
the register initialised to CRC_INIT, the FCS of a frame is `~crc` sent LSB first
(the same value as `zlib.crc32`), and a frame followed by its own FCS always leaves
CRC_RESIDUE in the register.
"""

from __future__ import annotations

from functools import reduce
from operator import xor

from amaranth import Cat, Const, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

POLY = 0xEDB88320  # reflected 0x04C11DB7
CRC_INIT = 0xFFFFFFFF
CRC_RESIDUE = 0xDEBB20E3  # register after data + FCS (non-inverted)


def _byte_step_terms() -> list[tuple[list[int], list[int]]]:
    """For each of the 32 new state bits: (crc bits, data bits) whose XOR gives it."""
    # A bit's dependency is a set of ("c", i) / ("d", j) sources, combined by symmetric difference.
    state = [{("c", i)} for i in range(32)]
    for j in range(8):
        fb = state[0] ^ {("d", j)}
        shifted = [state[i + 1] for i in range(31)] + [set()]
        state = [shifted[i] ^ fb if (POLY >> i) & 1 else shifted[i] for i in range(32)]
    return [
        (sorted(i for t, i in s if t == "c"), sorted(j for t, j in s if t == "d")) for s in state
    ]


_TERMS = _byte_step_terms()


def crc32_next(crc: Value, byte: Value) -> Value:
    """The register after one more byte (LSB first), as a 32-bit Amaranth value."""
    crc, byte = Value.cast(crc), Value.cast(byte).as_unsigned()
    byte = Cat(byte, Const(0, 8))[:8]  # an int 0 casts to one bit
    bits = [reduce(xor, [crc[i] for i in cs] + [byte[j] for j in ds]) for cs, ds in _TERMS]
    return Cat(*bits)


def crc32_next_int(crc: int, byte: int) -> int:
    """Software twin of crc32_next (same XOR network), for tests and figures."""
    out = 0
    for k, (cs, ds) in enumerate(_TERMS):
        bit = 0
        for i in cs:
            bit ^= (crc >> i) & 1
        for j in ds:
            bit ^= (byte >> j) & 1
        out |= bit << k
    return out


class Crc32(wiring.Component):
    """A running FCS register: `clear` restarts it, `en` folds in `data`; `crc` is the
    register (non-inverted), `fcs` = ~crc is what goes on the wire."""

    LATENCY = 1

    def __init__(self) -> None:
        super().__init__(
            {"data": In(8), "en": In(1), "clear": In(1), "crc": Out(32), "fcs": Out(32)}
        )

    def elaborate(self, platform):
        m = Module()
        reg = Signal(32, init=CRC_INIT)
        with m.If(self.clear):
            m.d.sync += reg.eq(CRC_INIT)
        with m.Elif(self.en):
            m.d.sync += reg.eq(crc32_next(reg, self.data))
        m.d.comb += [self.crc.eq(reg), self.fcs.eq(~reg)]
        return m
