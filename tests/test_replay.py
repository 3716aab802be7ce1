"""Traces and replay through the model: scenarios, pcap round trip, exact outcomes."""

import subprocess
import sys

import numpy as np
import pytest

from optireduce import host_port, simulate_allreduce
from optireduce.sim.replay import ReplayError, replay
from optireduce.sim.trace import (
    OP_LEN,
    OPS,
    SCENARIOS,
    TRACE_PARAMS,
    WORLD,
    make_trace,
    read_pcap,
    write_pcap,
)

DROPS = ("stale_op", "future_op", "unknown_rank", "own_rank", "duplicate", "late")


def test_clean_replay_gives_rank0_of_the_cluster_bit_for_bit():
    seed = 3
    res = replay(make_trace("clean", seed))
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(OPS * OP_LEN).astype(np.float32) for _ in range(WORLD)]
    want, _ = simulate_allreduce(xs, params=TRACE_PARAMS, calibrate=False)
    got = np.concatenate([res.results[k] for k in range(OPS)])
    np.testing.assert_array_equal(got, want[0])
    assert sum(res.counters[r] for r in DROPS) == 0


def test_pcap_round_trip(tmp_path):
    frames = make_trace("malformed", 1)
    write_pcap(tmp_path / "t.pcap", frames)
    assert read_pcap(tmp_path / "t.pcap") == frames


def test_replay_is_deterministic():
    a, b = replay(make_trace("reorder", 2)), replay(make_trace("reorder", 2))
    assert a.frames == b.frames and a.counters == b.counters


def test_injected_frames_are_counted_exactly():
    clean = replay(make_trace("clean", 4)).counters
    sf = replay(make_trace("stale_future", 4)).counters
    assert (sf["stale_op"], sf["future_op"]) == (5, 5)
    ur = replay(make_trace("unknown_rank", 4)).counters
    assert (ur["unknown_rank"], ur["own_rank"]) == (4, 2)
    for c in (sf, ur):  # the good frames are untouched by the bad ones
        assert (c["rx_scatter"], c["rx_gather"]) == (clean["rx_scatter"], clean["rx_gather"])


def test_malformed_frames_each_dropped_once():
    frames = make_trace("malformed", 5)
    clean = replay(make_trace("clean", 5))
    res = replay(frames)
    injected = len(frames) - len(make_trace("clean", 5))
    drops = sum(v for k, v in res.counters.items() if k not in
                ("rx_scatter", "rx_gather", "tx_scatter", "tx_gather", "ops_started",
                 "ops_completed", "host_malformed"))  # fmt: skip
    assert drops == injected > 0
    for k in range(OPS):
        np.testing.assert_array_equal(res.results[k], clean.results[k])


def test_loss_and_duplicates_show_in_the_counters():
    clean = replay(make_trace("clean", 6)).counters
    lossy = replay(make_trace("loss", 6))
    assert lossy.counters["rx_scatter"] + lossy.counters["rx_gather"] < (
        clean["rx_scatter"] + clean["rx_gather"]
    )
    assert len(lossy.results) == OPS  # every op still ends (by its deadline)
    dup = replay(make_trace("duplicates", 6)).counters
    assert dup["duplicate"] + dup["late"] + dup["stale_op"] > 0


def test_results_are_host_frames_in_the_output():
    res = replay(make_trace("clean", 7))
    kinds = [host_port.parse(f).kind for _, f in res.frames if host_port.is_host_frame(f)]
    assert kinds.count(host_port.STATS) == OPS and host_port.RESULT in kinds


def test_bad_traces_and_backends():
    with pytest.raises(ReplayError, match="no CONFIG"):
        replay([])
    with pytest.raises(ReplayError, match="unknown backend"):
        replay(make_trace("clean", 0), backend="fpga")  # rtl: tests/test_cosim_replay.py


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cli_make_and_replay(tmp_path, scenario):
    out = tmp_path / f"{scenario}.pcap"
    cmd = [sys.executable, "-m", "optireduce.cli"]
    make = [*cmd, "trace", "make", "--scenario", scenario, "--seed", "1", "-o", str(out)]
    r = subprocess.run(make, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*cmd, "replay", str(out), "--json", "-o", str(tmp_path / "o.pcap")],
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert '"ops_completed": 3' in r.stdout
    assert len(read_pcap(tmp_path / "o.pcap")) == len(replay(make_trace(scenario, 1)).frames)


def test_cli_unreadable_trace(tmp_path):
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"not a pcap at all")
    r = subprocess.run([sys.executable, "-m", "optireduce.cli", "replay", str(bad)],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2 and "not a pcap" in r.stderr
