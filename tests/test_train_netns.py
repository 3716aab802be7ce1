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


@pytest.mark.timeout(1800)  # the virtual board's first build: over 10 min beside the suite
@pytest.mark.parametrize("boards", [(1,), (0, 1, 2)], ids=["one_board", "every_rank_a_board"])
def test_training_through_virtual_boards(tmp_path, netns_ready, boards):
    """The DDP hook on namespace hosts where some ranks (or all) drive a virtual board over
    its host port and the rest run the native engine."""
    cfg = TrainConfig(world=3, steps=3, straggler_median_ms=5, packet_median_us=100,
                      cluster="netns", boards=boards, methods=("optireduce",))  # fmt: skip
    out, _ = train.run_train(cfg, str(tmp_path))
    o = out["optireduce"]
    assert o["backends"] == ["board" if r in boards else "native" for r in range(3)]
    # every rank at the NIC's build addressing, the boards' included
    assert o["addresses"] == [f"198.18.0.{r + 1}" for r in range(3)]
    # the lossless check op: each rank's result, boards included, is the model's bit for bit
    assert o["verify_bit_exact"] == [True] * 3
    # a virtual board runs far slower than a board, so native ranks' deadlines may cut
    # some of its packets (then replicas may differ, as with any loss); no rank drops out
    assert o["entries_lost"] < 0.5 and not o["exclusions"]
    for b in boards:  # the check op and one op per step went through each board
        fig = o["boards"][b]
        assert fig["ops_started"] == fig["ops_done"] == 1 + cfg.steps
        assert fig["too_long"] == fig["send_failed"] == 0
