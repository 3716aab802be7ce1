"""Crossings between the board's clock domains: `sync` (125 MHz, the MACs and the host
adapter, one byte per cycle is line rate) and `core` (the NIC core, at the board's
`core_mhz`; docs/boards.md, "Clocks").

  StreamCrossing  a stream through an AsyncFifo (gray-coded pointers, hw/async_fifo.py)
  CsrCrossing     the register bus: each access goes over as a request, and comes back
                  as one response (read data, or 0 for a write) a few cycles later

The microsecond tick crosses as a pulse (amaranth.lib.cdc.PulseSynchronizer in the top).
"""

from __future__ import annotations

from amaranth import Cat, DomainRenamer, Module, Shape, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from optireduce.hw.async_fifo import AsyncFifo
from optireduce.hw.skid import Skid


class StreamCrossing(wiring.Component):
    """`i` (in `w_domain`) to `o` (in `r_domain`), in order, nothing dropped. `depth` beats
    buffer the gap between the two clocks (a power of two). The
    ends in `skid_domains` (default: both) are registers, a registered Skid each: the
    FIFO's flag logic (gray compares) and that side's logic never share a path. A side
    with time to spare leaves it out (the shell's core side, at 52 MHz: its skids were
    about 330 LUTs and 600 flip-flops of the 25F)."""

    def __init__(self, shape, *, w_domain: str, r_domain: str, depth: int = 16,
                 skid_domains: tuple[str, ...] | None = None) -> None:  # fmt: skip
        self.shape, self.depth = shape, depth
        self.w_domain, self.r_domain = w_domain, r_domain
        self.skid_domains = (w_domain, r_domain) if skid_domains is None else skid_domains
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self.shape).width
        m.submodules.fifo = fifo = AsyncFifo(
            width=width, depth=self.depth, w_domain=self.w_domain, r_domain=self.r_domain
        )
        w_in, r_out = self.i, self.o  # the FIFO's two ends, behind the skids if any
        if self.w_domain in self.skid_domains:
            m.submodules.w_skid = w = DomainRenamer(self.w_domain)(
                Skid(self.shape, registered=True)
            )
            wiring.connect(m, wiring.flipped(w_in), w.i)
            w_in = w.o
        if self.r_domain in self.skid_domains:
            m.submodules.r_skid = r = DomainRenamer(self.r_domain)(
                Skid(self.shape, registered=True)
            )
            wiring.connect(m, r.o, wiring.flipped(r_out))
            r_out = r.i
        m.d.comb += [
            fifo.w_data.eq(w_in.payload),
            fifo.w_en.eq(w_in.valid),
            w_in.ready.eq(fifo.w_rdy),
            r_out.payload.eq(fifo.r_data),
            r_out.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(r_out.ready),
        ]
        return m


class HandshakeCrossing(wiring.Component):
    """`i` (in `w_domain`) to `o` (in `r_domain`), one beat at a time, for beats that
    come far apart (the host's commands, one or two an op): the beat waits in a register
    and a toggle tells the other side, which toggles back once `o` has taken it; `i` is
    ready again when that is seen. No LUT RAM and no pointers (a StreamCrossing of the
    host's 89-bit commands was about 200 of the 25F's LUTs); a beat takes about four
    cycles of each clock."""

    def __init__(self, shape, *, w_domain: str, r_domain: str) -> None:
        self.shape, self.w_domain, self.r_domain = shape, w_domain, r_domain
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        w, r = self.w_domain, self.r_domain
        held = Signal(self.shape, name="held")  # the beat, still from its toggle on
        given, taken = Signal(name="given"), Signal(name="taken")  # in w, in r
        given_r, taken_w = Signal(name="given_r"), Signal(name="taken_w")  # seen across
        m.submodules.given_sync = FFSynchronizer(given, given_r, o_domain=r)
        m.submodules.taken_sync = FFSynchronizer(taken, taken_w, o_domain=w)
        m.d.comb += self.i.ready.eq(given == taken_w)
        with m.If(self.i.valid & self.i.ready):
            m.d[w] += [held.eq(self.i.payload), given.eq(~given)]
        m.d.comb += [self.o.valid.eq(given_r != taken), self.o.payload.eq(held)]
        with m.If(self.o.valid & self.o.ready):
            m.d[r] += taken.eq(~taken)
        return m


CSR_BUS = ("addr", "w_en", "w_data", "r_en")  # an access, to the bank; `r_data` comes back


