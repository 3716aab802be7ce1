"""Each deadline rule, and each drop reason, shown firing at one model NIC.

World of 3, rank 0 under test; ranks 1 and 2 are model NICs whose frames we
deliver (or not) at chosen ticks. Op of 192 elements = 12 packets of 16: rank 0
owns packets 0, 3, 6, 9; each peer flags its last packet to it (9) as LAST.
"""

from fractions import Fraction

import numpy as np
import pytest

from optireduce import ubt
from optireduce.host.model.codec import encode
from optireduce.host.model.nic_model import NicModel
from optireduce.params import NicParams

P = NicParams(p=16, b=64, c=256, t_b_us=1000, alpha_q8=64, n_max=8)
N, LEN, EXP = 3, 192, -20


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(LEN).astype(np.float32) for _ in range(N)]


def scatter_to_rank0(xs, op_id=0):
    """The frames ranks 1 and 2 send rank 0 for op op_id, by (sender, packet index)."""
    frames = {}
    for r in (1, 2):
        peer = NicModel(P, r, N, first_op=op_id)
        peer.start_op(0, op_id, xs[r], EXP)
        for tx in peer.poll_tx():
            if tx.dst == 0:
                frames[(r, tx.pkt_index)] = tx.frame
    return frames


def start_rank0(xs, now=0, op_id=0):
    nic = NicModel(P, 0, N)
    nic.start_op(now, op_id, xs[0], EXP)
    sent = nic.poll_tx()
    assert {t.dst for t in sent} == {1, 2} and all(t.phase == 1 for t in sent)
    return nic


def started_rank0(now=0):
    """Rank 0 with op 0 of inputs() started at `now`, and the frames its peers send it."""
    xs = inputs()
    return start_rank0(xs, now), scatter_to_rank0(xs)


def deliver(nic, frames, keys, t0=10):
    for k, key in enumerate(keys):
        nic.receive(t0 + k, frames[key])


ALL = [(r, i) for r in (1, 2) for i in (0, 3, 6, 9)]


def gathers(nic):
    return [t for t in nic.poll_tx() if t.phase == 2]


def test_all_arrived_ends_the_phase_at_the_last_arrival():
    xs = inputs()
    nic, frames = started_rank0()
    deliver(nic, frames, ALL[:-1])
    assert gathers(nic) == []
    nic.receive(50, frames[ALL[-1]])
    g = gathers(nic)
    assert len(g) == 4 * 2 and all(t.time_us == 50 for t in g)
    # the reduced values: mean of the three contributions, rounded half away from zero
    ys = [encode(x, EXP, 0, P).y.reshape(-1, P.p) for x in xs]
    for t in g:
        h = ubt.UbtHeader.unpack(t.frame, ubt.L2_L4_LEN)
        got = ubt.payload_values(t.frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :])
        want = []
        for j in range(P.p):
            s = sum(int(y[h.pkt_index, j]) for y in ys)
            m = int(abs(Fraction(s, 3)) + Fraction(1, 2))
            want.append(m if s >= 0 else -m)
        assert got.tolist() == want and h.contributors == 3
    assert nic.ops[0].stats.phase1_reason == "complete"


def test_early_timeout_after_last_packets_and_an_idle_gap():
    nic, frames = started_rank0()
    keys = [k for k in ALL if k != (1, 3)]  # a non-LAST packet is lost
    deliver(nic, frames, keys)  # last arrival at t = 16
    idle = (P.alpha_q8 * 1000) >> 8  # alpha * T, T = t_C = t_B before any history
    assert nic.next_timer() == 16 + idle
    nic.advance(16 + idle - 1)
    assert gathers(nic) == []
    nic.advance(16 + idle)
    g = gathers(nic)
    assert g and all(t.time_us == 16 + idle for t in g)
    st = nic.ops[0].stats
    assert (st.phase1_reason, st.p1_expected, st.p1_received) == ("early", 8, 7)


def test_hard_deadline_when_a_last_packet_is_missing():
    nic, frames = started_rank0(now=100)
    deliver(nic, frames, [k for k in ALL if k != (2, 9)], t0=110)
    assert nic.next_timer() == 100 + 1000
    nic.advance(1099)
    assert gathers(nic) == []
    nic.advance(5000)  # however late the call, the phase ends at its deadline
    g = gathers(nic)
    assert g and all(t.time_us == 1100 for t in g)
    (res,) = nic.poll_results()  # phase 2 timed out too by t=5000: the op is done
    assert res.stats.phase1_reason == "deadline" and res.stats.phase1_end_us == 1100
    # the contribution count of packet 9 says one was missing
    h = ubt.UbtHeader.unpack(next(t for t in g if t.pkt_index == 9).frame, ubt.L2_L4_LEN)
    assert h.contributors == 2


