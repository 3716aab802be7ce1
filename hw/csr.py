"""Control/status register bank: configuration registers and the NIC's counters.

Everything the driver sees comes from ONE table, `register_map(p)`, built from the
lists below (parameters, configuration, counters = optireduce/counters.py COUNTERS,
then host/model/nic_model.py EXP_COUNTERS) and optireduce/host_port.py's
ADAPTER_COUNTERS (the host adapter's block). The gateware, the Markdown map in
docs/registers.md (`render_markdown`) and the driver's discovery (`walk`) all read it.

Layout, in the style of Corundum register blocks: each block starts with a header

    +0x00 type   +0x04 version   +0x08 next block (byte offset, 0 = last)   +0x0C block word

so the driver follows the chain from offset 0 and learns which blocks the hardware
has and where. Four blocks: "nic" (control, build parameters, configuration),
"counters" (one 32-bit counter per event; its +0x0C word is the number of counters),
"peers" (admission) and "host" (the host adapter's frame counters: the bank counts the
adapter's `adapter_counts` strobes, which a board's shell brings over from the 125 MHz
side; a core without an adapter, as in co-simulation, reads 0).

Bus (single master): byte address `addr` (bits [1:0] ignored), `w_en` writes `w_data`
at the clock edge; `r_en` starts a read, and `r_valid` strobes for one cycle when its
`r_data` is there, which then holds until the next read. A read of any register but a
counter takes one cycle, a counter's up to one round of the counters' sequencer (below:
at most `Csr.MAX_READ_CYCLES`). One read at a time: an `r_en` while a read waits
replaces it. Unmapped addresses read 0; writes to read-only registers or unmapped
addresses are ignored. A register narrower than 32 bits keeps only its low
bits; the driver validates values with NicParams before writing.

Counters: one `inc_<name>` strobe per counter adds 1 per cycle it is high
(`exp_missing` adds its port's value: up to n_max - 1 a cycle). They
saturate at 2^32 - 1 and never wrap (a saturated counter reads all ones). Writing 1
to CTRL bit 0 clears every counter; an increment in that same cycle is kept (the
counter becomes 1), so no event is ever lost by a clear.

Counter storage. 37 registers of 32 bits, each with its own saturating adder and a
37-way read mux, were the largest block of the core (5 800 LUTs on the ECP5). The
32-bit values live in LUT RAM instead: each counter keeps only a small `pending` count
of its increments since its last visit, and a sequencer visits one counter per cycle,
round robin, adding its pending count into the RAM word (read, add, saturate, write:
one cycle). A read of a counter waits for the counter's visit and returns the value the
visit writes, sat(word + pending): the counter's value in that cycle, as its register
gave it. (A read in its own cycle needed a second read port on the RAM, a second
saturating adder and a second pending-count select: 541 LUTs of the 25F, packed.) A
clear (and a reset: the RAM has none) sets a `cleared` flag per counter, the stale word
is then ignored, and the next visit writes the pending count alone.
Pending counts are wide enough for one round: n_counters x the counter's step.

Reads. Every register but the counters is read from one block RAM image of the map
(a read mux over every configuration register and constant was about 470 LUTs of the
25F): its high half holds the reset values, constants and zeros (write-only and unmapped
words), its low half the same, and a configuration write goes to the low half as well as
to the register, masked to the register's width. A register written since reset reads
from the low half, one not written from the high half (a `written` bit per
configuration register), so a reset that leaves the RAM as it was still reads the reset
values. The RAM's read port has a latency of one cycle; `r_data` shows its output or
the counter value a read took (before the first read it is the RAM's output register:
undefined, not 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth import Array, Cat, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce import ubt
from optireduce.counters import COUNTERS
from optireduce.frame_checks import ADMISSION_REASONS, default_peers
from optireduce.host.model.nic_model import EXP_COUNTERS, NicModel
from optireduce.host_port import ADAPTER_COUNTER_DOC, ADAPTER_COUNTERS
from optireduce.hw.block_ram import block_ram, read_port
from optireduce.params import NicParams
from optireduce.ubt import DEFAULT_ADDRESSING

# 1.1: t_c_min_us, t_c_init_us; 1.2: padded host frames taken; 1.3: the host block;
# 1.4: param_tick_bits (the clock's width, and t_b_us's); the build's job id, port,
# addresses and estimator read only (BUILD_VALUES)
VERSION = 0x0001_0004  # major in the high half
TYPE_NIC = 0x4F52_0001  # "OR" 0001
TYPE_COUNTERS = 0x4F52_0002
TYPE_PEERS = 0x4F52_0003
TYPE_HOST = 0x4F52_0004
NIC_BASE, COUNTER_BASE, PEERS_BASE = 0x000, 0x100, 0x200
FIRST_COUNTER = COUNTER_BASE + 0x10  # counter j is at FIRST_COUNTER + 4 * j
CTRL_CLEAR_COUNTERS = 1  # CTRL bit 0

# Build parameters (read only): name, value from NicParams, description.
PARAMS: tuple[tuple[str, Callable[[NicParams], int], str], ...] = (
    ("p", lambda p: p.p, "elements per packet P"),
    ("b", lambda p: p.b, "Hadamard block B"),
    ("c", lambda p: p.c, "elements per op (chunk capacity C)"),
    ("n_max", lambda p: p.n_max, "largest world size"),
    ("lanes", lambda p: p.lanes, "elements per cycle"),
    ("ops_in_flight", lambda p: p.ops_in_flight, "ops in flight K"),
    ("w_wire", lambda p: p.w_wire, "bits of a wire element"),
    ("tick_bits", lambda p: p.tick_bits, "bits of the microsecond clock (t_B < 2^(bits-4))"),
)

# Configuration (read/write): register name, output port, lsb of the port, width(p),
# reset(p, addressing), description. A port wider than 32 bits spans several registers.
CONFIG: tuple[tuple[str, str, int, Callable, Callable, str], ...] = (
    ("rank", "rank", 0, lambda p: (p.n_max - 1).bit_length(), lambda p, a: 0,
     "this NIC's rank, 0..world-1"),
    ("world", "world", 0, lambda p: p.n_max.bit_length(), lambda p, a: 2, "world size N, 2..n_max"),
    ("job_id", "job_id", 0, lambda p: 16, lambda p, a: p.job_id, "job id of the UBT header"),
    ("udp_port", "udp_port", 0, lambda p: 16, lambda p, a: p.udp_port, "UDP port of the job"),
    ("t_b_us", "t_b_us", 0, lambda p: p.t_b_bits, lambda p, a: p.t_b_us,
     "hard phase bound t_B, us (1..2^(tick_bits-4)-1)"),
    ("alpha_q8", "alpha_q8", 0, lambda p: 9, lambda p, a: p.alpha_q8,
     "early-timeout gap alpha, 1/256 units (1..256)"),
    ("seed", "seed", 0, lambda p: 32, lambda p, a: p.seed, "sign PRNG key"),
    ("mac_base_lo", "mac_base", 0, lambda p: 32,
     lambda p, a: a.mac_base & 0xFFFF_FFFF, "MAC of rank 0, bits 31:0"),
    ("mac_base_hi", "mac_base", 32, lambda p: 16,
     lambda p, a: a.mac_base >> 32, "MAC of rank 0, bits 47:32"),
    ("ip_base", "ip_base", 0, lambda p: 32, lambda p, a: a.ip_base,
     "IPv4 of rank r is ip_base + r + 1"),
    ("estimator", "estimator", 0, lambda p: 1, lambda p, a: int(p.estimator == "plain"),
     "decode estimator: 0 unbiased, 1 plain"),
    ("t_c_min_us", "t_c_min_us", 0, lambda p: p.t_b_bits, lambda p, a: p.t_c_min_us,
     "floor of t_C, us (1..t_b_us)"),
    ("t_c_init_us", "t_c_init_us", 0, lambda p: p.t_b_bits, lambda p, a: p.t_c_init,
     "t_C before any phase completed, us; a new value restarts both estimators from it"),
)  # fmt: skip

# Configuration the gateware takes from its build (NicParams, ubt.DEFAULT_ADDRESSING), not
# from the register: it reads the build's value and ignores writes, so that a job whose
# value differs is refused (host/board_nic.py: identify) instead of dropping every frame
BUILD_VALUES = frozenset({"job_id", "udp_port", "mac_base_lo", "mac_base_hi", "ip_base",
                          "estimator"})  # fmt: skip

ALL_COUNTERS = (*COUNTERS, *EXP_COUNTERS, *ADMISSION_REASONS)  # the counters block, in order
# the host block's counters, kept in the same storage after ALL_COUNTERS
HOST_COUNTERS = tuple(f"adapter_{name}" for name in ADAPTER_COUNTERS)

_COUNTER_DOC = {
    "rx_scatter": "scatter packets accepted",
    "rx_gather": "gather packets accepted",
    "tx_scatter": "scatter packets sent",
    "tx_gather": "gather packets sent",
    "ops_started": "ops started by the host",
    "ops_completed": "ops completed",
    "exp_given": "ops started with the host's exponent",
    "exp_inband": "ops agreed in-band, every peer's proposal in",
    "exp_incomplete": "ops agreed in-band, some peer's proposal missing",
    "exp_followed": "in-band ops that took the exponent peers ahead sent",
    "exp_missing": "peers' proposals missing at in-band starts, summed",
    "exp_saturated": "in-band ops whose quantizer saturated",
    "not_member": "frames dropped: source not in the peer table (admission on)",
    "wrong_sender": "frames dropped: sender field not the source peer's rank (admission on)",
}


def counter_step(p: NicParams, name: str) -> int:
    """The most a counter adds in one cycle (the width of its `inc_` port)."""
    return p.n_max - 1 if name == "exp_missing" else 1


@dataclass(frozen=True)
class Reg:
    name: str
    offset: int  # byte offset from the bank's base
    access: str  # "RO", "RW" or "WO" (write-only command bits, read 0)
    width: int  # bits held (the rest read 0)
    reset: int  # value after reset (RO: the constant, counters: 0)
    kind: str  # "header", "ctrl", "param", "config", "counter", "adapter" (the host block's)
    desc: str
    port: str = ""  # config: output port; counter: the counter's name
    lsb: int = 0  # config: lowest port bit this register holds


@dataclass(frozen=True)
class Block:
    name: str
    base: int
    type_id: int
    desc: str
    regs: tuple[Reg, ...]


def _header(base: int, type_id: int, nxt: int) -> list[Reg]:
    return [
        Reg("type", base + 0x0, "RO", 32, type_id, "header", "block type"),
        Reg("version", base + 0x4, "RO", 32, VERSION, "header", "block version (major.minor)"),
        Reg("next", base + 0x8, "RO", 32, nxt, "header", "byte offset of the next block, 0: last"),
    ]


def host_block_base(p: NicParams) -> int:
    """The host block's offset: the first 256-byte boundary after the peer table (which
    grows with n_max)."""
    return (PEERS_BASE + 0x10 + 8 * p.n_max + 0xFF) & ~0xFF


def register_map(
    p: NicParams, addressing: ubt.Addressing = DEFAULT_ADDRESSING
) -> tuple[Block, ...]:
    """The register table: every block and register, with offsets, access and reset values
    (the address registers give `addressing`, the build's)."""
    nic = _header(NIC_BASE, TYPE_NIC, COUNTER_BASE)
    nic.append(
        Reg("ctrl", NIC_BASE + 0xC, "WO", 1, 0, "ctrl", "bit 0: write 1 to clear all counters")
    )
    for j, (name, value, desc) in enumerate(PARAMS):
        nic.append(Reg(f"param_{name}", NIC_BASE + 0x10 + 4 * j, "RO", 32, value(p), "param", desc))
    for j, (name, port, lsb, width, reset, desc) in enumerate(CONFIG):
        off = NIC_BASE + 0x40 + 4 * j
        if name in BUILD_VALUES:  # the gateware takes these from its build: read only
            value = reset(p, addressing)
            nic.append(Reg(name, off, "RO", width(p), value, "param", f"{desc} (the build's)"))
        else:
            nic.append(Reg(name, off, "RW", width(p), reset(p, addressing), "config", desc, port,
                           lsb))  # fmt: skip
    cnt = _header(COUNTER_BASE, TYPE_COUNTERS, PEERS_BASE)
    cnt.append(Reg("count", COUNTER_BASE + 0xC, "RO", 32, len(ALL_COUNTERS), "header", "counters"))
    for j, name in enumerate(ALL_COUNTERS):
        desc = _COUNTER_DOC.get(name, f"frames dropped: {name.replace('_', ' ')}")
        cnt.append(Reg(name, FIRST_COUNTER + 4 * j, "RO", 32, 0, "counter", desc, port=name))
    host_base = host_block_base(p)
    peers = _header(PEERS_BASE, TYPE_PEERS, host_base)
    peers.append(Reg("admit", PEERS_BASE + 0xC, "RW", 1, 0, "config",
                     "1: admit only frames from the peers below (frame_checks.admit)",
                     "admit"))  # fmt: skip
    for r, (ip, port) in enumerate(default_peers(p, p.n_max)):
        base = PEERS_BASE + 0x10 + 8 * r
        peers += [
            Reg(f"peer_ip{r}", base, "RW", 32, ip, "config", f"IPv4 of rank {r}",
                "peer_ip", 32 * r),
            Reg(f"peer_port{r}", base + 4, "RW", 16, port, "config", f"UDP port of rank {r}",
                "peer_port", 16 * r),
        ]  # fmt: skip
    host = _header(host_base, TYPE_HOST, 0)
    host.append(Reg("count", host_base + 0xC, "RO", 32, len(ADAPTER_COUNTERS), "header",
                    "counters"))  # fmt: skip
    for j, name in enumerate(ADAPTER_COUNTERS):
        host.append(Reg(f"adapter_{name}", host_base + 0x10 + 4 * j, "RO", 32, 0, "adapter",
                        ADAPTER_COUNTER_DOC[name], port=name))  # fmt: skip
    assert max(r.offset for r in nic) < COUNTER_BASE, "nic block overlaps the counters"
    assert max(r.offset for r in cnt) < PEERS_BASE, "counters block overlaps the peers"
    assert max(r.offset for r in peers) < host_base, "peers block overlaps the host block"
    return (
        Block("nic", NIC_BASE, TYPE_NIC, "control, build parameters, configuration", tuple(nic)),
        Block("counters", COUNTER_BASE, TYPE_COUNTERS, "event counters, saturating", tuple(cnt)),
        Block("peers", PEERS_BASE, TYPE_PEERS, "admission: the job's peers by rank", tuple(peers)),
        Block("host", host_base, TYPE_HOST,
              "the host adapter's frame counters, saturating, counted in this bank from the "
              "adapter's strobes (a core without one, as in co-simulation, reads 0); `ctrl` "
              "bit 0 clears them too", tuple(host)),
    )  # fmt: skip


def config_ports(p: NicParams) -> dict[str, int]:
    """Output port name -> width, from the configuration registers."""
    ports: dict[str, int] = {}
    for blk in register_map(p):
        for r in blk.regs:
            if r.kind == "config":
                ports[r.port] = max(ports.get(r.port, 0), r.lsb + r.width)
    return ports


def walk(read: Callable[[int], int]) -> list[tuple[int, int, int]]:
    """Driver-side discovery: follow the block chain from 0 with `read(byte_offset)`.

    Returns (base, type, version) per block found.
    """
    found, base = [], 0
    for _ in range(64):  # a broken chain must not loop forever
        found.append((base, read(base), read(base + 4)))
        base = read(base + 8)
        if base == 0:
            return found
    raise RuntimeError("register block chain does not end")


def render_markdown(p: NicParams | None = None) -> str:
    """The register map as Markdown: docs/registers.md is this text for NicParams()."""
    p = p or NicParams()
    out = [
        "# Register map",
        "",
        "Generated by `hw/csr.py: render_markdown()` from the one table `register_map()`;",
        "`tests/hw/test_csr.py` checks that this file equals it. Reset values are those of",
        "the default `NicParams()`.",
        "",
        "Bus: byte addresses, 32-bit registers; `r_data` is valid when `r_valid` strobes:",
        "the cycle after `r_en`, or for a counter within one round of the counters.",
        "Unmapped addresses read 0 and ignore writes. Counters saturate at 0xFFFFFFFF and",
        "never wrap; writing 1 to `ctrl` bit 0 clears them all. Each block starts with",
        "type, version and the offset of the next block (0: last), so the driver discovers",
        "the blocks by following the chain from offset 0.",
        "",
    ]
    for blk in register_map(p):
        out += [
            f"## Block `{blk.name}` at 0x{blk.base:03X}: type 0x{blk.type_id:08X}",
            "",
            blk.desc[0].upper() + blk.desc[1:] + ".",
            "",
            "| offset | name | access | bits | reset | description |",
            "|-------:|------|--------|-----:|------:|-------------|",
        ]
        for r in blk.regs:
            out.append(
                f"| 0x{r.offset:03X} | `{r.name}` | {r.access} | {r.width} | "
                f"0x{r.reset:X} | {r.desc} |"
            )
        out.append("")
    return "\n".join(out)


def addr_bits(p: NicParams) -> int:
    """Width of the bank's word address (its highest register's offset)."""
    return max(r.offset for blk in register_map(p) for r in blk.regs).bit_length()


def register(p: NicParams, name: str) -> Reg:
    """The register called `name` in the map (its offset, reset value, ...)."""
    return next(r for blk in register_map(p) for r in blk.regs if r.name == name)


class Csr(wiring.Component):
    """The register bank. Ports: the bus (one access a cycle: `w_en` and `r_en` are never
    high together; a read in a write's cycle is undefined), one output per
    configuration field, one `inc_<counter>` strobe per counter (see the module
    docstring)."""

    MODEL = NicModel  # its counters, and NicParams for the configuration
    # r_en to r_valid at most: a counter's read waits for its visit (one per counter)
    MAX_READ_CYCLES = len(ALL_COUNTERS) + len(HOST_COUNTERS)

    def __init__(self, p: NicParams, addressing: ubt.Addressing = DEFAULT_ADDRESSING) -> None:
        self.p = p
        self.blocks = register_map(p, addressing)
        self.regs = [r for blk in self.blocks for r in blk.regs]
        self.addr_bits = addr_bits(p)
        members = {
            "addr": In(self.addr_bits),
            "w_en": In(1),
            "w_data": In(32),
            "r_en": In(1),
            "r_data": Out(32),
            "r_valid": Out(1),
        }
        for port, width in config_ports(p).items():
            members[port] = Out(width)
        for name in ALL_COUNTERS:
            members[f"inc_{name}"] = In(range(counter_step(p, name) + 1))
        for name in HOST_COUNTERS:
            members[f"inc_{name}"] = In(1)
        super().__init__(members)
        # The storage, as attributes so tests can preload a counter near saturation.
        self.config_regs = {
            r.name: Signal(r.width, init=r.reset, name=f"cfg_{r.name}")
            for r in self.regs
            if r.kind == "config"
        }
        # a round's worth of the most the port can carry (not only the nominal step)
        self.counted = (*ALL_COUNTERS, *HOST_COUNTERS)  # the storage's order
        n = len(self.counted)
        self.pending = [
            Signal(range(n * ((1 << len(getattr(self, f"inc_{name}"))) - 1) + 1),
                   name=f"pend_{name}")
            for name in self.counted
        ]  # fmt: skip
        self.store: Memory | None = None  # flushed values, by `counted` index (elaborate)

    def elaborate(self, platform):
        m = Module()
        word = self.addr[2:]

        clear = Signal()
        for r in self.regs:
            if r.kind == "ctrl":
                m.d.comb += clear.eq(self.w_en & (word == r.offset >> 2) & self.w_data[0])

        for r in self.regs:
            if r.kind == "config":
                reg = self.config_regs[r.name]
                with m.If(self.w_en & (word == r.offset >> 2)):
                    m.d.sync += reg.eq(self.w_data[: r.width])
                m.d.comb += getattr(self, r.port)[r.lsb : r.lsb + r.width].eq(reg)

        visit = self._counters(m, clear)
        self._reads(m, word, visit, platform)
        return m

    def _reads(self, m: Module, word: Value, visit: SimpleNamespace, platform) -> None:
        """Reads (module docstring, "Reads"): counters from their storage, everything
        else from the block RAM image, whose configuration words follow the writes."""
        config = [r for r in self.regs if r.kind == "config"]
        words = 1 << len(word)
        image = [0] * words
        for r in self.regs:
            if r.kind not in ("counter", "adapter", "ctrl"):
                image[r.offset >> 2] = r.reset
        # written words in the low half, the reset image in the high half
        # one bus access a cycle: a read and a write of the image never share one
        m.submodules.image = mem = block_ram(shape=32, depth=2 * words, init=image + image)
        wr = mem.write_port()
        rd = read_port(m, mem, (wr,), platform=platform)
        # a signal, not an expression: the mask below takes each of its bits, and the
        # simulator would evaluate every compare for every bit (300 times slower)
        hit = Signal(len(config))
        m.d.comb += hit.eq(Cat(word == r.offset >> 2 for r in config))
        written = Signal(len(config))  # since reset: the low half's word is the register's
        with m.If(self.w_en):
            m.d.sync += written.eq(written | hit)
        # a register keeps its low `width` bits: bit i of a write is kept by the wider ones
        kept = Cat(Cat(h for h, r in zip(hit, config, strict=True) if r.width > i).any()
                   for i in range(32))  # fmt: skip
        m.d.comb += [
            wr.en.eq(self.w_en & hit.any()),
            wr.addr.eq(word),
            wr.data.eq(self.w_data & kept),
            rd.en.eq(self.r_en),
            rd.addr.eq(Cat(word, ~(hit & written).any())),
        ]
        # a counter's read takes the value its visit writes (now, or when the visit comes)
        counted = Signal()  # the last read was a counter's
        waiting, want = Signal(), Signal.like(visit.index)
        held = Signal(32)
        is_counter, index = self._is_counter(word), self._counter_index(word)
        take = Mux(self.r_en, is_counter & (visit.index == index),
                   waiting & (visit.index == want))  # fmt: skip
        with m.If(self.r_en):
            m.d.sync += [counted.eq(is_counter), want.eq(index)]
        m.d.sync += [
            waiting.eq(Mux(self.r_en, is_counter, waiting) & ~take),
            self.r_valid.eq((self.r_en & ~is_counter) | take),
        ]
        with m.If(take):
            m.d.sync += held.eq(visit.value)
        m.d.comb += self.r_data.eq(Mux(counted, held, rd.data))

    def _counter_runs(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(first word, count) of the counters block's counters and the host block's."""
        host_first = (host_block_base(self.p) + 0x10) >> 2  # the host block's first counter
        return (FIRST_COUNTER >> 2, len(ALL_COUNTERS)), (host_first, len(HOST_COUNTERS))

    def _is_counter(self, word: Value) -> Value:
        """Whether `word` addresses a counter: the two blocks' runs of words."""
        return Cat((word >= a) & (word < a + n) for a, n in self._counter_runs()).any()

    def _counter_index(self, word: Value) -> Value:
        """The storage index of the counter at `word` (out of range: don't care)."""
        (first, _), (host_first, _) = self._counter_runs()
        in_host = word >= host_first
        return Mux(in_host, word - host_first + len(ALL_COUNTERS), word - first)

    def _counters(self, m: Module, clear: Value) -> SimpleNamespace:
        """The counter bank (module docstring, "Counter storage"): returns the visit of
        this cycle, its counter's `index` and the `value` it writes."""
        n = len(self.counted)
        # made here, so the bank can be elaborated more than once; tests preload it
        m.submodules.store = store = self.store = Memory(shape=32, depth=n, init=[])
        flush_rd = store.read_port(domain="comb")
        wr = store.write_port()
        pending = Array(self.pending)
        visit = Signal(range(n))
        m.d.sync += visit.eq(Mux(visit == n - 1, 0, visit + 1))
        # the visit one-hot (bit j: counter j's turn), and the `cleared` flags turning
        # with it (bit k: counter visit + k's), so the visited one's is always bit 0: no
        # decode of `visit` per counter, no select of its flag
        turn = Signal(n, init=1)
        m.d.sync += turn.eq(turn.rotate_left(1))
        cleared = Signal(n, init=(1 << n) - 1)  # a reset clears too: RAM has no reset
        m.d.sync += cleared.eq(Mux(clear, -1, cleared >> 1))

        for j, name in enumerate(self.counted):
            inc = getattr(self, f"inc_{name}")
            pend = self.pending[j]
            with m.If(clear | turn[j]):
                m.d.sync += pend.eq(inc)
            with m.Elif(inc != 0):
                m.d.sync += pend.eq(pend + inc)

        visit_pending = Signal(max(len(x) for x in self.pending), name="visit_pending")
        m.d.comb += [
            visit_pending.eq(pending[visit]),
            flush_rd.addr.eq(visit),
            wr.addr.eq(visit),
            wr.en.eq(1),
            wr.data.eq(_value(flush_rd.data, visit_pending, cleared[0])),
        ]

        return SimpleNamespace(index=visit, value=wr.data)


def _value(word: Value, pending: Value, cleared: Value) -> Value:
    """A counter's value: its pending count alone after a clear, else sat(word + pending)."""
    total = word + pending  # wider than 32 bits: a carry out saturates
    return Mux(cleared, pending, Mux(total[32:] != 0, (1 << 32) - 1, total[:32]))
