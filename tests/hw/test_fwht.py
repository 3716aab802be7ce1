"""Fwht (hw/fwht.py) against host/model/fwht.py: fwht_blocks, bit for bit."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce.experiments.fmax import bram_output_sinks, ecp5_netlist
from optireduce.host.model.fwht import fwht_blocks
from optireduce.hw.axis import AxisWrapper
from optireduce.hw.fwht import Fwht
from optireduce.hw.saturate import Saturate
from optireduce.hw.streams import element_stream
from optireduce.params import NicParams
from optireduce.sim.cocotb_run import run_bench
from optireduce.sim.stream_sim import element_payload, run_stream


def small(b: int = 64, lanes: int = 1) -> NicParams:
    return NicParams(p=16, b=b, c=4 * b, n_max=8, lanes=lanes)


def op_payloads(x: np.ndarray, op_blocks: list[int], b: int, lanes: int) -> list[dict]:
    """Beats of consecutive ops of op_blocks[k] blocks each, first/last on each op's ends."""
    out, start = [], 0
    for nb in op_blocks:
        beats = x[start : start + nb * b].reshape(-1, lanes)
        out += [element_payload(v, k == 0, k == len(beats) - 1) for k, v in enumerate(beats)]
        start += nb * b
    assert start == len(x)
    return out


def run_fwht(p, width, x, op_blocks, idle=0.0, bp=0.0, seed=0, dut=None):
    """Stream x through a Fwht; check the flags; return (outputs flat, StreamRun, dut)."""
    dut = dut or Fwht(p, width)
    pl = op_payloads(x, op_blocks, p.b, p.lanes)
    run = run_stream(dut, pl, len(pl), idle=idle, backpressure=bp, seed=seed)
    # element positions are preserved, so each output beat carries its input beat's flags
    assert [o[1] for o in run.outputs] == [q["first"] for q in pl]
    assert [o[2] for o in run.outputs] == [q["last"] for q in pl]
    y = np.array([o[0] for o in run.outputs], dtype=np.int64).ravel()
    return y, run, dut


def sym_max(width: int) -> int:
    return (1 << (width - 1)) - 1


def hadamard_row(k: int, b: int) -> np.ndarray:
    """Row k of the Sylvester matrix from its closed form (-1)^popcount(k & m)."""
    return np.array([-1 if bin(k & m).count("1") % 2 else 1 for m in range(b)], dtype=np.int64)


@pytest.mark.parametrize("lanes", [1, 2])
def test_impulse_gives_hadamard_rows(lanes):
    p, w = small(64, lanes), 20
    amp, ks = sym_max(w), (0, 5, 63)
    x = np.zeros(len(ks) * p.b, dtype=np.int64)
    for blk, k in enumerate(ks):
        x[blk * p.b + k] = amp
    y, _, _ = run_fwht(p, w, x, [1, 2], idle=0.3, bp=0.3, seed=lanes)
    np.testing.assert_equal(y, np.concatenate([amp * hadamard_row(k, p.b) for k in ks]))
    np.testing.assert_equal(y, fwht_blocks(x, p.b))


@pytest.mark.parametrize("lanes", [1, 2])
def test_zero_and_max_magnitude(lanes):
    p = small(64, lanes)
    w = p.w_wire  # the inverse width: the widest datapath
    m = sym_max(w)
    row = hadamard_row(37, p.b)
    blocks = [
        np.zeros(p.b, dtype=np.int64),
        np.full(p.b, m),
        np.full(p.b, -m),
        m * row,  # all of the block adds up at output 37: the largest output there is
        -m * row,
        m * hadamard_row(p.b - 1, p.b),
    ]
    x = np.concatenate(blocks)
    y, _, _ = run_fwht(p, w, x, [1, 3, 2], idle=0.2, bp=0.4, seed=7)
    np.testing.assert_equal(y, fwht_blocks(x, p.b))
    yb = y.reshape(-1, p.b)
    assert not yb[0].any()
    assert yb[1][0] == p.b * m and not yb[1][1:].any()
    assert yb[3][37] == p.b * m and yb[4][37] == -p.b * m
    assert yb[3].max() == (1 << (p.w_wire + p.log2_b - 1)) - p.b  # top of the output width


