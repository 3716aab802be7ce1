"""In-band exponent agreement (NicParams.exp_inband, docs/numerics.md 1).

Each op's packets carry their sender's proposal for op + K in the header's `reserved`
field; a NIC starts a later op with the max of the proposals that arrived, or with the
exponent peers ahead already used. Checked here: the wire word, the rules one NIC at a
time, a straggler that no longer delays the others, and that ranks never disagree
without a count saying so.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.nic_model import NicModel
from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=256, n_max=8, t_b_us=400, exp_inband=True)  # lead 2K
Q = P.replace(exp_lead=P.ops_in_flight)  # the shortest lead, K: one NIC's window at a time


def expected_exponent(x: np.ndarray, p: NicParams) -> int:
    """docs/numerics.md 1 by hand for a max that cannot round up: e + 2 - w_in."""
    e = math.floor(math.log2(float(np.max(np.abs(x.astype(np.float64))))))
    return e + 2 - p.w_in


def chunk(scale: float, n: int = 256, seed: int = 0) -> np.ndarray:
    """n values with max |x| = scale * 0.75 (no rounding up near a power of two)."""
    x = np.random.default_rng(seed).uniform(-0.5, 0.5, n)
    x[n // 3] = 0.75
    return (x * scale).astype(np.float32)


def deliver(src: NicModel, nics: list[NicModel], now: int, skip=lambda tx: False) -> int:
    sent = 0
    for tx in src.poll_tx():
        if not skip(tx):
            nics[tx.dst].receive(now, tx.frame)
            sent += 1
    return sent


# ---- the wire word ------------------------------------------------------------------


def test_proposal_word_round_trips_every_int8():
    for v in range(-128, 128):
        w = ubt.proposal_word(v)
        assert ubt.proposal_word_ok(w) and ubt.proposal_of(w) == v
        assert w >> 8 == v & 0xFF and w & 0xFF == 1
    assert ubt.proposal_word(None) == 0 and ubt.proposal_of(0) is None
    with pytest.raises(ValueError):
        ubt.proposal_word(128)


def _datagram(reserved: int) -> bytes:
    h = ubt.UbtHeader(ubt.VERSION, ubt.MSG_SCATTER, 0, -20, 1, 1, 0, 0, 2, 0, 5, 2, 2, reserved)
    return h.pack() + bytes(8)


@pytest.mark.parametrize(
    ("reserved", "off", "on"),
    [
        (0x0000, True, True),  # no proposal
        (0xEC01, False, True),  # proposal -20
        (0x0001, False, True),  # proposal 0
        (0x0100, False, False),  # a value without its presence bit
        (0x0003, False, False),  # bits 7..1 must be zero
        (0x0080, False, False),
    ],
)
def test_parser_takes_a_proposal_word_only_when_inband(reserved, off, on):
    for inband, ok in ((False, off), (True, on)):
        r = ubt.parse_ubt(_datagram(reserved), inband=inband)
        assert (r == "malformed_header") != ok, (hex(reserved), inband, r)
        if ok:
            assert r.header.reserved == reserved


# ---- one NIC at a time --------------------------------------------------------------


def test_off_by_default_frames_unchanged_and_inband_calls_refused():
    p = Q.replace(exp_inband=False)
    nic = NicModel(p, 0, 2)
    with pytest.raises(ValueError, match="exp_inband"):
        nic.start_op(0, 0, chunk(1.0), None)
    with pytest.raises(ValueError, match="exp_inband"):
        nic.start_op(0, 0, chunk(1.0), -20, next_proposal=-20)
    nic.start_op(0, 0, chunk(1.0), -20)
    frames = nic.poll_tx()
    assert frames
    for tx in frames:
        assert ubt.parse_frame(tx.frame, port=p.udp_port, rank=1).header.reserved == 0


def test_every_packet_carries_the_proposal_for_op_plus_k():
    a, b = NicModel(Q, 0, 2), NicModel(Q, 1, 2)
    a.start_op(0, 0, chunk(1.0), -22, next_proposal=-7)
    b.start_op(0, 0, chunk(1.0, seed=1), -22, next_proposal=-9)
    ta, tb = a.poll_tx(), b.poll_tx()
    for tx in ta:
        assert (
            ubt.parse_frame(tx.frame, port=Q.udp_port, rank=1, inband=True).header.reserved
            == 0xF901
        )
    for tx in tb:
        a.receive(10, tx.frame)
    for tx in ta:
        b.receive(10, tx.frame)
    a.advance(1000)
    b.advance(1000)
    gathers = a.poll_tx()  # phase 2 frames carry it too
    assert gathers and all(tx.phase == 2 for tx in gathers)
    for tx in gathers:
        assert (
            ubt.parse_frame(tx.frame, port=Q.udp_port, rank=1, inband=True).header.reserved
            == 0xF901
        )
    k = Q.exp_lead_eff
    assert a.inband_exponent(k) == (-7, (), ())
    assert b.inband_exponent(k) == (-7, (), ())
    assert a.inband_exponent(k + 1) == (None, (1,), (0,))  # nothing proposed for it yet


def _three(proposal=lambda r: -20 - r) -> list[NicModel]:
    nics = [NicModel(Q, r, 3) for r in range(3)]
    for r, nic in enumerate(nics):  # ops 0..K-1 with an exponent given
        for k in range(Q.ops_in_flight):
            nic.start_op(0, k, chunk(1.0, seed=10 * r + k), -22, next_proposal=proposal(r))
    return nics


def test_missing_proposal_counted_and_max_of_what_arrived():
    nics = _three()
    # rank 2 loses every packet from rank 1 in ops 0..K-1 (scatter and gather): its
    # proposal for op K (-21) never reaches rank 2
    for src in nics:
        deliver(src, nics, 5, skip=lambda tx, s=src: s.rank == 1 and tx.dst == 2)
    for nic in nics:
        nic.advance(10_000)
    for src in nics:
        deliver(src, nics, 10_001, skip=lambda tx, s=src: s.rank == 1 and tx.dst == 2)
    k = Q.exp_lead_eff
    assert nics[0].inband_exponent(k) == (-20, (), ())
    assert nics[2].inband_exponent(k) == (-20, (1,), ())  # max of rank 0's and its own
    nics[2].start_op(10_002, k, chunk(1.0), None)
    assert nics[2].exp_counters["exp_incomplete"] == 1
    assert nics[2].exp_counters["exp_missing"] == 1
    assert nics[2].exp_counters["exp_given"] == k
    assert nics[2].ops[k].stats.exponent == -20


def test_a_frame_of_a_completed_op_still_brings_its_proposal():
    a, b = NicModel(Q, 0, 2), NicModel(Q, 1, 2)
    k = Q.exp_lead_eff
    a.start_op(0, 0, chunk(1.0), -22, next_proposal=-12)
    b.start_op(0, 0, chunk(1.0), -22, next_proposal=-14)
    held = a.poll_tx()
    b.advance(10_000)  # op 0 ends here by its deadlines, without rank 0
    assert b.base == 1 and b.inband_exponent(k) == (-14, (0,), ())
    for tx in held:
        b.receive(10_001, tx.frame)
    assert b.counters["stale_op"] == len(held)  # its data is too late ...
    assert b.inband_exponent(k) == (-12, (), ())  # ... its proposal is not


def test_no_proposal_needs_an_exponent_given_or_fetched():
    a, b = NicModel(Q, 0, 2), NicModel(Q, 1, 2)
    k = Q.exp_lead_eff
    for r in range(k):
        a.start_op(0, r, chunk(1.0), -22, next_proposal=None)  # its host cannot say yet
        b.start_op(0, r, chunk(1.0), -22, next_proposal=-18)
    deliver(a, [a, b], 1)
    deliver(b, [a, b], 1)
    assert b.inband_exponent(k) == (None, (), (0,))
    assert a.inband_exponent(k) == (None, (), (0,))
    a.advance(10_000)
    b.advance(10_000)
    with pytest.raises(ValueError, match=r"no proposal from ranks \[0\]"):
        b.start_op(10_000, k, chunk(1.0), None)
    b.put_proposal(k, 0, -16)  # the reliable fetch from rank 0
    assert b.inband_exponent(k) == (-16, (), ())
    with pytest.raises(ValueError, match="put_proposal"):
        b.put_proposal(k, 0, 200)
    with pytest.raises(ValueError, match="put_proposal"):
        b.put_proposal(0, 0, -16)  # already started
    b.start_op(10_000, k, chunk(1.0), None)
    assert b.ops[k].exponent == -16


def test_a_rank_behind_follows_the_exponent_peers_ahead_used():
    k = Q.exp_lead_eff
    nics = _three(proposal=lambda r: -22 + r)  # rank 2 proposes the max, -20
    to2: list = []  # rank 2 is slow: what the others send it arrives much later

    def run_fast(now: int) -> None:
        for src in nics[:2]:
            for tx in src.poll_tx():
                (to2.append(tx) if tx.dst == 2 else nics[tx.dst].receive(now, tx.frame))

    run_fast(5)
    stash = nics[2].poll_tx()
    for t in (10_000, 20_000):
        for nic in nics[:2]:
            nic.advance(t)
        run_fast(t)
    for nic in nics[:2]:
        assert nic.base == k  # ops 0..K-1 done without rank 2
        assert nic.inband_exponent(k) == (-21, (2,), ())
        nic.start_op(20_000, k, chunk(1.0, seed=nic.rank), None)
        assert nic.ops[k].exponent == -21
        assert nic.exp_counters["exp_incomplete"] == 1
    run_fast(20_000)
    assert stash
    for tx in to2:  # rank 2 now hears everything: its own agreement would be -20
        nics[2].receive(20_001, tx.frame)
    nics[2].advance(40_000)
    nics[2].poll_tx()
    assert nics[2].inband_exponent(k) == (-20, (), ())
    nics[2].start_op(40_000, k, chunk(32.0, seed=2), None)  # max 24: its data wants -20
    assert nics[2].ops[k].exponent == -21  # that of the ranks ahead: no mismatch
    c = nics[2].exp_counters
    assert c["exp_followed"] == 1 and c["exp_inband"] == c["exp_incomplete"] == 0
    assert c["exp_saturated"] == 1 and nics[2].ops[k].stats.sat_quantize > 0
    assert nics[2].counters["exponent_mismatch"] == 0


# ---- the cluster in virtual time ----------------------------------------------------


def _straggler_inputs(ops: int, world: int = 4) -> list[np.ndarray]:
    xs = [np.concatenate([chunk(1.0, seed=100 * r + k) for k in range(ops)]) for r in range(world)]
    xs[-1] = np.concatenate([chunk(4.0, seed=999 + k) for k in range(ops)])  # holds every max
    return xs


def test_a_straggler_does_not_delay_the_others_exponent():
    ops, world, delay = 12, 4, 50
    xs = _straggler_inputs(ops, world)
    want = expected_exponent(xs[-1][:256], P)
    assert want == expected_exponent(xs[0][:256], P) + 2
    kw = dict(calibrate=False, host_delay_us=[0] * (world - 1) + [delay])
    out_in, st_in = simulate_allreduce(xs, params=P, **kw)
    out_ex, st_ex = simulate_allreduce(xs, params=P.replace(exp_inband=False), **kw)
    k = P.exp_lead_eff
    start = lambda st, r, j: st.per_worker[r][j].start_us  # noqa: E731
    for j in range(k, ops):
        for r in range(world - 1):
            # in-band: a fast rank starts op j before the straggler, with its exponent
            assert start(st_in, r, j) + delay // 2 < start(st_in, world - 1, j), (r, j)
            # reliable exchange per op: everyone waits for the straggler's proposal
            assert start(st_ex, r, j) >= start(st_ex, world - 1, j), (r, j)
    for ops_r in st_in.per_worker:
        assert [s.exponent for s in ops_r] == [want] * ops
    assert st_in.exp_disagreements == 0
    for c in st_in.exp_counters:
        assert c["exp_given"] == k and c["exp_inband"] == ops - k
        assert c["exp_incomplete"] == c["exp_followed"] == c["exp_saturated"] == 0
    # the ops before the lead ran alike; later the fast ranks do not wait for the
    # straggler's data either (that is the point), so the results may differ
    np.testing.assert_array_equal(out_in[0][: 256 * k], out_ex[0][: 256 * k])


def test_lossless_inband_equals_a_reliable_exchange_per_op():
    rng = np.random.default_rng(5)
    ops = 9
    xs = [(rng.uniform(-1, 1, 256 * ops) * np.repeat(2.0 ** rng.integers(-4, 5, ops), 256))
          .astype(np.float32) for _ in range(3)]  # fmt: skip
    out_in, st_in = simulate_allreduce(xs, params=P, calibrate=False)
    out_ex, _ = simulate_allreduce(xs, params=P.replace(exp_inband=False), calibrate=False)
    for a, b in zip(out_in, out_ex, strict=True):
        np.testing.assert_array_equal(a, b)
    for j in range(ops):
        want = max(expected_exponent(x[256 * j : 256 * (j + 1)], P) for x in xs)
        assert {w[j].exponent for w in st_in.per_worker} == {want}
    assert all(c["exp_inband"] == ops - P.exp_lead_eff for c in st_in.exp_counters)


@pytest.mark.parametrize("loss", [0.05, 0.2])
def test_disagreement_under_loss_is_never_silent(loss):
    # one-block ops (4 packets, 4 ranks): a rank hears each peer in only 2 packets per op
    p = P.replace(c=64)
    ops, world = 80, 4
    rng = np.random.default_rng(7)
    xs = [(rng.uniform(-1, 1, 64 * ops) * np.repeat(2.0 ** rng.integers(0, 4, ops), 64))
          .astype(np.float32) for _ in range(world)]  # fmt: skip
    _, st = simulate_allreduce(xs, params=p, calibrate=False, drop_rate=loss, seed=11)
    total = {k: sum(c[k] for c in st.exp_counters) for k in st.exp_counters[0]}
    assert total["exp_given"] == world * p.exp_lead_eff
    assert sum(total[k] for k in ("exp_inband", "exp_incomplete", "exp_followed")) == world * (
        ops - p.exp_lead_eff
    )
    if loss >= 0.2:
        assert total["exp_incomplete"] > 0  # loss this heavy does lose proposals
    assert total["exp_missing"] >= total["exp_incomplete"]
    # a disagreement needs a rank that lacked a proposal, and its frames are counted
    mismatch = sum(c["exponent_mismatch"] for c in st.counters)
    assert st.exp_disagreements <= total["exp_incomplete"]
    assert (st.exp_disagreements > 0) <= (mismatch > 0)
