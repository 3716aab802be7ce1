"""Bitstreams with the open toolchain. `make test` builds one: the ECPIX-5's shell (MACs,
host adapter, crossings) around the stand-in core of hw/loopback_core.py, in about three
minutes, and checks that every clock meets its target in nextpnr's routed report. The
whole NIC's builds run with `make bitstream BOARD=NAME` / `make bitstream-all` (not in
`make test`: the core does not fit the 25F, and on the 85F a build takes about 15
minutes on 2 cores; docs/boards.md).

Timing and utilization are read from nextpnr's report and checked against the target
the report states and the device's capacity it states; the block RAM arithmetic of
hw/board_fit.py is checked against hand-computed values and against the build.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from optireduce import host_port
from optireduce.hw.board_fit import DEVICE_DP16KD, bram_budget, dp16kd, largest_c
from optireduce.params import NicParams
from optireduce.sim import bitstream
from optireduce.sim.bitstream import (
    BOARDS,
    board,
    build_utilisation,
    parse_report,
    route_error,
    run_build,
    timing_met,
)
from optireduce.sim.toolchain import ToolchainError


def test_dp16kd_costs_by_hand():
    assert dp16kd(512, 36) == 1  # one block in its widest mode
    assert dp16kd(2048, 9) == 1
    assert dp16kd(16384, 1) == 1
    assert dp16kd(32768, 38) == 76  # 16K x 1: 38 wide, 2 deep (the aggregator at n_max 64)
    assert dp16kd(8192, 32) == 16  # 2K x 9: 4 wide, 4 deep
    assert dp16kd(2079, 32) == 5  # 512 x 36, 5 deep (the result buffer at C = 2048)
    assert dp16kd(32, 64) == 0  # LUTRAM


def test_the_25f_cannot_hold_c_16k_on_chip():
    p = NicParams(n_max=8, b=1024, c=16384)
    # accumulators alone: 4 contexts x 8192 rows*beats x 35 bits > 56 x 18 Kbit
    assert 4 * 8192 * p.w_acc > DEVICE_DP16KD["LFE5U-25F"] * 18 * 1024
    assert bram_budget(p)["total"] > DEVICE_DP16KD["LFE5U-25F"]
    assert largest_c(p, "LFE5U-25F") == 2048
    for name in BOARDS:
        b = board(name)
        dev = b.platform().device
        assert bram_budget(b.params, macs=len(b.eth))["total"] <= DEVICE_DP16KD[dev], name


def test_report_parsing():
    rep = {
        "fmax": {
            "$glbnet$clk": {"achieved": 131.5, "constraint": 125},
            "$glbnet$eth0_mac.eth0_rx_clk": {"achieved": 120.0, "constraint": 125},
            # a domain whose clock net yosys named after its reset synchronizer's
            "$glbnet$rst_sdram.async_ff_clk": {"achieved": 70.0, "constraint": 62.5},
        },
        "utilization": {
            "TRELLIS_COMB": {"used": 100, "available": 24288},
            "DP16KD": {"used": 7, "available": 56},
        },
        "critical_paths": [
            {"from": "posedge $glbnet$clk", "to": "posedge $glbnet$clk", "path": [
                {"type": "clk-to-q", "delay": 0.31, "from": {"cell": "a"}, "to": {"cell": "a"}},
                {"type": "routing", "delay": 5.5, "from": {"cell": "a"}, "to": {"cell": "lut"}},
                {"type": "logic", "delay": 0.14, "from": {"cell": "lut"}, "to": {"cell": "b"}},
            ]},
            {"from": "posedge $glbnet$clk", "to": "posedge $glbnet$core_clk", "path": [
                {"type": "routing", "delay": 9.0, "from": {"cell": "x"}, "to": {"cell": "y"}},
            ]},
        ],
    }  # fmt: skip
    res = parse_report(rep)
    # one path inside sync (0.31 + 5.5 + 0.14 ns); the sync -> core one is not a domain's
    assert res["critical_path"] == {"sync": {"ns": 5.95, "from": "a", "to": "b"}}
    assert res["fmax_mhz"] == {"sync": 131.5, "eth0_rx": 120.0, "sdram": 70.0}
    assert res["target_mhz"] == {"sync": 125.0, "eth0_rx": 125.0, "sdram": 62.5}
    assert (res["luts"], res["brams"], res["ffs"]) == (100, 7, 0)
    assert res["capacity"]["brams"] == 56
    assert not timing_met(res)
    res["fmax_mhz"]["eth0_rx"] = 125.0
    assert timing_met(res)


UTIL_LOG = """Info: Device utilisation:
Info: \t          TRELLIS_FF:   {ff}/  24288   {ffp}%
Info: \t        TRELLIS_COMB:   {lut}/  24288   {lutp}%
Info: \t              DP16KD:      47/     56    83%
"""


def _fake_build(tmp_path: Path, log: str, then: str) -> Path:
    """A build directory whose script writes nextpnr's utilisation lines, then `then`."""
    (tmp_path / "build_top.sh").write_text(f"cat > top.tim <<'EOF'\n{log}EOF\n{then}\n")
    return tmp_path