@pytest.mark.parametrize(
    ("b", "lanes", "width", "idle", "bp", "mem_min_delay"),
    [
        (64, 1, "w_in", 0.3, 0.3, 4),
        (64, 2, "w_wire", 0.5, 0.2, 4),
        (256, 1, "w_wire", 0.2, 0.5, 64),  # register delay lines for delays 1..32
        (256, 2, "w_in", 0.3, 0.3, 4),
    ],
)
def test_random_ops_match_model(b, lanes, width, idle, bp, mem_min_delay):
    p = small(b, lanes)
    w = getattr(p, width)
    rng = np.random.default_rng(b + lanes)
    op_blocks = [1, 3, 2, 1]
    x = rng.integers(-sym_max(w), sym_max(w) + 1, sum(op_blocks) * b)
    x[b : b + 8] = sym_max(w)  # saturated runs inside an op
    x[2 * b - 8 : 2 * b] = -sym_max(w)
    dut = Fwht(p, w, mem_min_delay=mem_min_delay)
    y, _, _ = run_fwht(p, w, x, op_blocks, idle=idle, bp=bp, seed=b * lanes, dut=dut)
    assert dut.width_out == w + p.log2_b
    np.testing.assert_equal(y, fwht_blocks(x, b))


@pytest.mark.parametrize(
    ("scale", "idle", "bp"),
    [(1, 0.0, 0.0), (1, 0.6, 0.0), (1, 0.0, 0.6), (2, 0.7, 0.7), (1, 0.3, 0.8)],
)
def test_prefetch_keeps_up_at_the_shortest_memory_delay(scale, idle, bp):
    # the shortest memory delay line pops an entry as few slots after its push as the read
    # pipeline needs (hw/fwht.py, _sdf_stage): the tightest case, with idle and backpressure
    dmin = 1 << (Fwht.READ_REGS + 2 - 1).bit_length()  # smallest power of two >= R + 2
    b = 2 * dmin * scale
    p, w = NicParams(p=4, b=b, c=4 * b, n_max=8), 12
    dut = Fwht(p, w)
    assert dmin in dut.delays and dmin >= dut.mem_min_delay > dmin // 2
    rng = np.random.default_rng(b + int(10 * idle) + int(100 * bp))
    op_blocks = [3, 1, 4]
    x = rng.integers(-sym_max(w), sym_max(w) + 1, sum(op_blocks) * b)
    y, run, _ = run_fwht(p, w, x, op_blocks, idle=idle, bp=bp, seed=b, dut=dut)
    np.testing.assert_equal(y, fwht_blocks(x, b))
    if idle == bp == 0.0:
        assert run.latency == dut.LATENCY == b + b.bit_length()
        np.testing.assert_equal(np.diff(run.out_cycles), 1)


def test_sparse_input_drains_between_beats():
    # mostly idle input: every stage keeps draining its differences between beats
    p, w = small(64, 1), 24
    rng = np.random.default_rng(5)
    x = rng.integers(-sym_max(w), sym_max(w) + 1, 3 * p.b)
    y, _, _ = run_fwht(p, w, x, [2, 1], idle=0.9, bp=0.1, seed=11)
    np.testing.assert_equal(y, fwht_blocks(x, p.b))


@pytest.mark.parametrize(("b", "lanes"), [(64, 1), (256, 2)])
def test_full_rate_latency_and_flush(b, lanes):
    p, w = small(b, lanes), 16
    rng = np.random.default_rng(b)
    op_blocks = [1, 2, 1]
    x = rng.integers(-sym_max(w), sym_max(w) + 1, sum(op_blocks) * b)
    y, run, dut = run_fwht(p, w, x, op_blocks)
    np.testing.assert_equal(y, fwht_blocks(x, b))
    assert b // lanes + (b // lanes).bit_length() == dut.LATENCY  # beats + log2(beats) + 1
    assert run.latency == dut.LATENCY
    np.testing.assert_equal(np.diff(run.in_cycles), 1)  # input never refused
    np.testing.assert_equal(np.diff(run.out_cycles), 1)  # output without bubbles
    # no more input after the last op: its tail still comes out, LATENCY after its last beat
    assert run.out_cycles[-1] - run.in_cycles[-1] == dut.LATENCY


