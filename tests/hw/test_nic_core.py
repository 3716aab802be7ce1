# amaranth: UnusedElaboratable=no
"""The NIC core (hw/nic_core.py) against the model, trace by trace, in amaranth.sim.

Each trace of sim/trace.py (TRACE_PARAMS: p=16, b=64, c=256, n_max=8; rank 0 of a
world of 3, three ops) is replayed through the model (sim/replay.py, backend
"model") and through the core (sim/core_sim.py: CSR configuration, host_cmd/host_i,
net_rx, the idle/tick protocol). The outputs must be identical: every net_tx frame
byte for byte at its tick, every RESULT (float32 bit patterns) and STATS record,
every counter of the CSR bank. Frames within one tick are compared in a canonical
order (sorted by bytes), as replay() puts both backends' outputs.

One simulator runs all the traces (reset in between): amaranth.sim builds the core
once. The Verilated core in the C++ harness runs the full equivalence suite in make test;
these two replays (3 minutes of amaranth.sim) are `deep` tests, a second simulator's view.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from optireduce import host_port
from optireduce.hw.nic_core import NicCore, stats_len
from optireduce.sim import verilog
from optireduce.sim.core_sim import replay_traces
from optireduce.sim.replay import differences, replay
from optireduce.sim.toolchain import use_verilator
from optireduce.sim.trace import INBAND_PARAMS, SLIM_PARAMS, TRACE_PARAMS, make_trace
from optireduce.sim.trace_mutate import mutate

# (scenario, seed, backpressure) replayed through amaranth.sim: a second simulator next
# to the Verilated core of tests/test_cosim_replay.py, which runs every scenario, seeds
# and mutated traces. "mutated" is `reorder` with random bit flips, truncations,
# duplicates and shuffles (sim/trace_mutate.py), replayed with outputs stalled at random.
CASES = (("loss", 0, 0.0), ("duplicates", 0, 0.0), ("mutated", 5, 0.3), ("strangers", 1, 0.0))
# In-band exponents (INBAND_PARAMS, five ops): the largest proposal of op 3 lost and the
# peers' frames late (incomplete, then exponent mismatches), a host predicting too small
# (saturation); tests/test_cosim_replay.py runs every in-band scenario.
INBAND_CASES = (("silent", 0), ("predicted", 0))
SCENARIO_SEEDS = (("clean", 0), ("loss", 0), ("duplicates", 0), ("late", 0), ("malformed", 0),
                  ("stale_future", 0), ("unknown_rank", 0), ("mutated", 5))  # fmt: skip

# Warning classes of `verilator -Wall` that Amaranth's Verilog back end (yosys
# write_verilog) emits by construction, none of which is a design error:
WAIVED = {
    "UNUSEDSIGNAL": "bits of wide intermediate wires that no logic reads",
    "PROCASSINIT": "registers carry their reset value as a declaration initialiser",
    "CASEINCOMPLETE": "case statements after a default assignment",
    "WIDTHEXPAND": "yosys operators zero-extend operands to the result width",
    "WIDTHTRUNC": "`!x` on multi-bit x and `>>` bit selects of $shiftx cells",
    "UNSIGNED": "`x >= 0` from range checks of unsigned values",
    "ASCRANGE": "[0:n] ranges of one-bit memories",
    "DECLFILENAME": "hierarchical module names (nic_core.aggregator) in one file",
    "VARHIDDEN": "a wire named like a submodule instance (decoder `signs`)",
}


def _trace(scenario: str, seed: int) -> list:
    if scenario == "mutated":
        return mutate(make_trace("reorder", seed), seed, rate=0.18)
    return make_trace(scenario, seed)


@pytest.mark.deep
def test_core_matches_model():
    """Identical frames at their ticks (net_tx and the RESULT/STATS records), bit-identical
    results and identical counters, for every case."""
    failures = {}
    for bp in sorted({bp for _, _, bp in CASES}):
        sel = [c for c in CASES if c[2] == bp]
        traces = [_trace(s, seed) for s, seed, _ in sel]
        for (s, seed, _), trace, core in zip(
            sel, traces, replay_traces(traces, backpressure=bp, seed=7), strict=True
        ):
            model = replay(trace, "model")
            n_tx = sum(not host_port.is_host_frame(f) for _, f in model.frames)
            assert n_tx == model.counters["tx_scatter"] + model.counters["tx_gather"] > 0
            bad = differences(core, model)
            if bad:
                failures[f"{s}-{seed}-bp{bp}"] = bad
    assert not failures, failures


@pytest.mark.deep
def test_core_matches_model_inband():
    """The same equality on in-band traces, the exponent counters included."""
    traces = [make_trace(s, seed, inband=True) for s, seed in INBAND_CASES]
    failures, seen = {}, {}
    for (s, seed), trace, core in zip(INBAND_CASES, traces, replay_traces(traces), strict=True):
        model = replay(trace, "model")
        bad = differences(core, model)
        if bad:
            failures[f"{s}-{seed}"] = bad
        seen.update({k: v + seen.get(k, 0) for k, v in core.exp_counters.items()})
    assert not failures, failures
    for k in ("exp_given", "exp_inband", "exp_incomplete", "exp_missing", "exp_saturated"):
        assert seen[k] > 0, seen


@pytest.mark.parametrize("params", [TRACE_PARAMS, SLIM_PARAMS], ids=["32bit", "slim24bit"])
def test_core_matches_model_across_the_tick_wrap(params):
    """The core's clock (32 bits, and the 25F's 24) starts just before its wrap
    (hw/deadline.py, "Ticks"), the model's does not wrap: with the trace's ticks moved
    there for both, the outputs are the same, the STATS ticks as their low bits. The ops
    are in flight across the wrap, with losses (deadline ends, a floor set before the
    wrap and compared after it) and peers' frames ahead of our START."""
    wrap = 1 << params.tick_bits
    trace = make_trace("loss", 1, params=params)  # records before and after tick 100
    tick0 = wrap - 100  # the last op starts before the wrap and ends after it
    moved = [(t + tick0, f) for t, f in trace]
    model = replay(moved, "model")
    core = replay_traces([moved], tick0=tick0)[0]
    assert not differences(core, model)
    ends = [t for t, f in model.frames if host_port.is_host_frame(f)]
    assert min(ends) < wrap <= max(ends), ends  # records on both sides of it
    assert model.counters["rx_scatter"] > 0 and core.sim["ticks"] > wrap


