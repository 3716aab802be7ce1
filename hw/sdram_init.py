"""SDRAM init: plays litedram's init sequence into its control registers, then hands the
chips to the controller.

litedram's standalone core leaves the power-up sequence (CKE, precharge, mode register,
refreshes) to software on its Wishbone control bus; a board without a CPU needs this
block instead. The program is a ROM of Wishbone writes, each followed by a wait in
cycles; every write has a bounded wait for its acknowledge.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

ACK_TIMEOUT = 64  # cycles without an acknowledge; the CSR bus answers in 2
# litedram's DFII register bits, by the names its init sequence uses (sdram_phy.h)
DFII_BITS = {
    "DFII_CONTROL_SEL": 0x01, "DFII_CONTROL_CKE": 0x02, "DFII_CONTROL_ODT": 0x04,
    "DFII_CONTROL_RESET_N": 0x08, "DFII_COMMAND_CS": 0x01, "DFII_COMMAND_WE": 0x02,
    "DFII_COMMAND_CAS": 0x04, "DFII_COMMAND_RAS": 0x08,
}  # fmt: skip
DFII_CONTROL_SEL = DFII_BITS["DFII_CONTROL_SEL"]  # the controller, not the init port, drives


def program(csr: dict[str, int], init: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """(byte address, data, wait after) for every write: the init steps, then hardware
    control and init_done (which opens the user port)."""
    out: list[tuple[int, int, int]] = []
    for a, ba, is_control, bits, delay in init:
        out += [(csr["sdram_dfii_pi0_address"], a, 0), (csr["sdram_dfii_pi0_baddress"], ba, 0)]
        if is_control:
            out.append((csr["sdram_dfii_control"], bits, delay))
        else:
            out += [(csr["sdram_dfii_pi0_command"], bits, 0),
                    (csr["sdram_dfii_pi0_command_issue"], 1, delay)]  # fmt: skip
    out += [(csr["sdram_dfii_control"], DFII_CONTROL_SEL, 0), (csr["ddrctrl_init_done"], 1, 0)]
    return out


class SdramInit(wiring.Component):
    """Wishbone (classic, 32-bit, word addresses) master for the init program."""

    def __init__(self, writes: list[tuple[int, int, int]]) -> None:
        bad = [(a, d, w) for a, d, w in writes
               if a % 4 or not 0 <= a < 1 << 32 or not 0 <= d < 1 << 32 or w < 0]  # fmt: skip
        if bad or not writes:
            self._MustUse__used = True  # refused: nothing to elaborate, nothing to warn of
            raise ValueError(f"init writes {bad or '(none)'}: at least one, each with a "
                             "word-aligned 32-bit address, 32-bit data, a wait >= 0")  # fmt: skip
        self.writes = writes
        self.wait_bits = max(1, max(w for _, _, w in writes).bit_length())
        super().__init__({
            "adr": Out(30), "dat_w": Out(32), "sel": Out(4), "cyc": Out(1), "stb": Out(1),
            "we": Out(1), "ack": In(1), "done": Out(1), "error": Out(1),
        })  # fmt: skip

    def elaborate(self, platform) -> Module:
        m = Module()
        n = len(self.writes)
        w_adr, w_wait = 30, self.wait_bits
        rom = [(a >> 2) | (d << w_adr) | (w << (w_adr + 32)) for a, d, w in self.writes]
        m.submodules.rom = mem = Memory(shape=w_adr + 32 + w_wait, depth=n, init=rom)
        rd = mem.read_port(domain="comb")
        index = Signal(range(n + 1))
        wait = Signal(w_wait)
        ack_wait = Signal(range(ACK_TIMEOUT + 1))
        m.d.comb += [rd.addr.eq(index), self.sel.eq(0xF), self.we.eq(1),
                     self.adr.eq(rd.data[:w_adr]),
                     self.dat_w.eq(rd.data[w_adr:w_adr + 32])]  # fmt: skip
        with m.FSM():
            with m.State("WRITE"):
                m.d.comb += [self.cyc.eq(1), self.stb.eq(1)]
                m.d.sync += ack_wait.eq(ack_wait + 1)
                with m.If(self.ack):
                    m.d.sync += [wait.eq(rd.data[w_adr + 32 :]), ack_wait.eq(0)]
                    m.next = "WAIT"
                with m.Elif(ack_wait == ACK_TIMEOUT - 1):
                    m.next = "ERROR"
            with m.State("WAIT"):
                m.d.sync += wait.eq(wait - 1)
                with m.If(wait == 0):
                    m.d.sync += index.eq(index + 1)
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.next = "WRITE"
                with m.If(index == n):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
            with m.State("ERROR"):
                m.d.comb += self.error.eq(1)
        return m
