"""What the virtual board Verilates: the shell a board carries (hw/nic_shell.py) with the
core's `idle` brought out (docs/boards.md, "The virtual board").

A board's MACs hand the shell whole frames without their FCS, a byte per `sync` cycle;
the virtual board's harness (sim/cosim/board_harness.cpp) does the same with frames read
from and written to Linux interfaces. `idle` (core domain) is read by the harness only,
to let time stand still between ops (docs/nic_core.md, "Idle and tick").
"""

from __future__ import annotations

from amaranth.lib.wiring import Out

from optireduce.hw.nic_shell import NicShell


class VirtualBoard(NicShell):
    """NicShell(p) around the NIC core (domains `sync` and `core`), plus `idle`."""

    def ports(self) -> dict:
        if self.p.sdram_addr_bits:
            raise ValueError("VirtualBoard has no SDRAM: sdram_addr_bits must be 0 (the "
                             "NIC core on SDRAM replays on the rtl backend)")  # fmt: skip
        return {**super().ports(), "idle": Out(1)}

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.idle.eq(self.core.idle)
        return m
