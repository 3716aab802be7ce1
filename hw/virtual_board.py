"""What the virtual board Verilates: the shell a board carries (hw/nic_shell.py) with the
core's `idle` brought out (docs/boards.md, "The virtual board").

A board's MACs hand the shell whole frames without their FCS, a byte per `sync` cycle;
the virtual board's harness (sim/cosim/board_harness.cpp) does the same with frames read
from and written to Linux interfaces. Ports, all in `sync` but `idle` (core domain, read
by the harness only to let time stand still between ops):

  host_rx / host_tx   the host port's frames (EtherType 0x88B5)
  net_rx / net_tx     the network port's frames (UBT over UDP/IPv4)
  tick                one cycle per microsecond
  idle                the core has no work (docs/nic_core.md, "Idle and tick")
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.nic_shell import NicShell
from optireduce.hw.streams import frame_stream
from optireduce.params import NicParams


class VirtualBoard(wiring.Component):
    """NicShell(p) around the NIC core (domains `sync` and `core`), plus `idle`."""

    def __init__(self, p: NicParams) -> None:
        self.p = p
        self.shell = NicShell(p)
        super().__init__(
            {
                "host_rx": In(frame_stream(1)),
                "host_tx": Out(frame_stream(1)),
                "net_rx": In(frame_stream(1)),
                "net_tx": Out(frame_stream(1)),
                "tick": In(1),
                "idle": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.shell = shell = self.shell
        for port in ("host_rx", "net_rx"):
            wiring.connect(m, wiring.flipped(getattr(self, port)), getattr(shell, port))
        for port in ("host_tx", "net_tx"):
            wiring.connect(m, getattr(shell, port), wiring.flipped(getattr(self, port)))
        m.d.comb += [shell.tick.eq(self.tick), self.idle.eq(shell.core.idle)]
        return m
