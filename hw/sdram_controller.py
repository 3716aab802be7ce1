"""The board's SDRAM behind litedram's controller: its generated Verilog as an Instance,
started by SdramInit, seen through one native user port.

litedram's native port, as its crossbar implements it:
- `cmd`: a stream of (address, read or write);
- `wdata`: one word per write command, in order. litedram takes `wdata_data` in every
  cycle `wdata_ready` is high and never looks at a valid: the word must be there when
  it asks. `wdata_valid` is ours: a cycle of `wdata_ready` without it sets `underrun`
  (sticky), so a user that lets the controller take a missing word is caught;
- `rdata`: one word per read command, in order, in the cycle `rdata_valid` is high; it
  cannot be held off (litedram ignores a ready).
The port is closed until `ready`; `error` says the init program got no answer.

Two variants of the same controller: the simulation's (litedram's PHY model holds the
memory) and the board's (GENSDRPHY on the pins: `pads`, the platform's `sdram` resource
requested raw). On the board, litedram drives the data pins through its own
TRELLIS_IO cells and I/O registers; the SDRAM's clock is ours, the controller's clock
inverted (an ODDRX1F: the chips sample mid-cycle, as litex's targets for this board do
with a clock shifted by 180 degrees).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from amaranth import Cat, ClockSignal, Const, Instance, Module, ResetSignal
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from optireduce.hw.sdram_init import SdramInit, program


def native_port(addr_width: int, data_width: int = 32) -> wiring.Signature:
    """litedram's native port from its user's side (the contract in the module docstring),
    with the controller's `ready` (init done: the port is open)."""
    return wiring.Signature({
        "cmd_valid": Out(1), "cmd_ready": In(1), "cmd_we": Out(1), "cmd_addr": Out(addr_width),
        "wdata_valid": Out(1), "wdata_ready": In(1), "wdata_data": Out(data_width),
        "rdata_valid": In(1), "rdata_data": In(data_width), "ready": In(1),
    })  # fmt: skip


def memory_ports(block: wiring.Component) -> dict[str, str]:
    """A block's SDRAM ports: its members named `<user>_mem`, by the user's name (the
    controller's port of that name)."""
    return {n.removesuffix("_mem"): n for n in block.signature.members if n.endswith("_mem")}


def connect_memory(m: Module, block: wiring.Component, ctrl: SdramController) -> None:
    """Each of `block`'s SDRAM ports to the controller's port of its user's name."""
    for user, member in memory_ports(block).items():
        if user not in ctrl.core.spec.ports:
            raise ValueError(f"{member}: the controller has no port {user!r} "
                             f"({', '.join(ctrl.core.spec.ports)})")  # fmt: skip
        wiring.connect(m, getattr(block, member), getattr(ctrl, user))


@dataclass(frozen=True)
class SdramSpec:
    """One board's SDRAM as litedram's generator is told it."""

    module: str = "M12L16161A"  # 2 x 1M x 16 on the 5A-75B r7.0, one 32-bit bus
    data_width: int = 32
    device: str = "LFE5U-25F-6BG256C"
    clk_mhz: float = 62.5
    ports: tuple[str, ...] = ("acc", "gather")  # native user ports (NicCore's users)
    addr_bits: int = 20  # the native port's: the module's 4 MiB in data_width words


@dataclass(frozen=True)
class SdramCore:
    """What the generator produced: the Verilog, its registers and its init steps."""

    spec: SdramSpec
    sim: bool
    verilog: Path
    csr: dict[str, int]
    init: tuple[tuple[int, ...], ...]
    addr_width: int
    data_width: int
    cl: int
    refresh_pulse: str  # a register of the Verilog that is 1 for one cycle per refresh

    @classmethod
    def from_json(cls, d: dict, root: Path) -> SdramCore:
        spec = SdramSpec(**{**d["spec"], "ports": tuple(d["spec"]["ports"])})
        return cls(**{**d, "spec": spec, "verilog": root / d["verilog"],
                        "init": tuple(tuple(s) for s in d["init"])})  # fmt: skip


