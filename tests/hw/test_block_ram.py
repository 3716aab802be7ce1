"""hw/block_ram.py: a read port with a synchronous port's timing (data the cycle after
the address, held while `en` is low), whose read of the address written in the same
cycle gives the old word's complement in simulation; elaborated for a platform (as for
a board) it has no such check, and the simulator then gives the old word (on a DP16KD
the word is undefined)."""

from __future__ import annotations

import random

import pytest
from amaranth import Elaboratable, Module, Signal

from optireduce.hw.block_ram import block_ram, read_port
from optireduce.sim.stream_sim import simulate


class _Ram(Elaboratable):
    def __init__(self, board: bool) -> None:
        self.board = board
        self.w_addr, self.w_data, self.w_en = Signal(4), Signal(8), Signal()
        self.r_addr, self.r_en, self.r_data = Signal(4), Signal(init=1), Signal(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = block_ram(shape=8, depth=16)
        wr = mem.write_port()
        rd = read_port(m, mem, (wr,), platform=object() if self.board else None)
        m.d.comb += [
            wr.addr.eq(self.w_addr), wr.data.eq(self.w_data), wr.en.eq(self.w_en),
            rd.addr.eq(self.r_addr), rd.en.eq(self.r_en), self.r_data.eq(rd.data),
        ]  # fmt: skip
        return m


@pytest.mark.parametrize("board", [False, True])
def test_reads_against_a_list(board):
    dut = _Ram(board)
    rng = random.Random(9)
    model = [0] * 16
    checked = {"collisions": 0, "held": 0, "reads": 0}

    async def bench(ctx):
        want = None  # the data due this cycle
        for _ in range(800):
            w_addr, w_data, w_en = rng.randrange(16), rng.getrandbits(8), rng.random() < 0.5
            r_addr, r_en = rng.randrange(16), rng.random() < 0.8
            for sig, v in ((dut.w_addr, w_addr), (dut.w_data, w_data), (dut.w_en, w_en),
                           (dut.r_addr, r_addr), (dut.r_en, r_en)):  # fmt: skip
                ctx.set(sig, v)
            if want is not None:
                assert ctx.get(dut.r_data) == want
                checked["reads"] += 1
            if r_en:
                old = model[r_addr]
                if w_en and w_addr == r_addr:
                    checked["collisions"] += 1
                    want = old if board else ~old & 0xFF
                else:
                    want = old
            else:  # held: the last read's data again
                checked["held"] += want is not None
            if w_en:
                model[w_addr] = w_data
            await ctx.tick()

    simulate(dut, bench)
    assert checked["reads"] > 700 and checked["collisions"] > 10 and checked["held"] > 50
