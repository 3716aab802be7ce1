"""Host-port frames: the binary STATS record round-trips every field of OpStats."""

import numpy as np
import pytest

from optireduce import host_port
from optireduce.op_stats import OpStats
from optireduce.sim.replay import replay
from optireduce.sim.trace import make_trace


def _stats() -> OpStats:
    return OpStats(
        op_id=7, rank=1, world=3, n=1000, exponent=-20, start_us=5, end_us=(1 << 32) + 9,
        phase1_reason="early", phase2_reason="deadline", phase1_timeout_us=400,
        phase2_timeout_us=390, phase1_end_us=77, p1_expected=8, p1_received=7,
        p2_expected=10, p2_received=9, contributor_hist=[1, 0, 3, 6], sat_quantize=2,
        sat_transform=3, sat_output=4, nonfinite=5, t_c_us=(61, 62),
    )  # fmt: skip


@pytest.mark.parametrize("tick_bits", [32, 24])
def test_stats_ticks_are_low_bits_and_durations_survive_the_wrap(tick_bits):
    """A NIC's clock wraps: the record holds the ticks' low `tick_bits` bits, and OpStats
    read back from it puts the phase ends after the start, so durations are the op's."""
    wrap = 1 << tick_bits
    st = _stats()
    st.start_us, st.phase1_end_us, st.end_us = 3 * wrap - 10, 3 * wrap + 5, 3 * wrap + 30
    words = host_port.stats_words(st, tick_bits)
    d = host_port.stats_from_words(words)
    assert (d["start_us"], d["phase1_end_us"], d["end_us"]) == (wrap - 10, 5, 30)
    back = host_port.op_stats(d, rank=1, tick_bits=tick_bits)
    assert (back.start_us, back.phase1_end_us, back.end_us) == (wrap - 10, wrap + 5, wrap + 30)
    assert back.end_us - back.start_us == 40 and back.phase1_end_us - back.start_us == 15
    # near an earlier op's start on the host's clock: the nearest tick, ahead or behind
    for near in (3 * wrap - 500, 3 * wrap + 200):
        back = host_port.op_stats(d, rank=1, tick_bits=tick_bits, near=near)
        assert (back.start_us, back.end_us) == (3 * wrap - 10, 3 * wrap + 30), near


def test_stats_record_round_trip():
    st = _stats()
    words = host_port.stats_words(st)
    assert len(words) == len(host_port.STATS_FIELDS) + st.world + 1
    d = host_port.stats_from_words(words)
    assert d["exponent"] == -20 and d["end_us"] == 9  # ticks are their low 32 bits
    assert (d["phase1_reason"], d["phase2_reason"]) == ("early", "deadline")
    assert (d["t_c_phase1_us"], d["t_c_phase2_us"]) == (61, 62)
    assert d["contributor_hist"] == [1, 0, 3, 6]
    for f in ("op_id", "n", "start_us", "phase1_end_us", "p1_received", "p2_expected",
              "sat_quantize", "sat_transform", "sat_output", "nonfinite", "world"):  # fmt: skip
        assert d[f] == getattr(st, f), f
    frame = host_port.stats_frame(words)
    f = host_port.parse(frame)
    assert (f.kind, f.op_id, f.n, f.exponent, f.count) == (
        host_port.STATS,
        7,
        1000,
        -20,
        len(words),
    )
    assert np.frombuffer(f.payload, ">u4").tolist() == words


def test_start_carries_the_inband_flag_and_the_proposal_word():
    """A START with exponent None asks for the in-band exponent; its proposal word rides in
    the header's last two bytes; DATA fragments and given exponents carry zeros."""
    x = np.arange(2 * host_port.FRAGMENT + 3, dtype=np.float32)
    word = 0x8101  # proposal -127
    frames = host_port.chunk_frames(host_port.START, 9, x, None, word)
    heads = [host_port.parse(f) for f in frames]
    assert [(h.kind, h.flags, h.proposal) for h in heads] == [
        (host_port.START, host_port.FLAG_INBAND, word), (host_port.DATA, 0, 0),
        (host_port.DATA, 0, 0),
    ]  # fmt: skip
    assert frames[0][14 + 17 : 14 + 20] == bytes([1, 0x81, 0x01])
    asm = host_port.ChunkAssembler()
    done = [asm.add(h) for h in heads]
    assert done[:2] == [None, None]
    c = done[2]
    assert (c.op_id, c.exponent, c.proposal) == (9, None, word)
    np.testing.assert_equal(c.data, x)
    given = host_port.ChunkAssembler().add(
        host_port.parse(host_port.chunk_frames(host_port.START, 3, x[:5], -4)[0])
    )
    assert (given.exponent, given.proposal) == (-4, 0)
    assert host_port.chunk_frames(host_port.START, 3, x[:5], -4)[0][14 + 17 : 14 + 20] == bytes(3)


def test_bad_stats_records():
    words = host_port.stats_words(_stats())
    with pytest.raises(ValueError, match="world 3"):
        host_port.stats_from_words(words[:-1])
    bad = list(words)
    bad[host_port.STATS_FIELDS.index("phase1_reason")] = 9
    with pytest.raises(ValueError, match="code 9"):
        host_port.stats_from_words(bad)
    st = _stats()
    st.contributor_hist = [1, 2]
    with pytest.raises(ValueError, match="histogram"):
        host_port.stats_words(st)


def test_replay_stats_frames_match_the_results():
    res = replay(make_trace("clean", 3))
    stats = [
        host_port.stats_from_words(np.frombuffer(host_port.parse(f).payload, ">u4").tolist())
        for _, f in res.frames
        if host_port.is_host_frame(f) and host_port.parse(f).kind == host_port.STATS
    ]
    assert sorted(s["op_id"] for s in stats) == sorted(res.results)
    for s in stats:
        assert s["n"] == len(res.results[s["op_id"]])
        assert s["phase1_reason"] == s["phase2_reason"] == "complete"  # clean: nothing lost
        assert s["p1_received"] == s["p1_expected"] and s["p2_received"] == s["p2_expected"]
        assert s["contributor_hist"][0] == 0 and s["contributor_hist"][-1] > 0


def test_fragments_and_padding_comes_off():
    """An op's chunk is cut into fragments of at most `fragment` words, the last one as
    short as it comes; a wire pads a frame under Ethernet's 60 bytes, and the padding is
    cut by the header's count."""
    x = np.arange(257, dtype=np.float32)
    frames = host_port.chunk_frames(host_port.START, 3, x, 0, fragment=256)
    got = [host_port.parse(f) for f in frames]
    assert [(f.kind, f.offset, f.count) for f in got] == [(host_port.START, 0, 256),
                                                          (host_port.DATA, 256, 1)]  # fmt: skip
    assert [len(f) for f in frames] == [34 + 4 * 256, 34 + 4]
    assert np.array_equal(np.concatenate([np.frombuffer(f.payload, ">f4") for f in got]), x)
    assert host_port.unpad(frames[1] + bytes(22)) == frames[1]
    short = host_port.reg_request([(0x10, None)], tag=9)  # 42 bytes
    assert len(short) == 42
    padded = short + bytes(18)
    assert host_port.unpad(padded) == short
    assert host_port.parse(host_port.unpad(padded)).op_id == 9
    long = host_port.reg_request([(0x10, None)] * 4)  # 66 bytes: nothing to cut
    assert host_port.unpad(long) == long
