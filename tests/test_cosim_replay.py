"""Equivalence suite: every trace through the Verilated NIC core and through the model.

Output frames identical byte for byte at the same tick (within a tick both are in the
canonical order of sim/replay.py: by frame bytes), counters identical, results bit
for bit. One Verilator build at TRACE_PARAMS serves the whole suite.
"""

from __future__ import annotations

import numpy as np
import pytest

from optireduce import host_port, ubt
from optireduce.sim.cosim_build import harness_path
from optireduce.sim.replay import ReplayResult, differences, replay
from optireduce.sim.trace import (
    ADMISSION_SCENARIOS,
    INBAND_OPS,
    INBAND_PARAMS,
    INBAND_SCENARIOS,
    OPS,
    SCENARIOS,
    SDRAM_PARAMS,
    SLIM_PARAMS,
    TRACE_PARAMS,
    make_trace,
)
from optireduce.sim.trace_mutate import mutate

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module", autouse=True)
def harness():
    return harness_path(TRACE_PARAMS)  # build once (cached under build/cosim/)


def assert_same(rtl: ReplayResult, model: ReplayResult) -> None:
    assert model.results and model.frames  # something to compare
    bad = differences(rtl, model)
    assert not bad, "rtl != model: " + "; ".join(bad)


def check(frames) -> ReplayResult:
    model = replay(frames, backend="model")
    rtl = replay(frames, backend="rtl")
    assert_same(rtl, model)
    assert rtl.sim["core_now"] == rtl.sim["ticks"]  # the core applied every tick strobed
    return model


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rtl_equals_model(scenario, seed):
    model = check(make_trace(scenario, seed))
    assert len(model.results) == OPS  # every op completes (by its deadline at worst)
    assert model.counters["tx_scatter"] > 0 and model.counters["tx_gather"] > 0


@pytest.mark.parametrize("seed", range(10))
def test_rtl_equals_model_on_mutated_traces(seed):
    frames = make_trace(SCENARIOS[seed % len(SCENARIOS)], seed)
    mutated = mutate(frames, seed=100 + seed, rate=0.15)
    assert mutated != frames
    check(mutated)


# In-band exponents (INBAND_PARAMS, a second build): the in-band rules, and the disturbances
# that meet them (a lost proposal, stale and late frames, malformed words)
INBAND_CASES = (*INBAND_SCENARIOS, "loss", "reorder", "duplicates", "stale_future", "malformed")


@pytest.mark.parametrize("seed", (0, 1))
@pytest.mark.parametrize("scenario", INBAND_CASES)
def test_rtl_equals_model_inband(scenario, seed):
    model = check(make_trace(scenario, seed, inband=True))
    assert len(model.results) == INBAND_OPS
    assert model.exp_counters["exp_given"] == INBAND_PARAMS.exp_lead_eff


@pytest.mark.parametrize("seed", range(10))
def test_rtl_equals_model_inband_mutated(seed):
    frames = make_trace(INBAND_CASES[seed % len(INBAND_CASES)], seed, inband=True)
    mutated = mutate(frames, seed=200 + seed, rate=0.15)
    assert mutated != frames
    check(mutated)


def test_inband_traces_exercise_every_rule():
    """Across the in-band scenarios every way of choosing an exponent happens (model)."""
    seen = dict.fromkeys(replay(make_trace("clean", 0, inband=True)).exp_counters, 0)
    for scenario in INBAND_SCENARIOS:
        for k, v in replay(make_trace(scenario, 0, inband=True)).exp_counters.items():
            seen[k] += v
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", ADMISSION_SCENARIOS)
def test_rtl_equals_model_with_admission(scenario, seed):
    """The peers table on: outsiders, other ports and wrong senders dropped by reason."""
    model = check(make_trace(scenario, seed))
    assert model.counters["not_member"] > 0 and model.counters["wrong_sender"] > 0
    assert len(model.results) == OPS


@pytest.mark.parametrize("seed", range(6))
def test_rtl_equals_model_with_admission_mutated(seed):
    frames = make_trace(ADMISSION_SCENARIOS[seed % len(ADMISSION_SCENARIOS)], seed)
    mutated = mutate(frames, seed=300 + seed, rate=0.2)
    assert mutated != frames
    check(mutated)


def test_rtl_equals_model_with_output_backpressure():
    frames = make_trace("reorder", 4)
    model = replay(frames, backend="model")
    assert_same(replay(frames, backend="rtl", backpressure=3), model)


# The 25F's builds (SLIM_PARAMS: one op in flight and one FWHT for the encode and the
# decode; SDRAM_PARAMS: the same with the aggregator's accumulators in SDRAM, the core's
# SdramAggregator on litedram's simulated controller, refreshes and bank timing
# included): traces of runs at those params give the same bits, with outputs stalled too
# build: (params, mutated traces' seeds, their first scenario, the mutations' first seed)
THE_25F = {"slim": (SLIM_PARAMS, range(4), 3, 400), "sdram": (SDRAM_PARAMS, range(3), 5, 500)}


@pytest.mark.parametrize("build", THE_25F)
@pytest.mark.parametrize("scenario", (*SCENARIOS, *ADMISSION_SCENARIOS))
def test_rtl_equals_model_25f(scenario, build):
    model = check(make_trace(scenario, 1, params=THE_25F[build][0]))
    assert model.counters["ops_completed"] == OPS