# a tool the script started and waits for; its pid, to see it stopped with the script
LONG_TOOL = "sleep 300 & echo $! > tool.pid; wait"


def _stopped(pid: int, within_s: float = 10.0) -> bool:
    """The process is gone or a zombie (its parent, the script, is gone too)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(bitstream, "POLL_S", 0.2)


def test_a_build_that_does_not_fit_is_stopped_at_its_utilisation_log(tmp_path, fast_poll):
    """nextpnr spends about 20 minutes failing to place an overfull design: the build is
    stopped, with the tools it started, as soon as its log shows a cell type beyond the
    device (without that check this run would reach its 60 s timeout and raise)."""
    log = UTIL_LOG.format(ff=26090, ffp=107, lut=38111, lutp=156)
    root = _fake_build(tmp_path, log, LONG_TOOL)
    assert run_build(root, dict(os.environ), timeout_s=60) is None
    assert _stopped(int((root / "tool.pid").read_text()))
    util = build_utilisation(root)
    assert (util["luts"], util["ffs"], util["brams"]) == (38111, 26090, 47)
    assert util["capacity"]["luts"] == 24288


def test_a_build_that_fits_runs_to_its_end(tmp_path, fast_poll):
    log = UTIL_LOG.format(ff=5378, ffp=22, lut=6600, lutp=27)
    root = _fake_build(tmp_path, log, "sleep 1; exit 7")
    assert run_build(root, dict(os.environ), timeout_s=60) == 7  # its own exit code


def test_a_build_past_its_time_is_stopped_with_an_error(tmp_path, fast_poll):
    log = UTIL_LOG.format(ff=5378, ffp=22, lut=6600, lutp=27)
    root = _fake_build(tmp_path, log, LONG_TOOL)
    with pytest.raises(ToolchainError, match="exceeded 2 s"):
        run_build(root, dict(os.environ), timeout_s=2)
    assert _stopped(int((root / "tool.pid").read_text()))


def test_line_rate_follows_the_core_clock():
    """The core's domain sets the datapath rate; the port reaches 1 Gb/s only when every
    domain meets its target (hand-computed: 32 bits x 60 MHz = 1.92 Gb/s at Fmax; the
    port carries 1 Gb/s)."""
    from optireduce.experiments.bench_fpga import UBT_FRAME_OVERHEAD, line_rate

    rep = {
        "fmax": {
            "$glbnet$clk": {"achieved": 140.0, "constraint": 125},
            "$glbnet$core_clk": {"achieved": 60.0, "constraint": 52.083},
            "$glbnet$eth0_mac.eth0_rx_clk": {"achieved": 150.0, "constraint": 125},
        }
    }
    res = parse_report(rep)
    assert set(res["fmax_mhz"]) == {"sync", "core", "eth0_rx"}
    got = line_rate(res, lanes=1, p=256)
    assert got["timing_met"] and got["datapath_gbps_at_fmax"] == 1.92
    assert got["line_rate_gbps"] == 1.0
    assert got["payload_gbps"] == round(1024 / (1024 + UBT_FRAME_OVERHEAD), 3)
    res["fmax_mhz"]["core"] = 50.0  # below its target: no line rate
    assert line_rate(res, lanes=1, p=256)["line_rate_gbps"] == 0.0


def _walk(frag):
    for sub, *_ in frag.subfragments:
        yield sub
        yield from _walk(sub)


@pytest.mark.parametrize("name", BOARDS)
def test_every_board_top_elaborates_on_its_platform(name):
    """Pins, PLL and the core come together on the board's platform (no toolchain)."""
    from amaranth.hdl import Fragment, Instance

    from optireduce.hw.board_top import BoardTop

    b = board(name)
    plat = b.platform()
    frag = Fragment.get(BoardTop(b), plat)
    requested = set(plat._requested)
    assert {("eth_rgmii", n) for n in b.eth} <= requested
    f_in = plat.default_clk_frequency
    assert f_in * b.pll[1] / b.pll[0] == pytest.approx(125e6)
    assert 400e6 <= 125e6 * b.pll[2] <= 800e6  # the PLL's VCO range
    # the core clock: the PLL's CLKOS, VCO 625 MHz / 12, fast enough for line rate (32
    # bits a cycle): read back from the EHXPLLL instance as elaborated
    pll = next(f for f in _walk(frag) if isinstance(f, Instance) and f.type == "EHXPLLL")
    assert 125e6 * pll.parameters["CLKOP_DIV"] == 625e6
    assert pll.parameters["CLKOS_ENABLE"] == "ENABLED" and pll.parameters["CLKOS_DIV"] == 12
    assert pll.ports["CLKOS"][0].name == "core_clk"
    assert float(pll.attrs["FREQUENCY_PIN_CLKOS"]) == pytest.approx(52.0833, abs=1e-3)
    assert b.core_mhz == pytest.approx(625 / 12) and 32 * b.core_mhz >= 1000
    # each PLL domain's reset leaves through a DCCA (a global network), not fabric routing
    insts = [f for f in _walk(frag) if isinstance(f, Instance)]
    dccs = {f.ports["CLKO"][0].name: f.attrs.get("BEL") for f in insts if f.type == "DCCA"}
    assert {"rst", "core_rst"} <= set(dccs)
    # where the board pins them (Board.reset_dccs), the DCCAs carry the BEL
    pinned = dict(b.reset_dccs)
    assert dccs["rst"] == pinned.get("sync") and dccs["core_rst"] == pinned.get("core")
    # the block RAMs read at 125 MHz through their own output registers
    # (hw/registered_ram.py): each MAC's two frame FIFOs and the adapter's result ring
    # (two RESULT frames of 256 words: one block, whatever C)
    brams = [f for f in insts if f.type == "DP16KD"]
    assert host_port.result_ring_words(b.params.n_max) == 512
    assert len(brams) == 2 * len(b.eth) + 1
    assert all(f.parameters["REGMODE_B"] == "OUTREG" for f in brams)
    wide = [f for f in brams if f.parameters["DATA_WIDTH_B"] == 36]  # half the word is DOA
    assert wide and all(f.parameters["REGMODE_A"] == "OUTREG" for f in wide)


