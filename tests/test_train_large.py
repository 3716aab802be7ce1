"""`optireduce train --model large`: the task, the model's size, and a smoke-sized run of
both methods (2 processes, 4 steps, a narrow student) through the same harness."""

import json

import numpy as np

from optireduce.experiments.large_model import LargeTask, flat, load_flat
from optireduce.experiments.train import LARGE, large_config, run_train


def test_default_model_has_over_ten_million_parameters():
    task = LargeTask()
    # dim -> width -> width -> classes, weights and biases, counted by hand
    assert task.n_params() == 256 * 3072 + 3072 + 3072 * 3072 + 3072 + 3072 * 10 + 10
    assert task.n_params() >= 10_000_000
    model = task.model(0)
    assert sum(p.numel() for p in model.parameters()) == task.n_params()
    assert large_config().model == "large" and large_config().steps == LARGE["steps"]


def test_task_is_deterministic_and_labelled_by_the_teacher():
    task = LargeTask(width=64)
    x, y = task.batch(3, 7, 1, 32)
    x2, y2 = task.batch(3, 7, 1, 32)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(task.batch(3, 7, 0, 32)[0], x)  # another rank, another batch
    # the labels are the teacher's argmax, written out here
    w1, w2 = task.teacher()
    logits = np.tanh(x.astype(np.float64) @ (task.teacher_scale * w1)) @ w2
    np.testing.assert_array_equal(y, logits.argmax(1))
    _, yte = task.test_set()
    assert len(yte) == task.test_size and len(set(yte.tolist())) >= 5


def test_flat_round_trip():
    model = LargeTask(width=32).model(0)
    theta = flat(model)
    other = LargeTask(width=32).model(1)
    load_flat(other, theta)
    np.testing.assert_array_equal(flat(other), theta)


def test_smoke_run_both_methods(tmp_path):
    cfg = large_config(world=2, steps=4, large_width=64, straggler_median_ms=5.0, eval_every=2)
    out, curves = run_train(cfg, work=str(tmp_path))
    json.dumps(out)  # what the CLI prints
    for m in ("gloo", "optireduce"):
        s = out[m]
        assert s["params"] == LargeTask(width=64).n_params()
        assert set(s) >= {"tta_s", "final_acc", "entries_lost", "replicas_equal"}
        assert 0.0 <= s["final_acc"] <= 1.0
        assert curves[m]["steps"] == [0, 2, 4]
    assert out["gloo"]["replicas_equal"] is True  # a reliable allreduce
    assert out["gloo"]["entries_lost"] == 0.0
    assert out["optireduce"]["verify_bit_exact"] == [True, True]
    assert out["settings"]["n_params"] == LargeTask(width=64).n_params()
