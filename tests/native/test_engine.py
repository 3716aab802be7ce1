"""The native event engine against the Python model, bit for bit.

(a) random lossy clusters: every rank runs NicModel and the native engine side by side;
    frames, results, stats, counters and timers are compared after every event;
(b) the trace suite: every scenario of sim/trace.py (and mutated copies) replayed through
    both backends gives the same output frames and counters;
(c) mutated datagrams: each kind of bad frame is dropped and counted as the model counts
    it, and the results stay those of the clean run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from engine_twin import Plan, Twin, allreduce_on_model_and_engine, run_cluster
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from optireduce import ubt
from optireduce.counters import COUNTERS
from optireduce.host.native.engine import NativeNicModel
from optireduce.params import NicParams
from optireduce.sim.replay import differences, replay
from optireduce.sim.trace import SCENARIOS, TRACE_PARAMS, make_trace
from optireduce.sim.trace_mutate import mutate

DROPS = ubt.DROP_REASONS


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    pp = draw(st.sampled_from([2, 4, 8, 16]))
    b = max(pp * draw(st.sampled_from([1, 2, 4, 8])), 2)
    c = b * draw(st.sampled_from([1, 2, 4]))
    t_b = draw(st.integers(20, 600))
    k = draw(st.sampled_from([1, 2, 2, 3]))
    inband = draw(st.sampled_from([False, False, True]))
    params = NicParams(
        p=pp, b=b, c=c, n_max=8,
        ops_in_flight=k,
        exp_inband=inband,
        exp_lead=draw(st.sampled_from([None, k, k + 1])),
        t_b_us=t_b,
        t_c_min_us=draw(st.integers(1, t_b)),
        t_c_init_us=draw(st.one_of(st.none(), st.integers(1, t_b))),
        alpha_q8=draw(st.integers(1, 256)),
        tc_dev_mult=draw(st.sampled_from([0, 2, 4])),
        tc_sample=draw(st.sampled_from(["duration", "last_arrival"])),
        progress_ahead=draw(st.booleans()),
        last_percent=draw(st.sampled_from([1, 5, 30, 100])),
        estimator=draw(st.sampled_from(["unbiased", "plain"])),
        rht=draw(st.sampled_from([True, True, False])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )  # fmt: skip
    world = draw(st.sampled_from([2, 3, 4, 5, 8]))
    n_ops = draw(st.integers(1, 10 if inband else 4))
    size = st.one_of(st.sampled_from([c, c, c - 1, c // 2 + 1]), st.integers(1, c))
    lens = draw(st.lists(size, min_size=n_ops, max_size=n_ops))
    dead = draw(st.one_of(st.none(), st.integers(0, world - 1)))
    return Plan(
        params=params, world=world, lens=lens, seed=draw(st.integers(0, 2**32 - 1)),
        loss=draw(st.sampled_from([0.0, 0.0, 0.02, 0.2])),
        dup=draw(st.sampled_from([0.0, 0.05, 0.3])),
        max_delay=draw(st.sampled_from([1, 20, 200, 2000])),
        start_gap=draw(st.sampled_from([0, 30, 300])),
        datagram=draw(st.sampled_from([0.0, 0.5])),
        mutate=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        dead=dead, dead_at=draw(st.integers(0, 800)),
        detect=draw(st.sampled_from([None, 0, 50, 1000])),
        mismatch=draw(st.sampled_from([None, None, None, "exponent", "length"])),
        first_op=draw(st.sampled_from([0, 0, 1, 2**31 - 7])),
        retune_at=draw(st.one_of(st.none(), st.integers(0, 600))),
        retune_t_b=draw(st.integers(1, 2 * t_b)),
        data=draw(st.sampled_from(["normal", "normal", "nonfinite", "saturate"])),
        no_proposal=draw(st.sampled_from([0.0, 0.0, 0.2])),
        fetch=draw(st.sampled_from([0.0, 0.5])),
    )  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
def test_random_clusters_run_identically(plan):
    nodes = run_cluster(plan)
    rx = sum(n.native.counters["rx_scatter"] + n.native.counters["rx_gather"] for n in nodes)
    event(f"frames accepted: {'0' if rx == 0 else '<100' if rx < 100 else '>=100'}")
    event(f"ops completed: {sum(len(n.results) for n in nodes)}")
    inb = sum(n.native.exp_counters[k] for n in nodes for k in ("exp_inband", "exp_incomplete"))
    event(f"in-band ops: {'0' if inb == 0 else '>0'}")


@pytest.mark.parametrize("tc_sample", ["duration", "last_arrival"])
def test_a_cluster_exercises_every_rule(tc_sample):
    """One seeded run per shape, with the rules each must show (so the property test above
    is known to compare more than idle engines)."""
    p = NicParams(p=4, b=16, c=64, n_max=8, t_b_us=300, t_c_min_us=5, last_percent=30,
                  tc_sample=tc_sample)  # fmt: skip
    seen: dict[str, int] = dict.fromkeys(COUNTERS, 0)
    reasons: set[str] = set()
    stats = dict.fromkeys(("sat_quantize", "nonfinite", "late", "duplicate"), 0)
    for seed in range(6):
        plan = Plan(params=p, world=4, lens=[64, 50, 64, 9], seed=seed, loss=0.1, dup=0.2,
                    max_delay=120, mutate=0.2, datagram=0.3, dead=3, dead_at=400,
                    detect=100, mismatch=(None, "exponent", "length")[seed % 3],
                    data=("normal", "saturate", "nonfinite")[seed // 2 % 3])  # fmt: skip
        for node in run_cluster(plan):
            for k, v in node.native.counters.items():
                seen[k] += v
            for r in node.results:
                reasons |= {r.stats.phase1_reason, r.stats.phase2_reason}
                for k in stats:
                    stats[k] += getattr(r.stats, k)
    assert reasons == {"complete", "early", "deadline"}
    assert all(stats.values()), stats
    for k in ("duplicate", "late", "exponent_mismatch", "bad_length", "bad_ip_checksum",
              "truncated", "stale_op", "future_op", "wrong_job", "unknown_rank", "rx_scatter",
              "rx_gather", "ops_completed"):  # fmt: skip
        assert seen[k] > 0, k


def test_a_straggler_every_op_moves_t_c_only_under_last_arrival():
    """Rank 3 starts every op 400 ticks late (t_B 300): the others' phases end by their
    deadline. Under "duration" each of them samples T, under "last_arrival" the arrivals of
    the ranks in time; model and engine agree on every t_C either way, and the t_C the
    ranks in time report differ between the rules (the property test's draws cover both,
    this shows the second is not idle)."""
    tcs = {}
    for rule in ("duration", "last_arrival"):
        p = NicParams(p=4, b=16, c=64, n_max=8, t_b_us=300, t_c_min_us=5, tc_dev_mult=2,
                      tc_sample=rule)  # fmt: skip
        plan = Plan(params=p, world=4, lens=[64] * 8, seed=3, max_delay=20, start_gap=30,
                    slow=3, slow_by=400)  # fmt: skip
        nodes = run_cluster(plan)
        stats = [r.stats for n in nodes[:3] for r in n.results]
        assert len(stats) == 3 * 8 and "deadline" in {s.phase1_reason for s in stats}
        tcs[rule] = [s.t_c_us for s in stats]
    assert tcs["duration"] != tcs["last_arrival"]
    # a phase cut by its deadline samples less than its duration: t_C only comes down
    assert max(max(t) for t in tcs["last_arrival"]) <= max(max(t) for t in tcs["duration"])


def test_an_inband_cluster_exercises_every_exponent_rule():
    """Seeded in-band runs (NicParams.exp_inband) with loss, a straggling start and hosts
    that sometimes give no proposal: model and engine agree on every exponent counter, and
    each rule shows up."""
    p = NicParams(p=4, b=16, c=64, n_max=8, t_b_us=200, t_c_min_us=5, last_percent=30,
                  exp_inband=True, exp_lead=2)  # fmt: skip
    seen = dict.fromkeys(("exp_given", "exp_inband", "exp_incomplete", "exp_followed",
                          "exp_missing", "exp_saturated"), 0)  # fmt: skip
    mismatch = 0
    for seed in range(8):
        plan = Plan(params=p, world=4, lens=[64, 33, 64, 64, 17, 64, 64, 64, 40, 64], seed=seed,
                    loss=0.25, dup=0.1, max_delay=150, start_gap=(10, 120)[seed % 2],
                    datagram=0.3, mutate=0.1, no_proposal=0.1, fetch=(0.0, 0.5)[seed // 4],
                    data=("normal", "saturate")[seed // 2 % 2],
                    slow=(None, 3)[seed % 2], slow_by=400)  # fmt: skip
        for node in run_cluster(plan):
            for k in seen:
                seen[k] += node.native.exp_counters[k]
            mismatch += node.native.counters["exponent_mismatch"]
    assert all(seen.values()), seen
    assert mismatch > 0


# ---- (b) the trace suite ------------------------------------------------------------------


def both(frames: list) -> tuple:
    a, b = replay(frames, "model"), replay(frames, NativeNicModel)
    assert differences(a, b) == []
    assert json.dumps(a.counters, sort_keys=True) == json.dumps(b.counters, sort_keys=True)
    assert a.frames == b.frames
    return a, b


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("seed", [0, 1])
def test_trace_scenarios_replay_identically(scenario, seed):
    a, _ = both(make_trace(scenario, seed))
    assert len(a.results) > 0 and len(a.frames) > 0


@pytest.mark.parametrize("seed", range(4))
def test_mutated_traces_replay_identically(seed):
    both(mutate(make_trace("reorder", seed), seed, rate=0.3))


def test_a_pcap_trace_replays_identically(tmp_path):
    from optireduce.sim.trace import write_pcap

    frames = make_trace("loss", 3)
    write_pcap(tmp_path / "t.pcap", frames)
    from optireduce.sim.trace import read_pcap

    a, b = both(read_pcap(tmp_path / "t.pcap"))
    assert a.summary() == b.summary()


# ---- (c) mutated datagrams --------------------------------------------------------------


def _rewrite(frame: bytes, **fields: int) -> bytes:
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(**fields)
    dst = int.from_bytes(frame[0:6], "big") - ubt.DEFAULT_ADDRESSING.mac_base
    payload = frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :]
    return ubt.build_frame(h, payload, src=h.sender, dst=dst, port=TRACE_PARAMS.udp_port)


def _flip(frame: bytes, byte: int, bit: int = 0) -> bytes:
    b = bytearray(frame)
    b[byte] ^= 1 << bit
    return bytes(b)


# kind -> (the reason it must be counted under, how to make it from a good frame of rank 0's
# trace). None: the reason depends on the state the frame meets (the model's count is used).
MUTATIONS = {
    "ip_bit_flip": ("bad_ip_checksum", lambda f, r: _flip(f, 14 + int(r.integers(2, 8)))),
    "short": ("truncated", lambda f, r: f[: int(r.integers(0, ubt.L2_L4_LEN))]),
    "cut_payload": ("truncated", lambda f, r: f[: int(r.integers(ubt.L2_L4_LEN + 1, len(f)))]),
    "garbage": (None, lambda f, r: bytes(r.integers(0, 256, int(r.integers(1, 300)), np.uint8))),
    "stale": ("stale_op", None),  # made at the end of the trace, below
    "future": ("future_op", lambda f, r: _rewrite(f, op_id=40 + int(r.integers(0, 9)))),
    "wrong_job": ("wrong_job", lambda f, r: _rewrite(f, job_id=TRACE_PARAMS.job_id + 1)),
    "version": ("bad_version", lambda f, r: _rewrite(f, version=int(r.integers(2, 256)))),
    "unknown_rank": ("unknown_rank", lambda f, r: _rewrite(f, sender=int(r.integers(3, 9)))),
    "own_rank": ("own_rank", lambda f, r: _rewrite(f, sender=0)),
    "out_of_range": ("index_out_of_range", lambda f, r: _rewrite(f, pkt_index=16 + r.integers(9))),
    "wrong_world": ("malformed_header", lambda f, r: _rewrite(f, world=5)),
    "payload_flip": (None, lambda f, r: _flip(f, int(r.integers(ubt.L2_L4_LEN + 32, len(f))))),
    "duplicate": (None, lambda f, r: f),
}  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_mutated_datagrams_are_counted_as_the_model_counts_them(seed):
    clean = make_trace("clean", seed)
    net = [(k, t, f) for k, (t, f) in enumerate(clean) if f[12:14] == b"\x08\x00"]
    rng = np.random.default_rng(seed + 100)
    inject: dict[int, list[bytes]] = {}  # after frame k of the clean trace
    want: dict[str, int] = dict.fromkeys(DROPS, 0)
    n_injected = 0
    for reason, make in MUTATIONS.values():
        if make is None:
            continue
        for _ in range(4):
            k, _, f = net[int(rng.integers(0, len(net)))]
            inject.setdefault(k, []).append(make(f, rng))
            n_injected += 1
            if reason is not None:
                want[reason] += 1
    frames = []
    for k, (t, f) in enumerate(clean):
        frames.append((t, f))
        # a copy comes one tick after the original at the earliest
        frames += [(t + 1, g) for g in inject.get(k, [])]
    frames.sort(key=lambda e: e[0])
    end = frames[-1][0] + 3 * TRACE_PARAMS.t_b_us * 4
    stale = [(end + j, f) for j, (_, _, f) in enumerate(net[:5])]  # op 0..: long gone
    want["stale_op"] += len(stale)
    n_injected += len(stale)
    _, b = both(frames + stale)
    ref = replay(clean, "model")
    # a frame may meet a window that has moved on (stale_op first), and garbage may read as
    # anything (not_ipv4, truncated, ...): those reasons are lower bounds, the rest exact
    exact = {"bad_ip_checksum", "wrong_job", "bad_version", "unknown_rank", "own_rank",
             "future_op"}  # fmt: skip
    for r in exact:
        assert b.counters[r] - ref.counters[r] == want[r] > 0, r
    for r in ("truncated", "malformed_header", "stale_op"):
        assert b.counters[r] - ref.counters[r] >= want[r] > 0, r
    drops = sum(b.counters[r] - ref.counters[r] for r in DROPS)
    assert drops == n_injected  # every bad frame dropped once, under one reason
    assert sorted(b.results) == sorted(ref.results)
    for op, x in ref.results.items():  # the aggregates are those of the clean run
        np.testing.assert_array_equal(b.results[op].view(np.uint32), x.view(np.uint32))


def test_start_op_errors_match_the_model():
    p = TRACE_PARAMS
    t = Twin(p, 0, 3)
    x = np.ones(10, np.float32)
    t.call("start_op", 0, 1, x, 0)  # not the next op
    t.call("start_op", 0, 0, np.ones(p.c + 1, np.float32), 0)  # too long
    t.call("start_op", 0, 0, x, 200)  # exponent outside int8
    t.call("start_op", 0, 0, x.astype(np.float64), 0)  # not float32
    t.call("start_op", 0, 0, x, 0)
    t.call("start_op", 0, 1, x, 0)
    t.call("start_op", 0, 2, x, 0)  # outside the window
    t.collect()
    with pytest.raises(ValueError):
        t.native.exclude(0, 3)


# ---- a model user taking the engine unchanged ---------------------------------------------


@pytest.mark.parametrize("drop_rate", [0.0, 0.05])
def test_the_virtual_cluster_runs_on_the_engine_unchanged(monkeypatch, drop_rate):
    from optireduce.host.model.impairment import ImpairmentSpec

    p = NicParams(p=64, b=1024, c=4096, n_max=8, t_b_us=3000)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(10_000).astype(np.float32) for _ in range(4)]
    imp = ImpairmentSpec(median_us=20, p99_ratio=3.0, duplicate=0.02, reorder=0.05)
    kw = dict(params=p, drop_rate=drop_rate, seed=3, impairment=imp)
    _, ws, _, gs = allreduce_on_model_and_engine(monkeypatch, xs, **kw)
    assert gs.counters == ws.counters and gs.t_b_us == ws.t_b_us
    assert gs.per_worker == ws.per_worker and gs.elapsed_us == ws.elapsed_us
    assert sum(c["ops_completed"] for c in gs.counters) == 4 * 3


def test_calls_from_several_threads_are_serialised():
    """The event calls run without the GIL and a lock per engine keeps threads apart: calls
    from several threads at once neither crash nor lose a counted drop. (A smoke test: on a
    loaded 2-core machine the threads rarely overlap inside the engine.)"""
    import threading

    from optireduce.host.native.engine import NativeNicModel

    nic = NativeNicModel(TRACE_PARAMS, 0, 3)
    short = bytes(20)  # truncated
    per_thread, threads = 3000, 4

    def hammer() -> None:
        for k in range(per_thread):
            nic.receive(k, short)
            nic.receive_datagram(k, short)

    ts = [threading.Thread(target=hammer) for _ in range(threads)]
    for t in ts:
        t.start()
    for _ in range(200):
        assert nic.poll_tx() == [] and nic.next_timer() is None
    for t in ts:
        t.join()
    assert nic.counters["truncated"] == 2 * per_thread * threads


def test_bad_arguments_are_clear_errors():
    from optireduce.host.native.engine import NativeNicModel

    nic = NativeNicModel(TRACE_PARAMS, 0, 3)
    e = nic._e
    for bad in (lambda: e.tc(0), lambda: e.tc(3), lambda: e.tc_table(1, 3),
                lambda: e.tc_table(2, -1), lambda: nic.exclude(0, -1),
                lambda: e.set_t_b(0), lambda: nic.set_t_b(0)):  # fmt: skip
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError, match="must be in 2"):
        NativeNicModel(TRACE_PARAMS, 0, 9)
    with pytest.raises(ValueError, match="rank=3"):
        NativeNicModel(TRACE_PARAMS, 3, 3)
    with pytest.raises(ValueError, match="only t_b_us"):
        nic.p = TRACE_PARAMS.replace(p=8)


def test_a_cluster_at_the_hardware_packet_size():
    """p = 256 (1 KiB payloads), b = 4096, whole and partial chunks, with loss, duplicates,
    reordering and corrupted copies: the sizes the NIC runs at, not only the small ones."""
    p = NicParams(p=256, b=4096, c=16384, n_max=8, t_b_us=2000, t_c_min_us=20)
    plan = Plan(params=p, world=4, lens=[16384, 5000, 16384], seed=11, loss=0.03, dup=0.05,
                max_delay=300, mutate=0.02, datagram=0.5)  # fmt: skip
    nodes = run_cluster(plan)
    assert all(len(n.results) == 3 for n in nodes)
    assert sum(n.native.counters["rx_gather"] for n in nodes) > 100


@pytest.mark.parametrize("ahead", [False, True])
def test_a_rank_far_behind_catches_up_only_with_progress_ahead(ahead):
    """Rank 2 starts every op 3000 ticks late (t_B 300): the others run ops 0-11 by their
    deadlines (600 ticks a pair) and are more than 2K ops ahead of it, beyond its receive
    window. Their frames are dropped as future_op either way; under progress_ahead they
    still say the sender is done with op - K, so rank 2's ops 4-9 end at their start
    tick ("early": every peer gone) and it rejoins the others by op 10. Without it, each
    of those ops waits out both deadlines and rank 2 never catches up. Model and engine
    agree after every event (run_cluster)."""
    p = NicParams(p=4, b=16, c=64, n_max=8, t_b_us=300, t_c_min_us=5, progress_ahead=ahead)
    plan = Plan(params=p, world=3, lens=[64] * 12, seed=3, max_delay=20, start_gap=30,
                slow=2, slow_by=3000)  # fmt: skip
    nodes = run_cluster(plan)
    slow = {r.stats.op_id: r.stats for r in nodes[2].results}
    assert sorted(slow) == list(range(12))
    assert nodes[2].native.counters["future_op"] > 0
    peers_end = max(r.stats.end_us for n in nodes[:2] for r in n.results)
    for k in range(4, 10):
        st_ = slow[k]
        if ahead:
            assert (st_.phase1_reason, st_.phase2_reason) == ("early", "early"), k
            assert st_.end_us == st_.start_us, k
        else:
            assert (st_.phase1_reason, st_.phase2_reason) == ("deadline", "deadline"), k
            assert st_.end_us - st_.start_us == 2 * p.t_b_us, k
    if ahead:  # within one op pair of the others
        assert slow[11].end_us <= peers_end + 2 * p.t_b_us
    else:
        assert slow[11].end_us >= peers_end + 3 * 2 * p.t_b_us
