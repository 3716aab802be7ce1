"""Commands with their write words onto litedram's native port, in order.

A user gives each command with its word (a write's; a read's is not used) as one
stream beat. The word waits in `wdata` from the cycle litedram takes its command until
litedram asks for it: litedram takes a word in every cycle it raises `wdata_ready`,
without looking at a valid (hw/sdram_controller.py), and asks some cycles after the
command (every SDRAM bench checks with the controller's `underrun`). A command goes only
while `wdata` has room for its word. The commands pass a registered skid: litedram's
`cmd_ready` is logic of its own, and with a user's choice of command in front of it the
25F missed 62.5 MHz (docs/boards.md).

With `i` in another clock (an AsyncFifo in front, as `SdramGatherBuffer` puts it) the
issuer runs in the memory's clock, so the word travels with its command and no
crossing of litedram's `wdata_ready` is needed.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from optireduce.hw.sdram_controller import native_port
from optireduce.hw.skid import Skid

WDATA_DEPTH = 64  # write words whose command litedram took, waiting to be asked for


def command_layout(addr_width: int, data_width: int = 32) -> data.StructLayout:
    """One command of the port with its write word."""
    return data.StructLayout({"we": 1, "addr": addr_width, "word": data_width})


class SdramIssuer(wiring.Component):
    """`i` (commands with their words) -> `mem` (litedram's native port); module docstring."""

    def __init__(self, addr_width: int, data_width: int = 32) -> None:
        self.layout = command_layout(addr_width, data_width)
        self.data_width = data_width
        super().__init__({
            "i": In(stream.Signature(self.layout)),
            "mem": Out(native_port(addr_width, data_width)),
        })  # fmt: skip

    def elaborate(self, platform) -> Module:
        m = Module()
        mem = self.mem
        m.submodules.skid = x = Skid(self.layout, registered=True)
        m.submodules.wdata = wdata = SyncFIFOBuffered(width=self.data_width, depth=WDATA_DEPTH)
        wiring.connect(m, wiring.flipped(self.i), x.i)
        cmd = x.o.payload
        m.d.comb += [
            mem.cmd_valid.eq(x.o.valid & wdata.w_rdy),
            mem.cmd_we.eq(cmd.we),
            mem.cmd_addr.eq(cmd.addr),
            x.o.ready.eq(mem.cmd_ready & wdata.w_rdy),
            wdata.w_en.eq(x.o.valid & x.o.ready & cmd.we),
            wdata.w_data.eq(cmd.word),
            # litedram takes the word when it asks; `valid` only tells the underrun check
            mem.wdata_valid.eq(wdata.r_rdy),
            mem.wdata_data.eq(wdata.r_data),
            wdata.r_en.eq(mem.wdata_ready),
        ]
        return m