# the board variant's pins: litedram's port name -> the amaranth-boards subsignal (the
# 5A-75B r7.0 ties CS, CKE and DQM on the board: they have no pins)
OUTPUT_PINS = {"sdram_a": "a", "sdram_ba": "ba", "sdram_ras_n": "ras", "sdram_cas_n": "cas",
               "sdram_we_n": "we"}  # fmt: skip


class SdramController(wiring.Component):
    """litedram's controller: the simulation variant (no `pads`), or the board's on the
    raw `pads` of the platform's `sdram` resource. One native port per name in the
    spec's `ports`, a member each of that name; `port` is the first. litedram's crossbar
    keeps each port's order (a read behind the same port's earlier write), none across
    ports, so each user keeps its own words. A port nobody drives issues no command."""

    def __init__(self, core: SdramCore, pads: object | None = None) -> None:
        if core.sim != (pads is None):
            raise ValueError("SdramController: the simulation variant has no pins, the "
                             "board's needs the platform's sdram pads")  # fmt: skip
        self.core, self.pads = core, pads
        port = In(native_port(core.addr_width, core.data_width))
        super().__init__({
            **{name: port for name in core.spec.ports}, "error": Out(1), "underrun": Out(1),
        })  # fmt: skip

    @property
    def port(self) -> wiring.PureInterface:
        """The first user port (a block alone on the controller takes it)."""
        return getattr(self, self.core.spec.ports[0])

    def elaborate(self, platform) -> Module:
        m = Module()
        core = self.core
        m.submodules.init = init = SdramInit(program(core.csr, core.init))
        all_bytes = (1 << core.data_width // 8) - 1  # every write is a whole word
        users = {}
        for name in core.spec.ports:
            p, u = f"user_port_{name}", getattr(self, name)
            users |= {f"i_{p}_cmd_valid": u.cmd_valid, f"o_{p}_cmd_ready": u.cmd_ready,
                      f"i_{p}_cmd_we": u.cmd_we, f"i_{p}_cmd_addr": u.cmd_addr,
                      f"i_{p}_wdata_valid": u.wdata_valid, f"o_{p}_wdata_ready": u.wdata_ready,
                      f"i_{p}_wdata_data": u.wdata_data, f"i_{p}_wdata_we": all_bytes,
                      f"o_{p}_rdata_valid": u.rdata_valid, f"i_{p}_rdata_ready": 1,
                      f"o_{p}_rdata_data": u.rdata_data}  # fmt: skip
            m.d.comb += u.ready.eq(init.done)
            with m.If(u.wdata_ready & ~u.wdata_valid):
                m.d.sync += self.underrun.eq(1)
        pins = {} if self.pads is None else self._pins(m)
        m.submodules.litedram = Instance(
            "litedram_core",
            i_clk=ClockSignal("sync"),
            **({"i_sim_trace": 0} if core.sim else {"i_rst": ResetSignal("sync")}),
            **pins,
            i_wb_ctrl_adr=init.adr, i_wb_ctrl_dat_w=init.dat_w, i_wb_ctrl_sel=init.sel,
            i_wb_ctrl_cyc=init.cyc, i_wb_ctrl_stb=init.stb, i_wb_ctrl_we=init.we,
            i_wb_ctrl_cti=0, i_wb_ctrl_bte=0, o_wb_ctrl_ack=init.ack,
            **users,
        )  # fmt: skip
        m.d.comb += self.error.eq(init.error)
        return m

    def _pins(self, m: Module) -> dict:
        """The board variant's pin connections, and the SDRAM's clock."""
        pads, pins = self.pads, {}
        for port, sub in OUTPUT_PINS.items():
            pin = getattr(pads, sub)
            # the raw pin (litedram's *_n are the pin's level: no inversion here), through
            # a plain output buffer that litedram's I/O register packs into
            m.submodules[f"pin_{sub}"] = buf = io.Buffer("o", io.SingleEndedPort(pin.io))
            pins[f"o_{port}"] = buf.o
        pins["io_sdram_dq"] = pads.dq.io  # litedram's own TRELLIS_IO cells drive them
        m.submodules.pin_clk = clk = io.DDRBuffer("o", io.SingleEndedPort(pads.clk.io))
        m.d.comb += clk.o.eq(Cat(Const(0, 1), Const(1, 1)))  # low, then high: inverted
        return pins