def test_timeout_is_min_of_median_peer_tc_and_tb():
    nic, frames = started_rank0()

    def with_tc(frame, tc):
        h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(t_c_us=tc)
        payload = frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :]
        return ubt.build_frame(h, payload, src=h.sender, dst=0, port=P.udp_port)

    nic.receive(10, with_tc(frames[(1, 0)], 300))
    nic.receive(11, with_tc(frames[(2, 0)], 500))
    # table: own 1000, peers 300 and 500 -> median 500
    assert nic.next_timer() == 0 + 500
    nic.receive(12, with_tc(frames[(2, 3)], 5000))  # median now 1000 = min(.., t_B)
    assert nic.next_timer() == 1000
    nic.receive(13, with_tc(frames[(1, 3)], 40))  # 40, 1000, 5000 -> 1000
    assert nic.next_timer() == 1000
    nic.receive(14, with_tc(frames[(2, 6)], 200))  # 40, 200, 1000 -> 200
    assert nic.next_timer() == 200


def test_a_peer_tc_beyond_every_t_b_is_recorded_at_t_c_max():
    """A header's t_C is 32 bits; the NIC records at most t_c_max_us = 2^28 - 1 (above
    every t_B a 32-bit clock allows), so T is unchanged, and a move between two values
    beyond it is no change (the floor stays)."""
    nic, frames = started_rank0()
    assert P.t_c_max_us == (1 << 28) - 1 and P.replace(tick_bits=24).t_c_max_us == (1 << 20) - 1
    nic.receive(10, _with(frames[(1, 0)], t_c_us=(1 << 32) - 1))
    assert nic.tc_table[0, 1] == (1 << 28) - 1 and nic._t_change[0] == 10
    nic.receive(11, _with(frames[(2, 0)], t_c_us=1 << 28))  # median: own 1000, capped, capped
    assert nic.tc_table[0, 2] == (1 << 28) - 1 and nic.next_timer() == P.t_b_us
    nic.receive(12, _with(frames[(1, 3)], t_c_us=1 << 31))  # capped as before: no change
    assert nic._t_change[0] == 11
    nic.receive(13, _with(frames[(1, 6)], t_c_us=(1 << 28) - 2))  # below the cap: a change
    assert nic.tc_table[0, 1] == (1 << 28) - 2 and nic._t_change[0] == 13


def test_set_t_b_bounds_every_later_phase_and_t_c():
    xs = inputs()
    nic = NicModel(P, 0, N)
    nic.set_t_b(400)  # calibrated below the t_C every rank starts with (1000)
    assert nic.p.t_b_us == 400 and P.t_b_us == 1000
    nic.start_op(100, 0, xs[0], EXP)
    nic.poll_tx()
    frames = scatter_to_rank0(xs)
    deliver(nic, frames, [k for k in ALL if k != (2, 9)], t0=110)
    assert nic.next_timer() == 100 + 400
    nic.advance(5000)
    (res,) = nic.poll_results()
    assert res.stats.phase1_reason == "deadline" and res.stats.phase1_end_us == 500
    assert res.stats.phase1_timeout_us == 400
    assert [est.sample(10_000) for est in nic.tc] == [400, 400]  # t_C clamped to the new t_B


def test_deadline_moved_into_the_past_ends_the_phase_now():
    nic, frames = started_rank0()
    h = ubt.UbtHeader.unpack(frames[(1, 0)], ubt.L2_L4_LEN)
    for r, tc in ((1, 30), (2, 30)):
        f = ubt.build_frame(
            h._replace(sender=r, t_c_us=tc), frames[(r, 0)][ubt.L2_L4_LEN + 32 :],
            src=r, dst=0, port=P.udp_port,
        )  # fmt: skip
        nic.receive(400, f)
    g = gathers(nic)
    assert g and all(t.time_us == 400 for t in g)
    assert nic.ops[0].stats.phase1_reason == "deadline"


