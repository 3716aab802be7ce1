"""The DDP hook in real training set-ups, each against plain DDP (gloo) in the same processes.

Every rank trains `ref` (gloo) and `hk` (the hook) side by side; hk starts each step from
ref's parameters (tests/ddp_setup_workers.py). Checked per step: every hook gradient within
the numerics bound of gloo's (docs/numerics.md 8, plus each dtype's rounding), the same
non-finite picture and step decisions as gloo, hk's replicas bit-identical, the hook's
counters. No loss is injected; t_B is generous (this is about the arithmetic path).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ddp_setup_workers import scenarios_worker, setup_worker
from tests.live_workers import spawn_world

LOSSLESS = {"t_b_us": 3_000_000, "params": {"t_b_us": 3_000_000, "t_c_min_us": 2_000_000}}


# The two-rank set-ups, run one after the other in one spawned world (shared_world).
SCENARIOS = {
    "bfloat16": {"dtype": "bfloat16", "iters": 6},
    "float16": {"dtype": "float16", "iters": 6},
    "find_unused": {"find_unused": True, "iters": 6},
    "bucket_view": {"bucket_view": True, "iters": 5, "bucket_cap_mb": 0.01},
    "no_sync": {"accumulate": 3, "iters": 5},
    "many_buckets": {"layers": "varied", "bucket_cap_mb": 0.02, "iters": 5},
    "drift_bf16": {"dtype": "bfloat16", "iters": 5, "checksum_every": 1, "perturb_at": 3},
    "nan_params": {"iters": 5, "inject_inf_at": [2], "overflow_rank": 1, "checksum_every": 1},
    "one_inf": {"amp": True, "iters": 6, "inject_inf_at": [3], "overflow_rank": 1,
                "layers": "varied", "bucket_cap_mb": 0.02, "policy": "skip"},
}  # fmt: skip


def run(tmp_path, cfg: dict, world: int = 2, timeout_s: float = 240) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spawn_world(setup_worker, (world, str(tmp_path), {**LOSSLESS, **cfg}), world, timeout_s)
    return [json.loads((tmp_path / f"setup{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def shared_world(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("setups")
    cfgs = {k: {**LOSSLESS, **v} for k, v in SCENARIOS.items()}
    spawn_world(scenarios_worker, (2, str(tmp), cfgs), 2, 600)
    return tmp


def scenario(tmp: Path, name: str) -> list[dict]:
    outs = []
    for r in range(2):
        f = tmp / name / f"setup{r}.json"
        assert f.exists(), f"{name}: did not run (an earlier set-up failed)"
        out = json.loads(f.read_text())
        assert "error" not in out, out["error"]
        outs.append(out)
    return outs


def check_common(ranks: list[dict], iters: int, warmup: int = 2) -> None:
    for out in ranks:
        steps = out["steps"]
        assert [s["it"] for s in steps] == list(range(steps[0]["it"], iters))
        for s in steps:
            assert s["replicas_equal"], s["it"]
            assert s["none_mismatch"] == 0, s
            assert s["nonfinite_hk"] == 0 and s["nonfinite_ref"] == 0, s
            assert s["worst"] <= 1.0, s  # every gradient within the bound of gloo's
            modes = {b["mode"] for b in s["buckets"]}
            assert modes == ({"warmup"} if s["it"] < warmup else {"optireduce"}), s
            assert all(b["lost"] == 0 and b["saturations"] == 0 for b in s["buckets"]), s
            assert all(b["nonfinite_ops"] == b["nonfinite_inputs"] == 0 for b in s["buckets"])
            assert s["hk_stepped"] and s["ref_stepped"]
    # both ranks saw the same steps
    digests = [[s["hk_digest"] for s in out["steps"]] for out in ranks]
    assert all(d == digests[0] for d in digests)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_gradients(shared_world, dtype):
    """The whole model in bfloat16 / float16: buckets of that dtype, converted to float32
    for the op and back; results within gloo's rounding of the same sum."""
    ranks = scenario(shared_world, dtype)
    check_common(ranks, 6)
    assert any(s["worst"] > 0 for s in ranks[0]["steps"])  # the comparison saw differences