def test_scenarios_exercise_their_rules():
    """The traces are not all clean: each has the drops its scenario is about (model)."""
    c = {s: replay(_trace(s, seed), "model").counters for s, seed in SCENARIO_SEEDS}
    assert c["loss"]["rx_scatter"] + c["loss"]["rx_gather"] < (
        c["clean"]["rx_scatter"] + c["clean"]["rx_gather"]
    )
    assert c["duplicates"]["duplicate"] + c["duplicates"]["late"] > 0
    assert c["late"]["stale_op"] > 0
    assert c["stale_future"]["stale_op"] > 0 and c["stale_future"]["future_op"] > 0
    assert c["unknown_rank"]["unknown_rank"] > 0 and c["unknown_rank"]["own_rank"] > 0
    assert sum(c["malformed"][r] for r in ("truncated", "not_ipv4", "bad_length")) > 0
    assert c["mutated"]["truncated"] > 0 and c["mutated"]["duplicate"] > 0


def test_stats_record_length():
    """The record the core emits is the one host_port defines (STATS_FIELDS + histogram)."""
    for world in (2, 3, 8):
        assert stats_len(world) == len(host_port.STATS_FIELDS) + world + 1


def test_lanes_must_be_one():
    with pytest.raises(ValueError, match="lanes"):
        NicCore(TRACE_PARAMS.replace(lanes=2))


@pytest.mark.parametrize("p", [TRACE_PARAMS, INBAND_PARAMS], ids=["given", "inband"])
def test_verilog_lints_clean(p):
    """`verilator --lint-only -Wall` on the core's Verilog: no error, and no warning
    outside the code generator's idioms listed in WAIVED."""
    root = use_verilator()
    path = verilog.write(NicCore(p), "nic_core", kind="lint")
    cmd = [str(root / "bin" / "verilator"), "--lint-only", "-Wall", "--top-module", "nic_core"]
    cmd += [f"-Wno-{w}" for w in WAIVED] + [path.name]
    r = subprocess.run(cmd, cwd=path.parent, capture_output=True, text=True, timeout=600)
    found = sorted(set(re.findall(r"%(?:Warning|Error)-?([A-Z0-9_]*)", r.stderr)))
    assert r.returncode == 0 and not r.stderr.strip(), f"lint: {found}\n{r.stderr[:3000]}"