def test_late_duplicate_stale_and_future_frames_are_dropped_and_counted():
    xs = inputs()
    nic, frames = started_rank0()
    deliver(nic, frames, [k for k in ALL if k != (2, 9)])
    nic.receive(30, frames[(1, 0)])
    assert nic.counters["duplicate"] == 1 and nic.ops[0].stats.duplicate == 1
    nic.advance(1000)  # deadline
    nic.receive(1001, frames[(2, 9)])
    assert nic.counters["late"] == 1 and nic.ops[0].stats.late == 1
    assert nic.counters["rx_scatter"] == 7
    # a peer up to K ops ahead is kept; op 4 is outside the receive window [0, 2K)
    nic.receive(1002, scatter_to_rank0(xs, op_id=3)[(1, 0)])
    assert nic.counters["future_op"] == 0 and 3 in nic.ops
    nic.receive(1003, scatter_to_rank0(xs, op_id=4)[(1, 0)])
    assert nic.counters["future_op"] == 1
    # finish op 0 with the gathers of ranks 1 and 2, then op 0 is stale
    peers = [NicModel(P, r, N) for r in (1, 2)]
    for peer, r in zip(peers, (1, 2), strict=True):
        peer.start_op(0, 0, xs[r], EXP)
        peer.advance(5000)
        for tx in peer.poll_tx():
            if tx.dst == 0 and tx.phase == 2:
                nic.receive(1100, tx.frame)
    res = nic.poll_results()
    assert len(res) == 1 and nic.base == 1
    nic.receive(1200, frames[(1, 3)])
    assert nic.counters["stale_op"] == 1


def _corrupt(frame: bytes, offset: int, value: bytes, fix_ip: bool = True) -> bytes:
    b = bytearray(frame)
    b[offset : offset + len(value)] = value
    if fix_ip:
        b[24:26] = b"\0\0"
        b[24:26] = ubt.ipv4_checksum(bytes(b[14:34])).to_bytes(2, "big")
    return bytes(b)


def _with(frame: bytes, **fields) -> bytes:
    h = ubt.UbtHeader.unpack(frame, ubt.L2_L4_LEN)._replace(**fields)
    return ubt.build_frame(
        h, frame[ubt.L2_L4_LEN + ubt.HEADER_LEN :], src=1, dst=0, port=P.udp_port
    )


U = ubt.L2_L4_LEN  # UBT header offset


def bad_frames(good: bytes) -> dict[str, bytes]:
    return {
        "truncated": good[:40],
        "not_ipv4": _corrupt(good, 12, b"\x86\xdd", fix_ip=False),
        "bad_ip_header": _corrupt(good, 14, b"\x46"),
        "bad_ip_checksum": _corrupt(good, 24, b"\x12\x34", fix_ip=False),
        "ip_fragment": _corrupt(good, 20, b"\x20\x00"),
        "not_udp": _corrupt(good, 23, b"\x06"),
        "wrong_address": _corrupt(good, 30, b"\x0a\x00\x00\x09"),
        "wrong_port": _corrupt(good, 36, b"\x00\x35"),
        "bad_udp_length": _corrupt(good, 38, b"\x00\x10"),
        "bad_version": _with(good, version=2),
        "bad_type": _with(good, msg_type=7),
        "malformed_header": _with(good, flags=0x80),
        "wrong_job": _with(good, job_id=P.job_id + 1),
        "unknown_rank": _with(good, sender=5),
        "own_rank": _with(good, sender=0),
        "bad_length": _with(good, op_len=P.c + 1),
        "future_op": _with(good, op_id=7),
        "index_out_of_range": _with(good, pkt_index=12),
        "wrong_owner": _with(good, pkt_index=4),
        "exponent_mismatch": _with(good, exponent=EXP + 1),
    }


@pytest.mark.parametrize("reason", list(bad_frames(b"\0" * 200)))
def test_every_malformed_class_is_rejected_counted_and_harmless(reason):
    xs = inputs()
    frames = scatter_to_rank0(xs)
    clean = start_rank0(xs)
    deliver(clean, frames, ALL)
    want = gathers(clean)

    nic = start_rank0(xs)
    bad = bad_frames(frames[(1, 0)])[reason]
    nic.receive(5, bad)
    assert nic.counters[reason] == 1
    assert sum(nic.counters[r] for r in ubt.DROP_REASONS) == 1
    deliver(nic, frames, ALL)
    assert [t.frame for t in gathers(nic)] == [t.frame for t in want]


def test_malformed_gather_contributors_are_rejected():
    nic, frames = started_rank0()
    nic.receive(5, _with(frames[(1, 0)], contributors=1))  # a scatter with a count
    nic.receive(6, _with(frames[(1, 0)], msg_type=ubt.MSG_GATHER, contributors=9))
    assert nic.counters["malformed_header"] == 2