def test_find_unused_parameters(shared_world):
    """Odd steps use the `other` head, even steps `head`: DDP marks the unused ones ready
    and their gradients stay None on both sides."""
    ranks = scenario(shared_world, "find_unused")
    check_common(ranks, 6)


def test_gradient_as_bucket_view(shared_world):
    ranks = scenario(shared_world, "bucket_view")
    check_common(ranks, 5)
    assert all(s["grad_is_view"] for s in ranks[0]["steps"])


def test_no_sync_accumulation(shared_world):
    """Three micro-batches per step, the first two under no_sync(): one hook call per bucket
    per step, on the accumulated gradient."""
    ranks = scenario(shared_world, "no_sync")
    check_common(ranks, 5)
    for s in ranks[0]["steps"]:
        assert len({b["index"] for b in s["buckets"]}) == len(s["buckets"])  # once each


def test_many_buckets_of_different_sizes(shared_world):
    """bucket_cap_mb = 0.02 on layers of 0.2k to 15.4k parameters: 4 buckets (measured: 19395,
    14464, 9900 and 4248 elements), sizes apart by more than 3x, each its own ops."""
    ranks = scenario(shared_world, "many_buckets")
    check_common(ranks, 5)
    sizes = [b["elements"] for b in ranks[0]["steps"][-1]["buckets"]]
    assert len(sizes) >= 4 and max(sizes) >= 3 * min(sizes), sizes


def test_amp_overflow_on_one_rank_skips_the_step_everywhere(tmp_path):
    """fp16 autocast with GradScaler, 3 ranks. At steps 1 (warm-up) and 4 rank 2's batch
    overflows fp16: its gradient holds inf/NaN. With gloo every rank's averaged gradient is
    non-finite, so every scaler skips the step and halves the scale; the hook must do the
    same: the same scale sequence, the same skipped steps, replicas equal."""
    iters, bad = 8, (1, 4)
    ranks = run(tmp_path, {"amp": True, "iters": iters, "overflow_at": bad, "overflow_rank": 2},
                world=3)  # fmt: skip
    for rank, out in enumerate(ranks):
        steps = out["steps"]
        assert [s["scale0"] for s in steps] == [s["scale1"] for s in steps]  # gloo's = hook's
        assert [s["ref_stepped"] for s in steps] == [i not in bad for i in range(iters)]
        assert [s["hk_stepped"] for s in steps] == [i not in bad for i in range(iters)]
        assert all(s["replicas_equal"] for s in steps)
        for s in steps:
            nf_in = sum(b["nonfinite_inputs"] for b in s["buckets"])
            nf_ops = sum(b["nonfinite_ops"] for b in s["buckets"])
            if s["it"] in bad:
                assert s["nonfinite_ref"] > 0 and s["nonfinite_hk"] > 0, s
                assert nf_ops >= 1, s  # counted on every rank
                assert (nf_in > 0) == (rank == 2), s  # the inputs only where they were
            else:
                assert s["nonfinite_ref"] == s["nonfinite_hk"] == nf_in == nf_ops == 0, s
                assert s["worst"] <= 1.0, s
    scales = [s["scale1"] for s in ranks[0]["steps"]]
    assert scales[1] == scales[0] / 2 and min(scales) < max(scales)  # halved, and grown
    assert len({out["steps"][-1]["hk_digest"] for out in ranks}) == 1


def test_a_drifted_replica_is_resynced_in_bfloat16(shared_world):
    """bfloat16 parameters (numpy has no such dtype): rank 1's copy drifts at step 3, the
    replica check (every step here) finds it and copies rank 0's parameters."""
    ranks = scenario(shared_world, "drift_bf16")
    for out in ranks:
        assert [s["resynced"] for s in out["steps"]] == [False, False, False, True, False]
        assert all(s["replicas_equal"] for s in out["steps"])
    assert ranks[0]["steps"][-1]["hk_digest"] == ranks[1]["steps"][-1]["hk_digest"]


