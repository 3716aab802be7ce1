"""NicParams.tc_sample at one model NIC, at the exact tick: the t_C sample of a phase that
ended by its deadline.

World of 3, rank 0 under test (the set-up of tests/test_nic_rules.py): op of 192 elements =
12 packets of 16, rank 0 owns packets 0, 3, 6, 9 (rank 1: 1, 4, 7, 10) and each peer flags
its packet 9 to rank 0 as LAST. t_B = 1000 and t_C starts at t_B, so T = 1000 (the peers'
t_C stay 1000). Expected values by hand: the first sample s gives mean = s, dev = s >> 1, and
t_C = clamp(mean + mult * dev, t_c_min = 1, t_B = 1000).
"""

import numpy as np
import pytest

from optireduce.host.model.nic_model import NicModel
from optireduce.params import NicParams, ParamError

P = NicParams(p=16, b=64, c=256, t_b_us=1000, alpha_q8=64, n_max=8)
N, LEN, EXP = 3, 192, -20
ALL = [(r, i) for r in (1, 2) for i in (0, 3, 6, 9)]
MISSING_LAST = [k for k in ALL if k != (2, 9)]  # no LAST from rank 2: no early timeout


def frames_to_rank0(p: NicParams) -> tuple[list, dict, dict]:
    """(inputs, scatter frames, gather frames) that ranks 1 and 2 send rank 0 in a lossless
    op 0, each keyed by (sender, packet index)."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(LEN).astype(np.float32) for _ in range(N)]
    nics = [NicModel(p, r, N) for r in range(N)]
    for r, nic in enumerate(nics):
        nic.start_op(0, 0, xs[r], EXP)
    scatter, gather = {}, {}
    for _ in range(2):  # the scatters, then the gathers they trigger
        sent = [(r, tx) for r, nic in enumerate(nics) for tx in nic.poll_tx()]
        for r, tx in sent:
            if tx.dst == 0 and r != 0:
                (scatter if tx.phase == 1 else gather)[(r, tx.pkt_index)] = tx.frame
            nics[tx.dst].receive(1, tx.frame)
    assert len(scatter) == 8 and len(gather) == 8
    return xs, scatter, gather


def started(p: NicParams, now: int = 100) -> tuple[NicModel, dict, dict]:
    xs, scatter, gather = frames_to_rank0(p)
    nic = NicModel(p, 0, N)
    nic.start_op(now, 0, xs[0], EXP)
    nic.poll_tx()
    return nic, scatter, gather


def phase1_cut_by_its_deadline(p: NicParams) -> tuple[NicModel, dict]:
    """Op 0 started at 100; 7 scatters in at 110..116 (last arrival 116), rank 2's LAST
    never: phase 1 ends by its deadline at 100 + T = 1100."""
    nic, scatter, gather = started(p)
    for k, key in enumerate(MISSING_LAST):
        nic.receive(110 + k, scatter[key])
    nic.advance(1099)
    assert nic.ops[0].stats.phase1_reason == ""  # not over yet
    nic.advance(1100)
    st = nic.ops[0].stats
    assert (st.phase1_reason, st.phase1_end_us, st.phase1_timeout_us) == ("deadline", 1100, 1000)
    return nic, gather


@pytest.mark.parametrize(
    ("rule", "mult", "mean", "tc"),
    [
        ("duration", 4, 1000, 1000),  # s = 1100 - 100: 1000 + 4 * 500, clamped to t_B
        ("last_arrival", 4, 16, 48),  # s = 116 - 100: 16 + 4 * 8
        ("last_arrival", 2, 16, 32),  # 16 + 2 * 8
        ("last_arrival", 0, 16, 16),
    ],
)
def test_a_deadline_phase_samples_by_the_rule(rule, mult, mean, tc):
    nic, _ = phase1_cut_by_its_deadline(P.replace(tc_sample=rule, tc_dev_mult=mult))
    est = nic.tc[0]
    assert (est.mean, est.dev, est.tc) == (mean, mean >> 1, tc)
    assert nic.tc_table[0, 0] == tc  # the value its frames carry from now on


@pytest.mark.parametrize(("rule", "mean", "tc"), [("duration", 1000, 1000),
                                                  ("last_arrival", None, 1000)])  # fmt: skip
def test_a_deadline_phase_with_no_arrival_samples_only_its_duration(rule, mean, tc):
    """Phase 2 starts at 1100 (anchor max(1100, 100 + T1) = 1100) and receives nothing:
    it ends at 2100; "last_arrival" takes no sample, "duration" samples 1000."""
    nic, _ = phase1_cut_by_its_deadline(P.replace(tc_sample=rule))
    nic.advance(2100)
    (res,) = nic.poll_results()
    assert (res.stats.phase2_reason, res.stats.end_us) == ("deadline", 2100)
    assert (nic.tc[1].mean, nic.tc[1].tc) == (mean, tc)


def test_a_deadline_phase_samples_its_last_accepted_arrival():
    """Two gathers of rank 1 in phase 2 (at 1130 and 1150), then a duplicate (1170: dropped,
    not an arrival): the phase ends by its deadline at 2100 with s = 1150 - 1100 = 50,
    mean 50, dev 25, t_C = 50 + 4 * 25 = 150."""
    nic, gather = phase1_cut_by_its_deadline(P.replace(tc_sample="last_arrival"))
    nic.receive(1130, gather[(1, 1)])
    nic.receive(1150, gather[(1, 4)])
    nic.receive(1170, gather[(1, 4)])
    assert nic.counters["duplicate"] == 1
    nic.advance(2100)
    (res,) = nic.poll_results()
    assert (res.stats.phase2_reason, res.stats.p2_received) == ("deadline", 2)
    assert (nic.tc[1].mean, nic.tc[1].dev, nic.tc[1].tc) == (50, 25, 150)


def test_arrivals_before_the_phase_began_give_no_sample():
    """A gather that came during phase 1 (at 500) counts for phase 2 but says nothing of
    its completion time: no sample, as for a phase that completed before it began."""
    nic, scatter, gather = started(P.replace(tc_sample="last_arrival"))
    for k, key in enumerate(MISSING_LAST):
        nic.receive(110 + k, scatter[key])
    nic.receive(500, gather[(1, 1)])
    nic.advance(2100)
    (res,) = nic.poll_results()
    assert (res.stats.phase2_reason, res.stats.p2_received) == ("deadline", 1)
    assert (nic.tc[1].mean, nic.tc[1].tc) == (None, 1000)
    assert (nic.tc[0].mean, nic.tc[0].tc) == (16, 48)  # phase 1: 116 - 100


def test_an_unknown_rule_is_refused():
    with pytest.raises(ParamError, match="tc_sample"):
        P.replace(tc_sample="first_arrival")


def test_the_co_simulated_nic_refuses_last_arrival_and_the_driver_falls_back(caplog):
    """The gateware samples a deadline phase's whole duration: SimNic is unavailable under
    any other rule, and select_nic says so in its one line and takes the next backend."""
    import logging

    from optireduce.host.driver import select_nic
    from optireduce.host.transport import UdpTransport

    tr, peer = UdpTransport(0), UdpTransport(1)
    try:
        tr.connect([tr.address, peer.address])
        with caplog.at_level(logging.INFO, logger="optireduce"):
            nic = select_nic(P.replace(tc_sample="last_arrival"), 0, 2, transport=tr,
                             agree=lambda v: v, prefer=("sim", "software"))  # fmt: skip
        assert nic.backend == "software"
        (line,) = [r.getMessage() for r in caplog.records if "using the" in r.getMessage()]
        assert line == ("optireduce rank 0: using the software NIC "
                        "(sim: the gateware has no tc_sample='last_arrival')")  # fmt: skip
    finally:
        tr.close()
        peer.close()