def test_the_colorlight_top_with_its_accumulators_in_sdram():
    """`build bitstream --sdram`: the core's clock (the PLL's CLKOS) is the SDRAM's
    62.5 MHz and there is no third output; every SDRAM pin of the board reaches
    litedram's board variant (outputs through plain buffers, the data pins to its own
    TRELLIS_IO cells, declared inout), the SDRAM's clock leaves through an ODDRX1F in
    the core's clock, and the controller runs in it."""
    from amaranth.hdl import Fragment, Instance

    from optireduce.hw.board_top import BoardTop
    from optireduce.hw.sdram_controller import OUTPUT_PINS

    b, ctrl = bitstream.with_sdram("colorlight")
    assert b.params.sdram_addr_bits == ctrl.addr_width == 20 and not ctrl.sim
    assert re.search(r"^\s*inout\s+wire\s+\[31:0\]\s+sdram_dq,", ctrl.verilog.read_text(), re.M)
    plat = b.platform()
    frag = Fragment.get(BoardTop(b, sdram=ctrl), plat)
    assert ("sdram", 0) in set(plat._requested)
    insts = [f for f in _walk(frag) if isinstance(f, Instance)]
    pll = next(f for f in insts if f.type == "EHXPLLL")
    assert "CLKOS2_ENABLE" not in pll.parameters and "CLKOS2" not in pll.ports
    assert pll.parameters["CLKOS_DIV"] == b.core_div == b.sdram_div == 10
    assert pll.ports["CLKOS"][0].name == "core_clk"
    assert 125 * pll.parameters["CLKOP_DIV"] / 10 == b.sdram.clk_mhz == b.core_mhz == 62.5
    (ld,) = (f for f in insts if f.type == "litedram_core")
    assert ld.ports["clk"][0].domain == "core"
    for port in OUTPUT_PINS:
        assert ld.ports[port][1] == "o", port
    assert ld.ports["sdram_dq"][1] == "io" and len(ld.ports["sdram_dq"][0]) == 32
    # the SDRAM's clock pin: an ODDRX1F of the core's domain (the MACs' are in sync)
    assert [f for f in insts if f.type == "ODDRX1F"
            and getattr(f.ports["SCLK"][0], "domain", None) == "core"]  # fmt: skip
    with pytest.raises(ValueError, match="needs the board's SDRAM"):
        BoardTop(b)
    with pytest.raises(ValueError, match="has no SDRAM"):
        bitstream.with_sdram("ecpix5")
    with pytest.raises(ValueError, match="not with another core"):
        bitstream.build_bitstream("colorlight", core=bitstream.core_by_name("loopback"),
                                  sdram=True)  # fmt: skip


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("name", "rx_domains", "min_bytes"),
    [("ecpix5", {"eth0_rx"}, 100_000), ("colorlight", {"eth0_rx", "eth1_rx"}, 50_000)],
)
def test_the_shell_bitstream_meets_its_clocks(name, rx_domains, min_bytes):
    """yosys, nextpnr (routed) and ecppack on the board with the loopback core: every
    domain's Fmax from the report reaches the constraint the report states (the 125 MHz
    side, the PHYs' RX clocks, and the core clock the PLL makes). The Colorlight's 25F is
    speed grade 6, the ECPIX-5's 85F grade 8."""
    from optireduce.sim.bitstream import build_bitstream, core_by_name

    res = build_bitstream(name, core=core_by_name("loopback"))
    assert res["fits"] and set(res["target_mhz"]) == {"sync", "core", *rx_domains}
    assert res["target_mhz"]["sync"] == 125.0
    assert all(res["target_mhz"][d] == 125.0 for d in rx_domains)
    assert res["target_mhz"]["core"] == pytest.approx(board(name).core_mhz, abs=0.01)
    assert timing_met(res), (res["fmax_mhz"], res["critical_path"])
    assert 0 < res["luts"] <= res["capacity"]["luts"] and res["brams"] > 0
    bit = Path(res["bitstream"])
    assert bit.stat().st_size > min_bytes  # the device's image, not an empty file