def test_state_saved_and_restored_mid_training_continues_identically(tmp_path):
    """The hook's state is its configuration (params, policy, thresholds, seed, impairment),
    the calibrated t_B, the iteration count and the per-step history: pickled with the
    model at step 4 of 8, it restores in new processes (a new process group, a new NIC)
    without a second warm-up and with the same t_B. With the transform off the results do
    not depend on op ids, so the restored run's parameters equal the uninterrupted run's
    bit for bit at every step (with the RHT they differ within the bound: the restored NIC
    numbers its ops from 0, and the signs are keyed by op id)."""
    cfg = {"iters": 8, "params": {**LOSSLESS["params"], "rht": False}}
    full = run(tmp_path / "a", {**cfg, "save_at": 4})
    back = run(tmp_path / "b", {**cfg, "restore_from": str(tmp_path / "a")})
    for a, b in zip(full, back, strict=True):
        assert [s["it"] for s in b["steps"]] == [4, 5, 6, 7]
        assert {bk["mode"] for s in b["steps"] for bk in s["buckets"]} == {"optireduce"}
        assert b["t_b_us"] == a["t_b_us"] == b["nic_t_b_us"] == a["nic_t_b_us"]
        assert b["iteration"] == a["iteration"] == 8 and b["history_len"] == 8
        for sa, sb in zip(a["steps"][4:], b["steps"], strict=True):
            assert sa["ref_digest"] == sb["ref_digest"]  # gloo: the same starting point
            assert sa["hk_digest"] == sb["hk_digest"], sa["it"]  # the hook: the same bits
            assert sb["replicas_equal"] and sb["worst"] <= 1.0


def test_one_inf_entry_in_one_bucket_skips_the_step_everywhere(shared_world):
    """fp16 autocast with GradScaler, 2 ranks, 5 buckets, policy `skip` (the bucket's loss
    decision is a collective). At step 3 rank 1's first-layer gradient gets one inf entry:
    gloo's average has exactly that entry non-finite; the hook's has that bucket NaN and
    every other bucket within the bound. Every scaler skips that step, as with gloo."""
    iters = 6
    ranks = scenario(shared_world, "one_inf")
    for rank, out in enumerate(ranks):
        steps = out["steps"]
        assert [s["scale0"] for s in steps] == [s["scale1"] for s in steps]
        assert [s["ref_stepped"] for s in steps] == [i != 3 for i in range(iters)]
        assert [s["hk_stepped"] for s in steps] == [i != 3 for i in range(iters)]
        for s in steps:
            assert s["replicas_equal"] and s["worst"] <= 1.0, s  # finite entries: the bound
            bad = [b for b in s["buckets"] if b["nonfinite_ops"]]
            if s["it"] != 3:
                assert not bad and s["nonfinite_ref"] == s["nonfinite_hk"] == 0, s
                continue
            assert s["nonfinite_ref"] == 1  # gloo: the one entry
            assert len(bad) == 1 and len(s["buckets"]) >= 4, s  # the hook: its bucket
            assert s["nonfinite_hk"] == bad[0]["elements"], s
            assert bad[0]["nonfinite_inputs"] == (1 if rank == 1 else 0)
            assert all(b["mode"] == "optireduce" for b in s["buckets"])  # not zeroed


def test_nan_parameters_are_not_a_drift(shared_world):
    """Without a scaler an inf gradient (rank 1, step 2) makes parameters NaN on every rank,
    with gloo as with the hook. The replica check (every step) compares checksum bits, so
    identical NaN replicas are not taken for a drift and resynced at every check."""
    ranks = scenario(shared_world, "nan_params")
    for out in ranks:
        steps = out["steps"]
        assert [s["hk_finite"] for s in steps] == [True, True, False, False, False]
        assert all(s["replicas_equal"] for s in steps)
        assert not any(s["resynced"] for s in steps)
        assert [bool(s["nonfinite_ref"]) for s in steps] == [False, False, True, True, True]
