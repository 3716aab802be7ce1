"""What a board puts around the NIC core, between the MACs (domain `sync`, 125 MHz) and
the core (domain `core`, the board's core clock; docs/boards.md, "Clocks"):

  host_rx (bytes) -> HostAdapter -> host_cmd ----HandshakeCrossing--> core
                                 -> host_i      ----StreamCrossing---> core
                                 <- host_o      <---StreamCrossing----  core
                 (byte streams pass a registered Skid at the shell's edge; each
                  StreamCrossing has one on its sync side, host_o's the adapter's)
                     CSR bus     <-> CsrCrossing <-> core's register bank
  net_rx (bytes)  -> Widen(8)    --StreamCrossing--> core net_rx
  net_tx (bytes)  <- Narrow(8)  <-StreamCrossing--  core net_tx
  tick (sync)     --PulseSynchronizer--> core tick
  the adapter's counter strobes --PulseSynchronizer--> the core's bank (host block)

With its accumulators and gather slots in SDRAM (NicParams.sdram_addr_bits) the core's
SDRAM ports (`acc_mem`, `gather_mem`) and its `sdram_fault` run in `sdram_domain` (the
memory's clock: `sdram`, or the core's own) and are the shell's, for the board's
controller and LED.

The host adapter stays at 125 MHz so that the host port takes a byte per cycle, line rate;
the core's network port (8 bytes a beat) and host words (4) are line rate at
31.25 MHz and up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from amaranth import DomainRenamer, Module
from amaranth.lib import wiring
from amaranth.lib.cdc import PulseSynchronizer
from amaranth.lib.wiring import In, Out

from optireduce.hw.board_frames import Narrow, Widen
from optireduce.hw.clock_crossing import (
    CsrCrossing,
    HandshakeCrossing,
    StreamCrossing,
    csr_bus,
)
from optireduce.hw.host_adapter import CMD_LAYOUT, OUT_LAYOUT, HostAdapter
from optireduce.hw.sdram_controller import memory_ports
from optireduce.hw.skid import Skid
from optireduce.hw.streams import float_layout, frame_layout, frame_stream
from optireduce.params import NicParams

NET_BYTES = 8  # the core's network port: 8 bytes per beat
SDRAM_DOMAIN = "sdram"  # the accumulator store's and the SDRAM controller's clock


class NicShell(wiring.Component):
    """The host adapter, the width converters and the crossings around `core(p)`, which
    runs in `core_domain`. Ports (all in sync): `host_rx`/`host_tx` and `net_rx`/`net_tx`
    byte frames (toward the MACs), `tick` (one cycle per microsecond); a core with its
    accumulators in SDRAM adds its memory ports and `sdram_fault`, in `sdram_domain`
    (`core_domain` itself: the core and the SDRAM share a clock, nothing crosses)."""

    def __init__(self, p: NicParams, core: Callable[[NicParams], wiring.Component] | None = None,
                 *, core_domain: str = "core", sdram_domain: str = SDRAM_DOMAIN,
                 **adapter_args) -> None:  # fmt: skip
        if core is None:
            from optireduce.hw.nic_core import NicCore

            own = sdram_domain == core_domain  # the core's own clock: its `sync`
            core = functools.partial(NicCore, sdram_domain="sync" if own else sdram_domain)
        self.p, self.core_domain = p, core_domain
        self.core = core(p)
        self.host = HostAdapter(p, **adapter_args)
        super().__init__(self.ports())

    def ports(self) -> dict:
        members = self.core.signature.members
        mem = {n: members[n] for n in (*memory_ports(self.core).values(), "sdram_fault")
               if n in members}  # in sdram_domain  # fmt: skip
        return {
            "host_rx": In(frame_stream(1)),
            "host_tx": Out(frame_stream(1)),
            "net_rx": In(frame_stream(1)),
            "net_tx": Out(frame_stream(1)),
            "tick": In(1),
            **mem,
        }

    def elaborate(self, platform):
        m = Module()
        c = self.core_domain
        m.submodules.core = core = DomainRenamer(c)(self.core)
        for name in memory_ports(self.core).values():
            wiring.connect(m, getattr(core, name), wiring.flipped(getattr(self, name)))
        if hasattr(self, "sdram_fault"):
            m.d.comb += self.sdram_fault.eq(core.sdram_fault)
        m.submodules.host = host = self.host
        m.submodules.widen = widen = Widen(NET_BYTES)
        m.submodules.narrow = narrow = Narrow(NET_BYTES)

        def crossing(name: str, shape, to_core: bool) -> StreamCrossing:
            w, r = ("sync", c) if to_core else (c, "sync")
            # the core's side has time to spare at its clock: a skid on the MACs' side only
            m.submodules[name] = x = StreamCrossing(
                shape, w_domain=w, r_domain=r, skid_domains=("sync",)
            )
            return x

        def buffered(name: str, shape, src, dst) -> None:
            """src -> a registered skid -> dst: no logic of one side in front of the
            other's registers (the MACs, the demux and the FIFOs' flags at 125 MHz)."""
            m.submodules[name] = b = Skid(shape, registered=True)
            wiring.connect(m, src, b.i)
            wiring.connect(m, b.o, dst)

        # host port: commands and words in, results out
        # a command or two an op: one at a time, no FIFO
        m.submodules.x_host_cmd = cmd = HandshakeCrossing(CMD_LAYOUT, w_domain="sync", r_domain=c)
        h_in = crossing("x_host_i", float_layout(1), True)
        h_out = crossing("x_host_o", OUT_LAYOUT, False)
        buffered("b_host_rx", frame_layout(1), wiring.flipped(self.host_rx), host.i)
        buffered("b_host_tx", frame_layout(1), host.o, wiring.flipped(self.host_tx))
        wiring.connect(m, host.host_cmd, cmd.i)
        wiring.connect(m, cmd.o, core.host_cmd)
        wiring.connect(m, host.host_i, h_in.i)
        wiring.connect(m, h_in.o, core.host_i)
        wiring.connect(m, core.host_o, h_out.i)
        wiring.connect(m, h_out.o, host.host_o)  # from the crossing's sync-side skid

        # register bus
        m.submodules.x_csr = csr = CsrCrossing(host.csr_addr_bits, core_domain=c)
        m.d.comb += [
            *csr_bus(host, csr),
            host.csr_done.eq(csr.done),
            *csr_bus(csr, core, slave_prefix="csr_"),
            csr.csr_r_valid.eq(core.csr_r_valid),
        ]

        # network port: 8-byte beats cross
        n_in = crossing("x_net_rx", frame_layout(NET_BYTES), True)
        n_out = crossing("x_net_tx", frame_layout(NET_BYTES), False)
        buffered("b_net_rx", frame_layout(1), wiring.flipped(self.net_rx), widen.i)
        wiring.connect(m, widen.o, n_in.i)
        wiring.connect(m, n_in.o, core.net_rx)
        wiring.connect(m, core.net_tx, n_out.i)
        wiring.connect(m, n_out.o, narrow.i)
        buffered("b_net_tx", frame_layout(1), narrow.o, wiring.flipped(self.net_tx))

        # the microsecond tick; the adapter's counter strobes, for the core's bank (one
        # event a frame at most: far apart for a pulse's crossing)
        m.submodules.x_tick = tick = PulseSynchronizer("sync", c)
        m.d.comb += [tick.i.eq(self.tick), core.tick.eq(tick.o)]
        for j in range(len(host.counts)):
            m.submodules[f"x_count{j}"] = x = PulseSynchronizer("sync", c)
            m.d.comb += [x.i.eq(host.counts[j]), core.adapter_counts[j].eq(x.o)]
        return m