def test_block_4096_matches_model():
    p = NicParams(p=256, b=4096, c=8192, n_max=8, lanes=1)
    rng = np.random.default_rng(4096)
    x = rng.integers(-p.q_max, p.q_max + 1, 2 * p.b)
    x[p.b : p.b + 300] = p.q_max
    y, _, dut = run_fwht(p, p.w_in, x, [1, 1], idle=0.05, bp=0.05, seed=3)
    assert dut.width_out == p.w_fwd
    np.testing.assert_equal(y, fwht_blocks(x, p.b))


def test_bram_reads_drive_only_flip_flops():
    # the timing fix (docs/gateware.md, "Timing"): after yosys synth_ecp5, every DP16KD data
    # output drives one flip-flop and no logic (a collision-emulation mux was there before)
    p = NicParams(p=64, b=1024, c=2048, n_max=8)
    dut = Fwht(p, p.w_in)
    sinks = bram_output_sinks(ecp5_netlist(dut, "fwht_b1024"), "fwht_b1024")
    assert sinks, "no DP16KD in the synthesized FWHT: the check would be empty"
    assert set(sinks) == {"TRELLIS_FF.DI"}, sinks


class EncodeDecode(wiring.Component):
    """forward WHT -> saturate to the wire -> inverse WHT: the codec's integer datapath."""

    def __init__(self, p: NicParams) -> None:
        self.fwd, self.sat, self.inv = Fwht(p, p.w_in), Saturate(p, p.w_fwd), Fwht(p, p.w_wire)
        super().__init__(
            {"i": In(element_stream(p.w_in, p.lanes)), "o": Out(element_stream(p.w_inv, p.lanes))}
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.fwd, m.submodules.sat, m.submodules.inv = self.fwd, self.sat, self.inv
        wiring.connect(m, wiring.flipped(self.i), self.fwd.i)
        wiring.connect(m, self.fwd.o, self.sat.i)
        wiring.connect(m, self.sat.o, self.inv.i)
        wiring.connect(m, self.inv.o, wiring.flipped(self.o))
        return m


def test_inverse_of_forward_is_b_times_x():
    p = small(256, 2)
    rng = np.random.default_rng(9)
    op_blocks = [2, 1]
    x = rng.integers(-p.q_max, p.q_max + 1, sum(op_blocks) * p.b)
    x[:3] = [p.q_max, -p.q_max, 0]
    y, _, _ = run_fwht(p, p.w_in, x, op_blocks, idle=0.3, bp=0.3, seed=4, dut=EncodeDecode(p))
    np.testing.assert_equal(y, p.b * x)


def test_cocotb_verilator():
    p = small(256, 2)
    run_bench(
        AxisWrapper(Fwht(p, p.w_wire)),
        "fwht_b256_l2",
        f"{__package__}.benches.tb_fwht",
        {"b": p.b, "lanes": p.lanes, "width_in": p.w_wire, "width_out": p.w_inv},
    )


def test_input_ready_does_not_follow_the_consumer_within_a_cycle():
    """The output's skid buffer: `i.ready` (the pipeline's enable) comes from flip-flops, so
    toggling `o.ready` alone never moves it; a stalled consumer still gets every value."""
    from optireduce.sim.stream_sim import run_registered_ready

    p = NicParams(p=16, b=64, c=256, n_max=8)
    dut = Fwht(p, p.w_in)
    x = np.random.default_rng(4).integers(-1000, 1000, p.b * 3)
    beats = [element_payload([int(v)], k % p.b == 0, k % p.b == p.b - 1) for k, v in enumerate(x)]
    got, _ = run_registered_ready(dut, beats, len(x), read=lambda pl: pl.data[0], seed=4)
    assert got == fwht_blocks(x, p.b).tolist()
