"""`optireduce bench sdram`: what the 5A-75B's SDRAM behind litedram's controller sustains.

Aggregating in SDRAM reads and writes an accumulator for every element that arrives,
so the figure that decides a 25F NIC is read-modify-write throughput: the UBT traffic
(headers and gaps included, P-element packets) whose elements the controller keeps up
with, at each candidate SDRAM clock. Write and read streams (a gather buffer's
pattern) are given too. The counts are cycles of the simulated controller
(sim/sdram_sim.py), the same on every machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from optireduce.experiments.bench_fpga import payload_share
from optireduce.hw.board_colorlight import BOARD, PARAMS
from optireduce.hw.sdram_controller import SdramSpec
from optireduce.sim import sdram_sim
from optireduce.sim.verilog import BUILD

PLOT = BUILD / "litedram" / "sdram.png"
CLOCKS_MHZ = (52.08, 62.5, 100.0)  # the core's clock; its own domain; a faster one
TARGET_UBT_GBPS = 0.9
P = PARAMS.p  # elements per UBT packet on the 5A-75B
AGG_C, AGG_WORLD = 16384, PARAMS.n_max  # the C; every peer's packet a read-modify-write
# the 25F's --sdram build: its core in the SDRAM's clock (sim/bitstream.py: with_sdram)
SPLIT_MHZ = (BOARD.sdram_mhz, BOARD.sdram_mhz)  # the core's clock, the SDRAM's
LABELS = {"write": "write stream", "read": "read stream",
          "rmw_ubt_gbps": "UBT that read-modify-write keeps up with",
          "agg_ubt_gbps": "UBT the SDRAM aggregator keeps up with"}  # fmt: skip


def figures(f: dict, mhz: float) -> dict:
    """Gb/s of each pattern at `mhz`, and the UBT rate read-modify-write keeps up with."""
    hz = mhz * 1e6
    out = {k: round(f[k]["words"] / f[k]["cycles"] * 32 * hz / 1e9, 3) for k in ("write", "read")}
    elems = f["rmw"]["words"] / f["rmw"]["cycles"] * hz
    out["rmw_elements_per_s"] = round(elems)
    out["rmw_ubt_gbps"] = round(elems * 32 / payload_share(P) / 1e9, 3)
    out["keeps_up"] = out["rmw_ubt_gbps"] >= TARGET_UBT_GBPS
    return out


def aggregation_figures(raw: dict) -> dict:
    """The UBT rate (peers' elements on the wire) SdramAggregator keeps up with, its own
    packets' sums included in the time; the readout's elements per second (both from
    simulated time)."""
    ing, ro = raw["ingest"], raw["readout"]
    elems = ing["elements"] / ing["ns"] * 1e9
    gbps = round(elems * 32 / payload_share(P) / 1e9, 3)
    return {"ubt_gbps": gbps, "keeps_up": gbps >= TARGET_UBT_GBPS,
            "elements_per_cycle": round(ing["elements"] / ing["cycles"], 4),
            "readout_elements_per_s": round(ro["elements"] / ro["ns"] * 1e9),
            "raw": raw}  # fmt: skip


def nic_figures(raw: dict) -> dict:
    """The UBT rate (peers' elements on the wire) the whole NIC takes on its network port
    (`port`: the last peer beat taken) and sums in SDRAM (`summed`: the store has every
    sum as a write command), from simulated time; and whether the core sent the model's
    frames, bit for bit."""

    def gbps(ns: float) -> float:
        return round(raw["peer_elements"] * 32 / payload_share(P) / ns, 3)  # bits/ns = Gb/s

    port, summed = gbps(raw["taken"]["ns"]), gbps(raw["summed"]["ns"])
    return {"port_ubt_gbps": port, "summed_ubt_gbps": summed,
            "keeps_up": min(port, summed) >= TARGET_UBT_GBPS and raw["same_as_model"],
            "same_as_model": raw["same_as_model"], "raw": raw}  # fmt: skip


def bench_sdram(quick: bool = False, progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda s: None)
    n = 2048 if quick else 8192
    clocks = CLOCKS_MHZ[1:2] if quick else CLOCKS_MHZ
    agg = replace(PARAMS, c=AGG_C)
    out = {}
    for mhz in clocks:
        spec = SdramSpec(clk_mhz=mhz)
        say(f"litedram controller for {spec.module} at {mhz} MHz: {n} words per pattern")
        raw = sdram_sim.throughput(spec, n=n, batch=P)
        say(f"the aggregator on it: one op of C = {agg.c} from {AGG_WORLD} ranks")
        ag = aggregation_figures(sdram_sim.aggregation_rate(spec, agg, AGG_WORLD))
        out[f"{mhz:g}"] = {**figures(raw, mhz), "aggregator": ag, "raw": raw}
    # the 25F's clocks: the aggregator in the core's domain, the store at the SDRAM's
    spec = SdramSpec(clk_mhz=SPLIT_MHZ[1])
    if SPLIT_MHZ[0] == SPLIT_MHZ[1] and f"{SPLIT_MHZ[1]:g}" in out:  # measured above
        split = out[f"{SPLIT_MHZ[1]:g}"]["aggregator"]
    else:
        say(f"the aggregator at {SPLIT_MHZ[0]} MHz, its store and the SDRAM at {SPLIT_MHZ[1]}")
        raw = sdram_sim.aggregation_rate(spec, agg, AGG_WORLD, SPLIT_MHZ[0])
        split = aggregation_figures(raw)
    split = {"core_mhz": SPLIT_MHZ[0], "sdram_mhz": SPLIT_MHZ[1], **split}
    # the whole NIC core on the same clocks: its network port, frames in, frames out
    say(f"the whole NIC core, its accumulators in SDRAM: one op of C = {agg.c} from "
        f"{AGG_WORLD} ranks, peers' frames back to back")  # fmt: skip
    nic_p = replace(agg, sdram_addr_bits=spec.addr_bits)
    nic = nic_figures(sdram_sim.nic_aggregation_rate(spec, nic_p, AGG_WORLD, SPLIT_MHZ[0]))
    nic = {"core_mhz": SPLIT_MHZ[0], "sdram_mhz": SPLIT_MHZ[1], **nic}
    plot(out, PLOT, split, nic)
    return {"module": SdramSpec().module, "target_ubt_gbps": TARGET_UBT_GBPS, "clocks_mhz": out,
            "aggregator_25f_clocks": split, "nic_25f_clocks": nic,
            "plot": str(PLOT)}  # fmt: skip


def plot(out: dict, path: Path, split: dict | None = None, nic: dict | None = None) -> None:
    """Gb/s per pattern and clock, and the aggregator (`split`) and the whole NIC core
    (`nic`, its summed rate) on the 25F's two clocks, against the 1 GbE port and the
    target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rows = [{**r, "agg_ubt_gbps": r["aggregator"]["ubt_gbps"]} for r in out.values()]
    kinds = ("write", "read", "rmw_ubt_gbps", "agg_ubt_gbps")
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        xs = [k + j * width for k in range(len(out))]
        ax.bar(xs, [r[kind] for r in rows], width, label=LABELS[kind])
    ticks = [f"{c} MHz" for c in out]
    if split:  # one bar: the aggregator at the core's clock, its store at the SDRAM's
        ax.bar([len(out) + 1.5 * width], [split["ubt_gbps"]], width, color="C3")
        ticks.append(f"{split['core_mhz']:g} + {split['sdram_mhz']:g} MHz\n(core + SDRAM)")
    if nic:  # beside it: the whole NIC core on the same clocks
        x = len(out) + 2.5 * width
        ax.bar(
            [x],
            [nic["summed_ubt_gbps"]],
            width,
            color="C4",
            label="UBT the whole NIC core sums (while its op encodes)",
        )
    ax.set_xticks([k + 1.5 * width for k in range(len(ticks))], ticks)
    ax.axhline(TARGET_UBT_GBPS, color="k", lw=0.8, ls="--", label="target (UBT)")
    ax.axhline(1.0, color="k", lw=0.8, label="1 GbE")
    ax.set_ylabel("Gb/s")
    top = max(r[k] for r in rows for k in kinds)
    ax.set_ylim(0, 1.6 * top)  # room for the legend above the bars
    ax.set_title("5A-75B SDRAM behind litedram: streams and aggregation")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
