"""The board top: a thin shell around the NIC core (docs/boards.md).

  clk pin -> EHXPLLL -> sync (125 MHz: MACs, host adapter, tick 1 per us)
                     -> core (the board's core clock: the NIC core); both reset until lock
  eth port 0 (host)    <-> RgmiiMac <-> NicShell host_rx/host_tx (HostAdapter, crossings)
  eth port 1 (network) <-> RgmiiMac <-> NicShell net_rx/net_tx (Widen / Narrow, crossings)
                     -> sdram (the SDRAM's clock, boards with `sdram`, when the core keeps
                        its accumulators and gather slots there): NicShell acc_mem,
                        gather_mem <-> SdramController's ports of those names; none
                        when core_div = sdram_div (the controller runs in `core`)

On a board with one Ethernet port both share it: received frames are split by EtherType
(host-port frames, 0x88B5, to the adapter; the rest to the core) and the two senders
take turns a frame at a time (hw/board_frames.py). Each MAC's receiver runs on its PHY's
RX clock (domain `eth<k>_rx`). LEDs show, per port, link (the PHY's RX clock is running)
and activity (a frame in either direction in the last ~30 ms).

A board (hw/board_colorlight.py, hw/board_ecpix5.py, hw/board_butterstick.py) is a
`Board`: its amaranth-boards platform, PLL dividers, Ethernet resources, LEDs and the
NicParams chosen to fit it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth import ClockDomain, DomainRenamer, Elaboratable, Instance, Module, Signal
from amaranth.lib import io, wiring
from amaranth.lib.cdc import AsyncFFSynchronizer, FFSynchronizer, ResetSynchronizer

from optireduce.hw.board_frames import EtherTypeDemux, FrameMux
from optireduce.hw.nic_shell import SDRAM_DOMAIN, NicShell
from optireduce.hw.rgmii_mac import RgmiiMac
from optireduce.hw.sdram_controller import (
    SdramController,
    SdramCore,
    SdramSpec,
    connect_memory,
)
from optireduce.params import NicParams

SYNC_MHZ = 125  # one byte per cycle on the RGMII side is 1 Gb/s
PHY_RESET_BITS = 20  # PHYs held in reset for 2^20 cycles (8.4 ms) after the PLL locks
ACTIVITY_BITS = 22  # activity LEDs stay on 2^22 cycles (34 ms) after a frame


class NoProgrammer:
    """Mixed into an amaranth-boards platform ahead of it: builds need no programmer
    (openFPGALoader is only for flashing, docs/boards.md)."""

    @property
    def required_tools(self):
        return [t for t in super().required_tools if t != "openFPGALoader"]


@dataclass(frozen=True)
class Board:
    """What a board module declares. `pll` = (CLKI_DIV, CLKFB_DIV, CLKOP_DIV) from
    `yowasp-ecppll -i <clk MHz> -o 125 --clkout1 <core MHz>`; `eth` = eth_rgmii resource
    numbers, host port first (one entry: host and network share it);
    `leds(platform, m, status)` drives the LEDs from status = {"link": [per port],
    "activity": [per port], "locked": Signal, "fault": an SDRAM fault (the controller's
    error or underrun, the core's `sdram_fault`)}.
    `core_div`: the PLL's CLKOS divider, core clock = VCO / core_div (VCO = 125 MHz x
    CLKOP_DIV), chosen below the core's measured Fmax (docs/boards.md, "Clocks").
    `reset_dccs`: (domain, the nextpnr BEL of its reset's DCCA) pairs, where the placer's
    own choice cannot be routed (docs/boards.md, "The reset DCCs"); none: the placer's."""

    name: str
    platform: Callable[[], object]
    params: NicParams
    pll: tuple[int, int, int]
    eth: tuple[int, ...]
    leds: Callable[[object, Module, dict], None]
    description: str = ""
    core_div: int = 12  # 52.08 MHz
    reset_dccs: tuple[tuple[str, str], ...] = ()
    # the board's SDRAM as litedram's generator is told it, and the PLL's CLKOS2 divider
    # for its clock (VCO / sdram_div = sdram.clk_mhz); None: no SDRAM
    sdram: SdramSpec | None = None
    sdram_div: int = 10  # 62.5 MHz
    sdram_c: int = 0  # C of the build with the SDRAM (`build bitstream --sdram`); 0: params.c

    @property
    def sdram_mhz(self) -> float:
        return SYNC_MHZ * self.pll[2] / self.sdram_div

    @property
    def core_mhz(self) -> float:
        return SYNC_MHZ * self.pll[2] / self.core_div


def rgmii_pads(pads) -> SimpleNamespace:
    """The subsignals RgmiiDdrBuffers uses, whatever the platform calls CTL (ECPIX-5: ctrl)."""
    return SimpleNamespace(
        tx_clk=pads.tx_clk,
        tx_ctl=getattr(pads, "tx_ctl", None) or pads.tx_ctrl,
        tx_data=pads.tx_data,
        rx_ctl=getattr(pads, "rx_ctl", None) or pads.rx_ctrl,
        rx_data=pads.rx_data,
    )


class BoardTop(Elaboratable):
    """The top of `board`; `core` builds the core from NicParams (default: NicCore).
    `sdram`: the board variant of the board's SDRAM controller, generated (its Verilog
    goes into the build), for a core with its accumulators there (the params'
    sdram_addr_bits)."""

    def __init__(
        self,
        board: Board,
        core: Callable[[NicParams], wiring.Component] | None = None,
        sdram: SdramCore | None = None,
    ):
        self.board = board
        self.core = core  # None: NicCore (NicShell)
        p = board.params
        if p.sdram_addr_bits and (sdram is None or board.sdram is None):
            raise ValueError(f"{board.name}: a core with its accumulators in SDRAM needs the "
                             "board's SDRAM and its generated controller")  # fmt: skip
        if sdram is not None and (sdram.sim or sdram.addr_width != p.sdram_addr_bits):
            raise ValueError(f"{board.name}: the controller is not the board's for "
                             f"sdram_addr_bits={p.sdram_addr_bits}")  # fmt: skip
        self.sdram = sdram

    @staticmethod
    def _global_reset(m: Module, cd: ClockDomain, arst, bel: str | None = None) -> None:
        """`cd`'s reset, synchronized from `arst`, through a DCCA onto a global network: it
        reaches every register of the domain (thousands of LSR pins), which fabric
        routing did in 8.7 ns, more than a 125 MHz cycle (docs/boards.md, "Clocks")."""
        raw = Signal(name=f"{cd.name}_rst_raw")
        m.submodules[f"rst_{cd.name}"] = AsyncFFSynchronizer(arst, raw, o_domain=cd.name)
        at = {"a_BEL": bel} if bel else {}
        m.submodules[f"rst_{cd.name}_dcc"] = Instance(
            "DCCA", i_CLKI=raw, i_CE=1, o_CLKO=cd.rst, **at
        )

    def elaborate(self, platform):
        m = Module()
        b = self.board
        p = b.params

        # ---- clocks: PLL to 125 MHz, reset until locked ---------------------------------
        clk_in = platform.request(platform.default_clk, dir="i").i
        f_in = platform.default_clk_frequency
        clki_div, clkfb_div, clkop_div = b.pll
        cphase = 2  # phase 0 for every output (yowasp-ecppll); the domains are unrelated
        f_out = f_in * clkfb_div / clki_div
        if abs(f_out - SYNC_MHZ * 1e6) > 1e3:
            raise ValueError(f"{b.name}: PLL gives {f_out / 1e6:.3f} MHz, not {SYNC_MHZ}")
        locked = Signal()
        m.domains.sync = cd_sync = ClockDomain("sync")
        m.domains.core = cd_core = ClockDomain("core")
        cd_sdram, sdram_domain = None, SDRAM_DOMAIN
        if self.sdram is not None:
            if abs(b.sdram_mhz - b.sdram.clk_mhz) > 1e-3:
                raise ValueError(f"{b.name}: sdram_div gives {b.sdram_mhz} MHz, the "
                                 f"controller was generated for {b.sdram.clk_mhz}")  # fmt: skip
            if b.core_div == b.sdram_div:  # one clock: the controller runs in the core's
                sdram_domain = "core"
            else:
                m.domains.sdram = cd_sdram = ClockDomain(SDRAM_DOMAIN)
        sdram_out = {} if cd_sdram is None else {
            "a_FREQUENCY_PIN_CLKOS2": f"{b.sdram_mhz:.4f}", "p_CLKOS2_ENABLE": "ENABLED",
            "p_CLKOS2_DIV": b.sdram_div, "p_CLKOS2_CPHASE": cphase, "p_CLKOS2_FPHASE": 0,
            "o_CLKOS2": cd_sdram.clk,
        }  # fmt: skip
        clk_pll = cd_sync.clk
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{f_in / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=f"{SYNC_MHZ}",
            a_FREQUENCY_PIN_CLKOS=f"{b.core_mhz:.4f}",
            a_ICP_CURRENT="12",
            a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED",
            p_INTFB_WAKE="DISABLED",
            p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED",
            p_OUTDIVIDER_MUXA="DIVA",
            p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=clki_div,
            p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=clkop_div,
            p_CLKOP_CPHASE=cphase,
            p_CLKOP_FPHASE=0,
            p_CLKOS_ENABLE="ENABLED",
            p_CLKOS_DIV=b.core_div,
            p_CLKOS_CPHASE=cphase,
            p_CLKOS_FPHASE=0,
            p_FEEDBK_PATH="CLKOP",
            p_CLKFB_DIV=clkfb_div,
            i_RST=0,
            i_STDBY=0,
            i_CLKI=clk_in,
            o_CLKOP=clk_pll,
            o_CLKOS=cd_core.clk,
            i_CLKFB=clk_pll,
            i_PHASESEL0=0,
            i_PHASESEL1=0,
            i_PHASEDIR=1,
            i_PHASESTEP=1,
            i_PHASELOADREG=1,
            i_PLLWAKESYNC=0,
            i_ENCLKOP=0,
            p_OUTDIVIDER_MUXC="DIVC",
            o_LOCK=locked,
            **sdram_out,
        )
        # nextpnr derives the constraints of both outputs from the PLL; the PHY clocks:
        # lpf_preferences
        for cd in (cd_sync, cd_core):
            self._global_reset(m, cd, ~locked, dict(b.reset_dccs).get(cd.name))
        if cd_sdram is not None:  # the controller and the store: a few hundred registers
            m.submodules.rst_sdram = ResetSynchronizer(~locked, domain=SDRAM_DOMAIN)

        # ---- the microsecond tick ---------------------------------------------------------
        tick = Signal()
        div = Signal(range(SYNC_MHZ))
        m.d.sync += [div.eq(div + 1), tick.eq(div == SYNC_MHZ - 1)]
        with m.If(div == SYNC_MHZ - 1):
            m.d.sync += div.eq(0)

        # ---- PHY reset --------------------------------------------------------------------
        phy_wait = Signal(PHY_RESET_BITS + 1)
        with m.If(~phy_wait[-1]):
            m.d.sync += phy_wait.eq(phy_wait + 1)
        phy_in_reset = ~phy_wait[-1]

        # ---- MACs ---------------------------------------------------------------------------
        macs = []
        links, acts = [], []
        for k, number in enumerate(b.eth):
            pads = platform.request("eth_rgmii", number, dir="-")
            dom = f"eth{k}_rx"
            m.domains += (cd := ClockDomain(dom))
            m.submodules[f"eth{k}_rx_clk"] = rx_clk = io.Buffer("i", pads.rx_clk)
            m.d.comb += cd.clk.eq(rx_clk.i)
            m.submodules[f"eth{k}_rx_rst"] = ResetSynchronizer(phy_in_reset, domain=dom)
            if hasattr(pads, "rst"):  # PHYs that share a reset pin list it on one port only
                m.submodules[f"eth{k}_phy_rst"] = phy_rst = io.Buffer("o", pads.rst)
                m.d.comb += phy_rst.o.eq(phy_in_reset)
            mac = RgmiiMac(p, pads=rgmii_pads(pads), rx_domain=dom)
            m.submodules[f"eth{k}_mac"] = mac
            # (received frames leave the MAC's crossing from a registered skid: its FIFO
            # flags and the demux / adapter logic never share a path at 125 MHz)
            macs.append((mac.o, mac.i))
            links.append(self._clock_alive(m, dom, k))
            acts.append(self._activity(m, mac, k))

        # ---- the shell: host adapter, crossings, the core in `core` ------------------------
        m.submodules.shell = shell = NicShell(p, self.core, sdram_domain=sdram_domain)
        m.d.comb += shell.tick.eq(tick)
        fault = Signal()  # the SDRAM's init unanswered, a write word missing, a read word lost
        if self.sdram is not None:
            pads = platform.request("sdram", 0, dir="-")
            ctrl = SdramController(self.sdram, pads)
            m.submodules.sdram = DomainRenamer({"sync": sdram_domain})(ctrl)
            connect_memory(m, shell, ctrl)
            m.submodules.sdram_fault = FFSynchronizer(
                ctrl.error | ctrl.underrun | shell.sdram_fault, fault
            )
        if len(macs) == 2:
            (host_rx, host_tx), (net_rx, net_tx) = macs
            wiring.connect(m, host_rx, shell.host_rx)
            wiring.connect(m, shell.host_tx, host_tx)
            wiring.connect(m, net_rx, shell.net_rx)
            wiring.connect(m, shell.net_tx, net_tx)
        else:
            ((mac_rx, mac_tx),) = macs
            m.submodules.demux = demux = EtherTypeDemux()
            m.submodules.tx_mux = tx_mux = FrameMux()
            wiring.connect(m, mac_rx, demux.i)
            wiring.connect(m, demux.host, shell.host_rx)
            wiring.connect(m, demux.net, shell.net_rx)
            wiring.connect(m, shell.host_tx, tx_mux.a)
            wiring.connect(m, shell.net_tx, tx_mux.b)
            wiring.connect(m, tx_mux.o, mac_tx)

        b.leds(platform, m, {"link": links, "activity": acts, "locked": locked, "fault": fault})
        return m

    def lpf_preferences(self) -> str:
        """LPF lines for the PHY RX clocks, constrained at their pins (net names do not
        survive synthesis; the sync constraint is derived from the PLL by nextpnr)."""
        return "\n".join(
            f'FREQUENCY PORT "eth_rgmii_{n}__rx_clk__io" {SYNC_MHZ} MHZ;' for n in self.board.eth
        )

    @staticmethod
    def _clock_alive(m: Module, dom: str, k: int) -> Signal:
        """High while the PHY's RX clock runs: its divided toggle keeps changing in sync."""
        slow = Signal(8, name=f"eth{k}_rx_div")
        m.d[dom] += slow.eq(slow + 1)
        seen = Signal(name=f"eth{k}_rx_msb")
        m.submodules[f"eth{k}_alive_sync"] = FFSynchronizer(slow[-1], seen)
        prev = Signal(name=f"eth{k}_rx_prev")
        quiet = Signal(12, name=f"eth{k}_quiet")  # 4096 sync cycles >> 256 rx cycles
        m.d.sync += prev.eq(seen)
        with m.If(seen != prev):
            m.d.sync += quiet.eq(0)
        with m.Elif(~quiet[-1]):
            m.d.sync += quiet.eq(quiet + 1)
        return ~quiet[-1]

    @staticmethod
    def _activity(m: Module, mac: RgmiiMac, k: int) -> Signal:
        hold = Signal(ACTIVITY_BITS, name=f"eth{k}_act")
        beat = Signal(name=f"eth{k}_beat")  # registered: the streams' handshakes stay local
        m.d.sync += beat.eq((mac.o.valid & mac.o.ready) | (mac.i.valid & mac.i.ready))
        with m.If(beat):
            m.d.sync += hold.eq(~0)
        with m.Elif(hold != 0):
            m.d.sync += hold.eq(hold - 1)
        return hold != 0
