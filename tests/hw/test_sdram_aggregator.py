"""SdramAggregator on litedram's controller (Verilator, litedram's SDRAM model): the
aggregator's model replay, the same scenarios and bench, with the memory's latency,
its refreshes and its port's contract in the way.

Besides the aggregator's scenarios, two that aim at the store's hazards:
- `back_to_back`: every sender's packet of a slot right after the other (the same tick,
  no idle): each read-modify-write of a slot follows the previous one's write;
- `deadline_in_flight`: a packet arrives the tick before the hard deadline, so the
  phase ends (and its readout fetches the slot) while the packet's beats are on their
  way to the memory.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from optireduce.experiments.bench_sdram import SPLIT_MHZ, TARGET_UBT_GBPS, aggregation_figures
from optireduce.hw.aggregator import event_layout
from optireduce.hw.axis import AxisWrapper, PlainStreams
from optireduce.hw.board_colorlight import PARAMS
from optireduce.hw.sdram_aggregator import SdramAggregator
from optireduce.hw.sdram_controller import SdramSpec
from optireduce.sim import sdram_sim
from optireduce.sim.sdram_sim import AggregatorOnSdram
from tests.hw import phase_owner_bench as bench
from tests.hw.phase_owner_bench import Scenario, deliver
from tests.hw.test_aggregator import (
    DIRECTED,
    P,
    _scenario_json,
    one_op,
    random_scenario,
    run_model,
    scatter_frames_to,
)


def back_to_back():
    """Every sender's packets of a slot at the same tick, one behind the other."""
    sc, frames = one_op(world=4, rank=1, seed=3)
    by_slot = sorted(frames, key=lambda k: (k[1], k[0]))  # (sender, index): by index first
    deliver(sc, frames, by_slot, t0=10, dt=0)
    sc.t_end = 100
    return sc


def streaming(seed: int):
    """Two ops in flight, every frame of a full world at one tick: the store busy for
    over a thousand cycles, one refresh interval or more."""
    rng = np.random.default_rng(seed)
    sc = Scenario(P, P.n_max, seed % P.n_max)
    sc.actions += [(2, "start", op, P.c) for op in range(P.ops_in_flight)]
    for op in range(P.ops_in_flight):
        for s in range(sc.world):
            if s != sc.rank:
                frames = scatter_frames_to(sc, s, op, P.c, P.t_b_us, rng)
                sc.actions += [(3, "frame", f) for f in frames.values()]
    sc.t_end = 60
    return sc


def deadline_in_flight():
    """A packet the tick before the hard deadline (the deadline found without it)."""
    sc, frames = one_op(world=3, rank=2, seed=4)
    keys = sorted(frames)
    last, late = max(frames), keys[0]
    deliver(sc, frames, [k for k in keys if k not in (last, late)])
    sc.t_end = 400
    end = run_model(sc).ends[0][1]
    sc.actions.append((end - 1, "frame", frames[late]))
    return sc, end


def test_the_hazard_scenarios_do_what_they_say():
    """The model's view of the two scenarios: the same tick for a slot's packets; the
    deadline phase end the tick after the extra packet, which is accepted."""
    sc = back_to_back()
    assert len({a[0] for a in sc.actions if a[1] == "frame"}) == 1
    exp = run_model(streaming(1))
    assert [e[0] for e in exp.ends.values()] == ["complete"] * P.ops_in_flight
    sc, end = deadline_in_flight()
    exp = run_model(sc)
    reason, tick = exp.ends[0][:2]
    assert (reason, tick) == ("deadline", end)
    frames = sum(a[1] == "frame" for a in sc.actions)
    assert exp.counters["rx_scatter"] == frames


@pytest.mark.parametrize("two_clocks", [False, True], ids=["one_clock", "two_clocks"])
def test_cocotb_verilator_replays_the_scenarios_on_sdram(tmp_path, two_clocks):
    """The model's scenarios, bit for bit; with two clocks, the store and the controller
    at 150 MHz beside the aggregator's 125 (the crossings in the way)."""
    p = P
    _, index_bits = SdramAggregator.index_width(p)
    top = AggregatorOnSdram(p, (1 << 20) - (1 << index_bits), two_clocks=two_clocks)
    scenarios = [(name, build()) for name, build in DIRECTED.items()]
    scenarios += [("back_to_back", back_to_back()), ("deadline_in_flight", deadline_in_flight()[0])]
    scenarios += [(f"streaming{s}", streaming(s)) for s in (1, 2, 3)]
    scenarios += [(f"random{s}", random_scenario(s)) for s in (1, 4)]
    agg_path = ["block", "block", "agg"]
    clocks = {"sdram_clk_ps": 6666} if two_clocks else {}
    bench.replay_in_cocotb(
        tmp_path, AxisWrapper(PlainStreams(top, ev="whole")), "aggregator", event_layout(p),
        [_scenario_json(n, sc) for n, sc in scenarios], lanes=p.lanes,
        refresh=["block", "block", "ctrl", "litedram", top.core.refresh_pulse],
        store_drained=[*agg_path, "store", "store", "drained"],
        top_name=f"sdram_aggregator_top{'_2clk' if two_clocks else ''}",
        sources=(top.core.verilog,), **clocks,
    )  # fmt: skip


def test_on_two_clocks_the_store_keeps_up_with_the_port():
    """The rate figure of `bench sdram` (simulated time, the same on every machine) on a
    shorter op, on two clocks (the store's crossing): the aggregator at 52.08 MHz, the
    store and the controller at 62.5; every peer's packet a read-modify-write, the own
    packets' sums in the time, and still >= 0.9 Gb/s of UBT; refreshes came meanwhile."""
    p = replace(PARAMS, c=4096)
    raw = sdram_sim.aggregation_rate(SdramSpec(clk_mhz=62.5), p, PARAMS.n_max, core_mhz=52.08)
    assert raw["ingest"]["refreshes"] >= 2
    f = aggregation_figures(raw)
    assert f["ubt_gbps"] >= TARGET_UBT_GBPS, f


@pytest.mark.deep
def test_the_whole_nic_core_on_the_25f_clocks_sends_the_models_frames():
    """`bench sdram`'s whole-NIC run at C = 16K from 8 ranks (the core, its store and the
    controller in the 25F --sdram build's one clock, 62.5 MHz): the START's words come
    at the host link's pace while every peer's scatter frame comes back to back; the
    frames the core sends (its
    own 56 scatter frames and its 56 means' frames) are the model's, byte for byte."""
    p = replace(PARAMS, c=16384, sdram_addr_bits=SdramSpec().addr_bits)
    raw = sdram_sim.nic_aggregation_rate(SdramSpec(), p, PARAMS.n_max, core_mhz=SPLIT_MHZ[0])
    assert raw["same_as_model"], raw
    assert (raw["frames_sent"], raw["peer_frames"], raw["peer_elements"]) == (112, 56, 7 * 2048)