def test_host_port_rejects_bad_commands():
    nic = NicModel(P, 0, N)
    x = np.zeros(10, np.float32)
    with pytest.raises(TypeError, match="float32"):
        nic.start_op(0, 0, np.zeros(10), 0)
    with pytest.raises(ValueError, match="elements"):
        nic.start_op(0, 0, np.zeros(P.c + 1, np.float32), 0)
    with pytest.raises(ValueError, match="exponent"):
        nic.start_op(0, 0, x, 200)
    with pytest.raises(ValueError, match="not the next op"):
        nic.start_op(0, 1, x, 0)  # op ids are contiguous: skipping one would wedge the window
    nic.start_op(0, 0, x, 0)
    nic.start_op(0, 1, x, 0)
    with pytest.raises(ValueError, match="window"):
        nic.start_op(0, 2, x, 0)
    with pytest.raises(ValueError, match="not the next op"):
        nic.start_op(0, 0, x, 0)
    with pytest.raises(ValueError, match="rank"):
        NicModel(P, 3, 3)


def test_a_frame_exactly_at_the_deadline_is_late():
    nic, frames = started_rank0()
    deliver(nic, frames, [k for k in ALL if k != (2, 9)])
    nic.receive(1000, frames[(2, 9)])  # T = t_B = 1000: the timer fires first
    assert nic.counters["late"] == 1
    assert nic.ops[0].stats.phase1_reason == "deadline"


def test_peers_gone_ends_the_phase_without_waiting():
    """A packet of op 2 from rank 1 proves rank 1 finished op 0 (K = 2)."""
    xs = inputs()
    nic, frames = started_rank0()
    deliver(nic, frames, [k for k in ALL if k not in ((1, 9), (2, 9))])  # both LASTs lost
    nic.receive(40, scatter_to_rank0(xs, op_id=2)[(1, 0)])
    assert gathers(nic) == []  # rank 2 still owes packet 9
    nic.receive(41, scatter_to_rank0(xs, op_id=2)[(2, 0)])
    g = gathers(nic)
    assert g and all(t.time_us == 41 for t in g)
    # both peers are done with op 0, so their gathers (never delivered here) are lost too
    (res,) = nic.poll_results()
    st = res.stats
    assert (st.phase1_reason, st.p1_received, st.phase2_reason, st.p2_received) == (
        "early", 6, "early", 0)  # fmt: skip
    assert st.end_us == 41


def test_phase2_deadline_is_anchored_after_the_slowest_phase1():
    """A receiver whose phase 1 ended at once still waits until start + T1 + T2."""
    nic, frames = started_rank0(now=0)
    deliver(nic, frames, ALL)  # phase 1 complete at t = 17
    nic.poll_tx()
    assert nic.next_timer() == 1000 + 1000  # anchor = op start + T1 = 1000, then + T2


def test_tc_is_kept_per_phase_and_carried_in_headers():
    nic, frames = started_rank0()
    deliver(nic, frames, ALL, t0=10)  # phase 1 complete at 17: sample 17
    g = gathers(nic)
    h = ubt.UbtHeader.unpack(g[0].frame, ubt.L2_L4_LEN)
    assert h.t_c_us == nic.tc[1].tc == 1000  # gather frames carry the phase-2 t_C, untouched
    assert nic.tc[0].tc == 17 + 4 * (17 >> 1)  # first sample: mean 17, dev 8


def test_dropped_frames_never_move_tc():
    nic, frames = started_rank0()
    for bad in (_with(frames[(1, 0)], op_id=99, t_c_us=3), _with(frames[(1, 0)], t_c_us=0),
                _with(frames[(1, 0)], pkt_index=4, t_c_us=3)):  # fmt: skip
        nic.receive(5, bad)
    assert nic.counters["future_op"] == nic.counters["malformed_header"] == 1
    assert nic.counters["wrong_owner"] == 1
    assert nic.tc_table[0].tolist() == [1000, 1000, 1000]
    assert nic.next_timer() == 1000


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"count": 8}, "bad_length"),
        ({"world": 4}, "malformed_header"),
        ({"op_len": 0}, "bad_length"),
    ],
)
def test_more_header_mismatches(fields, reason):
    nic, frames = started_rank0()
    f = frames[(1, 0)]
    if "count" in fields:  # a shorter payload that agrees with its count
        h = ubt.UbtHeader.unpack(f, U)._replace(count=8)
        f = ubt.build_frame(h, f[U + 32 : U + 32 + 32], src=1, dst=0, port=P.udp_port)
    else:
        f = _with(f, **fields)
    nic.receive(5, f)
    assert nic.counters[reason] == 1
