"""Block RAM whose read of an address written in the same cycle is undefined, as the
ECP5's DP16KD gives it, instead of emulated.

Amaranth's synchronous read port promises the old data when a write to the same
address happens in the same cycle (`transparent_for=()`). A DP16KD's two ports do not
keep that promise, so yosys builds it around the RAM for every such port: a register
of the write data, an address compare and a mux per bit, all in front of the read's
register. On the 25F the memories that use this module saved 741 LUTs and 1 129
flip-flops of the whole NIC, and the compare sat on the 125 MHz side's worst paths.

`block_ram` marks a memory `no_rw_check`; `read_port` reads it asynchronously into a
register of its own, which yosys folds into the RAM's read port with the collision left
undefined. Only for memories whose design never uses a read that collides with a write
of the same address (each user says why). In simulation (no platform: Amaranth's
simulator, Verilator, formal) the register takes the complement of the old data on a
collision, so the RTL ≡ model suites fail if any result depends on one; a board's
build has no such logic.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, Signal, Value
from amaranth.lib.memory import Memory


def block_ram(*, shape, depth: int, init=()) -> Memory:
    """A memory whose read/write collisions are undefined (read it with `read_port`)."""
    return Memory(shape=shape, depth=depth, init=list(init), attrs={"no_rw_check": 1})


def read_port(m: Module, mem: Memory, writes: tuple, *, platform, domain: str = "sync"
              ) -> SimpleNamespace:  # fmt: skip
    """A read port of `mem` with the timing of a synchronous one: `addr` and `en` (high
    by default) this cycle, `data` the next (held while `en` is low). `writes`: the
    memory's write ports, whose collisions the simulation poisons."""
    rd = mem.read_port(domain="comb")
    port = SimpleNamespace(
        addr=Signal.like(rd.addr, name="rd_addr"),
        en=Signal(init=1, name="rd_en"),
        data=Signal.like(rd.data, name="rd_data", reset_less=True),
    )
    m.d.comb += rd.addr.eq(port.addr)
    value = Value.cast(rd.data)  # the bits, whatever the memory's shape
    if platform is None:
        hit = Cat(*(w.en.any() & (w.addr == port.addr) for w in writes)).any()
        value = Mux(hit, ~value, value)
    with m.If(port.en):
        m.d[domain] += Value.cast(port.data).eq(value)
    return port