def csr_bus_ports(addr_bits: int, prefix: str = "", flow=In) -> dict:
    """The register bus's ports (`prefix` before each name) as the bank's side sees them
    (flow In) or the side that makes the accesses (flow Out)."""
    back = Out if flow is In else In
    widths = {"addr": addr_bits, "w_en": 1, "w_data": 32, "r_en": 1}
    return {prefix + n: flow(w) for n, w in widths.items()} | {prefix + "r_data": back(32)}


def csr_bus(master, slave, slave_prefix: str = "") -> list:
    """Statements that carry the register bus from `master`'s csr_* ports to `slave`'s
    ports `<slave_prefix>addr`, ... and r_data back."""
    out = [getattr(slave, slave_prefix + n).eq(getattr(master, "csr_" + n)) for n in CSR_BUS]
    return [*out, master.csr_r_data.eq(getattr(slave, slave_prefix + "r_data"))]


class CsrCrossing(wiring.Component):
    """The register bus from the host adapter (`domain`, usually sync) to the core's bank
    (`core_domain`). An access (one cycle of `r_en` or `w_en` with addr and data) is
    applied to the bank as one cycle there; `done` strobes when it has come back, with
    `r_data` (a read's data; 0 for a write): a write the cycle after it was applied, a
    read when the bank's `csr_r_valid` strobes (hw/csr.py: within Csr.MAX_READ_CYCLES,
    its counters' sequencer never stops; both domains leave reset together on every
    board). One access at a time: the next waits for `done`. Port names are those of
    the core's bus (csr_*)."""

    def __init__(self, addr_bits: int, *, domain: str = "sync", core_domain: str = "core"
                 ) -> None:  # fmt: skip
        self.addr_bits = addr_bits
        self.domain, self.core_domain = domain, core_domain
        super().__init__(
            {
                **csr_bus_ports(addr_bits),  # the host adapter's side
                "done": Out(1),
                **csr_bus_ports(addr_bits, "csr_", Out),  # the core's side
                "csr_r_valid": In(1),
            }
        )

    def elaborate(self, platform):
        # One access at a time, so no queues: each side holds its word in a register and
        # flips a toggle that the other side sees through two flip-flops. The word has
        # been still for cycles when the toggle's edge is seen (no LUT RAM, no pointers:
        # two AsyncFifos of 4 were about 260 of the 25F's LUTs).
        m = Module()
        a = self.addr_bits
        h, c = self.domain, self.core_domain
        req, req_t = Signal(a + 34, name="csr_req"), Signal(name="csr_req_t")
        rsp, rsp_t = Signal(32, name="csr_rsp"), Signal(name="csr_rsp_t")
        req_seen, rsp_seen = Signal(name="csr_req_seen"), Signal(name="csr_rsp_seen")
        req_last, rsp_last = Signal(name="csr_req_last"), Signal(name="csr_rsp_last")
        m.submodules.req_sync = FFSynchronizer(req_t, req_seen, o_domain=c)
        m.submodules.rsp_sync = FFSynchronizer(rsp_t, rsp_seen, o_domain=h)

        # host side: the access goes in as one request; its response is `done`, registered
        with m.If(self.w_en | self.r_en):
            m.d[h] += [req.eq(Cat(self.addr, self.w_data, self.w_en, self.r_en)), req_t.eq(~req_t)]
        m.d[h] += [rsp_last.eq(rsp_seen), self.done.eq(rsp_seen != rsp_last)]
        m.d.comb += self.r_data.eq(rsp)  # still from its toggle until the next access

        # core side: a request is one bus cycle; a write answers the cycle after, a read
        # when the bank has its data
        new = Signal(name="csr_new")
        m.d[c] += req_last.eq(req_seen)
        m.d.comb += new.eq(req_seen != req_last)
        addr, w_data = req[:a], req[a : a + 32]
        w_en, r_en = req[a + 32], req[a + 33]
        m.d.comb += [
            self.csr_addr.eq(addr),
            self.csr_w_data.eq(w_data),
            self.csr_w_en.eq(new & w_en),
            self.csr_r_en.eq(new & r_en),
        ]
        written = Signal(name="csr_written")
        m.d[c] += written.eq(new & ~r_en)
        with m.If(written | self.csr_r_valid):
            m.d[c] += [rsp.eq(self.csr_r_data & self.csr_r_valid.replicate(32)),
                       rsp_t.eq(~rsp_t)]  # fmt: skip
        return m
