"""`optireduce train --cluster netns`: each rank a host of its own (experiments/netns.py:
network namespaces on a bridge, links shaped to 1 Gbit/s), gloo and OptiReduce alike under
the same injected tail. Needs root; fails with the fix elsewhere unless OPTIREDUCE_NO_NETNS=1
says this machine cannot make namespaces."""

from __future__ import annotations

import numpy as np
import pytest

from optireduce.experiments import train
from optireduce.experiments.netns import NetnsError, sh
from optireduce.experiments.train import TrainConfig
from tests.test_train import _reference_sgd


def _namespaces() -> set[str]:
    return {line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line}


def test_both_methods_train_with_each_rank_on_its_own_network_stack(tmp_path, netns_ready):
    before = _namespaces()
    cfg = TrainConfig(world=4, steps=10, straggler_median_ms=5, packet_median_us=100,
                      cluster="netns")  # fmt: skip
    try:
        out, _ = train.run_train(cfg, str(tmp_path))
    except NetnsError as e:
        pytest.fail(str(e))
    g, o = out["gloo"], out["optireduce"]
    # OptiReduce's sockets on the namespaces' addresses, one host per rank
    assert o["addresses"] == [f"10.77.0.{r + 1}" for r in range(4)]
    assert all(o["verify_bit_exact"]) and g["replicas_equal"]
    assert o["entries_lost"] < 0.5 and not o["exclusions"]  # every rank took part
    assert out["settings"]["cluster"] == "netns"
    # gloo between the namespaces is still lossless data-parallel SGD (an independent
    # float64 reference), so its traffic crossed the bridge intact
    got = np.load(tmp_path / "gloo" / "rank0.npz")["theta"][1:]
    ref = _reference_sgd(cfg, "cosine")
    assert len(got) == len(ref) == 2
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, ref, strict=True)) < 1e-4
    assert _namespaces() == before  # every namespace removed