def test_a_placed_design_that_does_not_route_is_named_by_its_error():
    """nextpnr's routing error (the 25F's NIC at 99 % of its LUTs placed, then failed to
    route a clock arc) is what the JSON reports; any other error is not a routing one."""
    log = ("Info: Routing globals...\nERROR: Failed to route arc 0.0 of net 'rst_sync_dcc_CLKI', "
           "from X28/Y2/Q1_SLICE to X0/Y0/G_CLKI_TDCC0.\n0 warnings, 1 error\n")  # fmt: skip
    assert route_error(log) == ("Failed to route arc 0.0 of net 'rst_sync_dcc_CLKI', from "
                                "X28/Y2/Q1_SLICE to X0/Y0/G_CLKI_TDCC0.")  # fmt: skip
    assert route_error("ERROR: Unable to place cell 'x'\n") is None
    assert route_error("") is None


def _reset_dccs(bels: dict[str, str]):
    """A few registers per domain, each domain reset by a toggling register through a DCCA
    pinned where the board pins its reset's (Board.reset_dccs)."""
    from amaranth import Cat, ClockDomain, Elaboratable, Instance, Module, Signal

    class ResetDccs(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            clk = platform.request(platform.default_clk, dir="i").i
            m.domains.sync = sync = ClockDomain()
            m.d.comb += sync.clk.eq(clk)
            bits = []
            for dom, bel in bels.items():
                raw, rst = Signal(name=f"{dom}_raw"), Signal(name=f"{dom}_rst")
                m.d.sync += raw.eq(~raw)
                m.submodules[f"dcc_{dom}"] = Instance(
                    "DCCA", i_CLKI=raw, i_CE=1, o_CLKO=rst, a_BEL=bel
                )
                cd = ClockDomain(f"r_{dom}", async_reset=True)
                m.domains += cd
                m.d.comb += [cd.clk.eq(clk), cd.rst.eq(rst)]
                count = Signal(8, name=f"{dom}_count")
                m.d[cd.name] += count.eq(count + 1)
                bits.append(count[-1])
            m.d.comb += platform.request("led", 0).o.eq(Cat(*bits).xor())
            return m

    return ResetDccs()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", [n for n in BOARDS if board(n).reset_dccs])
def test_the_reset_dccs_a_board_pins_exist_and_are_routed_from_the_fabric(name, tmp_path):
    """nextpnr refuses a BEL name the device does not have, and fails to route a DCCA input
    the fabric cannot reach (the 25F's top DCCs on the whole NIC): a design with a
    fabric-driven DCCA at each pinned BEL builds to a bitstream on the board's device."""
    b = board(name)
    plan = b.platform().build(_reset_dccs(dict(b.reset_dccs)), name="top", do_build=False)
    plan.extract(str(tmp_path))
    rc = run_build(tmp_path, bitstream._tool_env(), timeout_s=600)
    tim = tmp_path / "top.tim"  # nextpnr's log, if it got that far
    log = (tmp_path / "build.log").read_text() + (tim.read_text() if tim.exists() else "")
    assert rc == 0, log[-2000:]
    assert (tmp_path / "top.bit").stat().st_size > 50_000  # a compressed 25F image: 99 KB
