"""ProposalTable (hw/proposal_table.py) against NicModel's in-band records, event by event."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from optireduce import ubt
from optireduce.host.model.nic_model import NicModel
from optireduce.hw.proposal_table import ProposalTable
from optireduce.params import NicParams

SMALL = NicParams(p=16, b=64, c=256, n_max=8, exp_inband=True)


def _header(op_id: int, sender: int, word: int) -> ubt.UbtHeader:
    return ubt.UbtHeader(version=ubt.VERSION, msg_type=ubt.MSG_SCATTER, flags=0, exponent=0,
                         job_id=1, sender=sender, op_id=op_id, pkt_index=0, count=16,
                         contributors=0, t_c_us=1, op_len=1, world=2, reserved=word)  # fmt: skip


def _word(rng: np.random.Generator) -> int:
    v = rng.choice([None, None, -128, 127, *rng.integers(-20, 20, 6).tolist()])
    return ubt.proposal_word(None if v is None else int(v))


def _start(nic: NicModel, op_id: int, word: int) -> None:
    """start_op's record keeping alone (the op's data path is not this block's)."""
    nic._proposals.pop(op_id, None)
    nic._proposals.setdefault(op_id + nic.p.exp_lead_eff, {})[nic.rank] = ubt.proposal_of(word)
    nic.last_started = op_id


CASES = [(2, 0, None, 0), (3, 1, 2, 1), (8, 7, None, 2), (5, 0, 3, 3)]  # world, rank, lead


@pytest.mark.parametrize(("world", "rank", "lead", "seed"), CASES)
def test_lookups_equal_the_model(world, rank, lead, seed):
    """Random notes (stale and ahead, repeated senders, no-proposal words) and STARTs, a
    note in the same cycle as a START; after every event the lookup of the next op and of
    a random op ahead equal NicModel.inband_exponent (value, unknown, number missing)."""
    p = SMALL.replace(exp_lead=lead)
    L, K = p.exp_lead_eff, p.ops_in_flight
    nic = NicModel(p, rank, world)
    dut = ProposalTable(p)
    rng = np.random.default_rng(seed)
    peers = [r for r in range(world) if r != rank]
    seen = {"unknown": 0, "known": 0, "missing": 0}

    async def bench(ctx):
        ctx.set(dut.rank, rank)
        ctx.set(dut.world, world)
        nxt = 0
        for _ in range(400):
            ctx.set(dut.next_op, nxt)
            note = rng.random() < 0.7
            start = rng.random() < 0.15 or (not note and rng.random() < 0.5)
            if note:
                op = int(rng.integers(max(0, nxt - L - 3), nxt + 2 * K))
                h = _header(op, int(rng.choice(peers)), _word(rng))
                ctx.set(dut.note, 1)
                ctx.set(dut.note_op, h.op_id)
                ctx.set(dut.note_sender, h.sender)
                ctx.set(dut.note_word, h.reserved)
            if start:
                word = _word(rng)
                ctx.set(dut.start, 1)
                ctx.set(dut.start_op, nxt)
                ctx.set(dut.start_word, word)
                _start(nic, nxt, word)  # first: a same-cycle note comes after it
            if note and h.op_id + L > nic.last_started:
                nic._note_proposal(h)
            await ctx.tick()
            if start:
                nxt += 1
            ctx.set(dut.note, 0)
            ctx.set(dut.start, 0)
            ctx.set(dut.next_op, nxt)
            for q in (nxt, nxt + int(rng.integers(1, 2 * K + L))):
                ctx.set(dut.q_op, q)
                await ctx.tick()
                inb = nic.inband_exponent(q)
                assert ctx.get(dut.fresh)
                assert ctx.get(dut.q_unknown) == (inb.exponent is None), q
                assert ctx.get(dut.q_missing) == len(inb.missing), q
                if inb.exponent is not None:
                    assert ctx.get(dut.q_exp) == inb.exponent, q
                seen["unknown" if inb.exponent is None else "known"] += 1
                seen["missing"] += bool(inb.missing)
        # a write in the lookup's cycle makes it stale
        ctx.set(dut.start, 1)
        ctx.set(dut.start_op, nxt)
        await ctx.tick()
        assert not ctx.get(dut.fresh)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert min(seen.values()) >= 20, seen  # every outcome was checked many times