@pytest.mark.parametrize(
    ("build", "seed"), [(b, s) for b, (_, seeds, _, _) in THE_25F.items() for s in seeds]
)
def test_rtl_equals_model_25f_mutated_and_stalled(build, seed):
    params, _, first, mutations = THE_25F[build]
    frames = make_trace(SCENARIOS[(seed + first) % len(SCENARIOS)], seed, params=params)
    frames = mutate(frames, seed=mutations + seed, rate=0.15)
    model = replay(frames, backend="model")
    assert_same(replay(frames, backend="rtl", backpressure=3), model)


# Overlap: each input waits only for the events before it (the core's `events_idle`), so
# ticks and peers' frames come while an op encodes, and phases may end before its own
# packets are in (the START first: hw/aggregator.py, "Own packets after the START").
# The frames are the model's, byte for byte, though they leave at other ticks.
OVERLAP = {"trace": TRACE_PARAMS, "slim": SLIM_PARAMS, "sdram": SDRAM_PARAMS}
HOST_GAP = 24  # idle cycles after each host word: an encode spans many ticks


def test_rank_bound_scenarios_are_refused_at_other_ranks():
    with pytest.raises(ValueError, match="written for rank 0"):
        make_trace("silent", 0, inband=True, rank=2)
    assert make_trace("clean", 0, rank=2) != make_trace("clean", 0)


def check_overlap(frames, ops: int = OPS) -> ReplayResult:
    model = replay(frames, backend="model")
    rtl = replay(frames, backend="rtl", overlap=True, host_gap=HOST_GAP)
    bad = differences(rtl, model, ticks=False)
    assert not bad, "rtl != model: " + "; ".join(bad)
    assert model.counters["ops_completed"] == ops
    # the overlap is real: some frame left at a later tick than the model sent it
    sent = {f: t for t, f in model.frames}
    assert any(t > sent[f] for t, f in rtl.frames), "no input came during an encode"
    return model


@pytest.mark.parametrize("build", OVERLAP)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rtl_equals_model_while_an_op_encodes(scenario, build):
    check_overlap(make_trace(scenario, 2, params=OVERLAP[build]))


@pytest.mark.parametrize("build", ("trace", "slim"))
@pytest.mark.parametrize("scenario", ("clean", "loss", "late"))
@pytest.mark.parametrize("rank", (1, 2))
def test_rtl_equals_model_while_an_op_encodes_at_other_ranks(rank, scenario, build):
    """Rank 1 and 2 own slots whose last own packet comes before the chunk's last."""
    check_overlap(make_trace(scenario, 3, params=OVERLAP[build], rank=rank))


@pytest.mark.parametrize(("scenario", "rank"), [("predicted", 0), ("predicted", 2), ("silent", 0)])
def test_rtl_equals_model_inband_while_an_op_encodes(scenario, rank):
    """In-band exponents: a host predicting too small saturates (its STATS counts); a
    proposal lost, then peers late (`silent` names ranks: rank 0 only)."""
    model = check_overlap(make_trace(scenario, 0, inband=True, rank=rank), INBAND_OPS)
    if scenario == "predicted":
        assert model.exp_counters["exp_saturated"] > 0


def _starts_and_last_frames(frames) -> tuple[dict[int, int], dict[int, int]]:
    """Per op: the tick of its START, and of the last network frame of it."""
    start: dict[int, int] = {}
    last: dict[int, int] = {}
    for tick, f in frames:
        if host_port.is_host_frame(f):
            h = host_port.parse(f)
            if h.kind == host_port.START:
                start.setdefault(h.op_id, tick)
        else:
            op = ubt.UbtHeader.unpack(f, ubt.L2_L4_LEN).op_id
            last[op] = max(last.get(op, tick), tick)
    return start, last


def test_slim_params_are_the_25fs_choices():
    from optireduce.hw.board_colorlight import PARAMS

    for k in ("ops_in_flight", "fwht_shared", "tick_bits"):
        assert getattr(SLIM_PARAMS, k) == getattr(PARAMS, k) != getattr(TRACE_PARAMS, k), k


def test_slim_traces_hold_one_op_in_flight():
    """In a clean run at K = 1 the host STARTs op j + 1 only once op j has all its
    frames; at K = 2 op 1 starts before op 0 is through."""
    start, last = _starts_and_last_frames(make_trace("clean", 1, params=SLIM_PARAMS))
    assert all(start[j + 1] >= last[j] for j in range(OPS - 1)), (start, last)
    start, last = _starts_and_last_frames(make_trace("clean", 1))
    assert start[1] < last[0]


def test_a_difference_is_caught():
    """The comparison itself can fail: one flipped result bit is reported."""
    frames = make_trace("clean", 0)
    model, rtl = replay(frames), replay(frames, backend="rtl")
    rtl.results[0] = rtl.results[0].copy()
    rtl.results[0].view(np.uint32)[5] ^= 1
    with pytest.raises(AssertionError):
        assert_same(rtl, model)
    rtl2 = replay(frames, backend="rtl")
    rtl2.frames[3] = (rtl2.frames[3][0] + 1, rtl2.frames[3][1])
    with pytest.raises(AssertionError, match="frame 3: tick"):
        assert_same(rtl2, model)
