"""The peers-gone scan (hw/peer_progress.py) against NicModel._peer_progress.

For each random case: a window of ops, one per context, each with a phase tracker of the
model (host/model/deadline.py PhaseTracker: packets expected and received per sender,
which senders are gone, ended or not), and an event of op j from one sender at tick
`now`. The model's own `_peer_progress` runs on those trackers; the block runs on a
per-sender table holding the same state, with the owner's `hit` bits (a valid context
whose op is <= j - K, not ended, that expects packets from the sender). Then the table's
gone bits must be the trackers' (rcv and flagged unchanged), a `gone` report must come
for exactly the contexts whose last-gone tick the model moved to `now`, in context
order, an `owing` report for exactly the senders that went from owing to gone (the
incremental form of the model's "every sender still owing is gone"), and the scan must
take n_ctx + 1 + 2 h cycles for h hits.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth import Array, Const, Module
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from optireduce.host.model.deadline import PhaseTracker
from optireduce.host.model.nic_model import NicModel
from optireduce.hw import peer_progress
from optireduce.sim.formal_harness import mutant

SIZES = [(4, 8, 2), (8, 3, 3), (2, 2, 1)]  # (n_ctx, n_max, K)


def _case(rng: random.Random, n_ctx: int, n_max: int, k_ops: int):
    """Contexts (op id, tracker, valid, done), the event (op j, sender) and the tick."""
    world = rng.randint(2, n_max)
    rank = rng.randrange(world)
    sender = rng.choice([s for s in range(world) if s != rank])
    base = rng.randrange(0, 50)
    ops = []
    for k in range(n_ctx):
        op = base + ((k - base) % n_ctx)  # op j lives in context j mod n_ctx
        exp = np.array([0 if s == rank else rng.choice([0, 1, 2, 3]) for s in range(n_max)])
        exp[world:] = 0
        tr = PhaseTracker(exp, 64)
        tr.rcv = np.array([rng.randint(0, e) for e in exp], dtype=np.int64)
        tr.gone = np.array([bool(e) and rng.random() < 0.3 for e in exp])
        tr.any_gone = bool(tr.gone.any())
        tr.last_gone = rng.randrange(100) if tr.any_gone else None
        if rng.random() < 0.25:
            tr.end = rng.randrange(100)
        valid, done = rng.random() < 0.9, rng.random() < 0.15
        ops.append(SimpleNamespace(op_id=op, p1=tr, p2=_NoPhase(), done=done, valid=valid))
    op_j = base + rng.randrange(n_ctx + k_ops)
    return ops, op_j, sender, 1000 + rng.randrange(100)


class _NoPhase:
    def sender_gone(self, now: int, sender: int) -> None:
        pass


def _owing(tr: PhaseTracker) -> int:
    return int(((tr.rcv < tr.exp) & ~tr.gone).sum())


def run_model(ops, op_j: int, sender: int, now: int, k_ops: int):
    """NicModel._peer_progress itself, on the valid contexts' ops."""
    nic = SimpleNamespace(
        ops={o.op_id: o for o in ops if o.valid},
        p=SimpleNamespace(ops_in_flight=k_ops),
        _progress=lambda op, now: None,
        peer_done=[-1] * (sender + 1),  # progress_ahead's record (the block has none)
    )
    NicModel._peer_progress(nic, now, sender, op_j)


def run_block(mod, ops, op_j: int, sender: int, n_max: int, k_ops: int):
    """The block on a table of the trackers' state; returns (table, reports, cycles)."""
    n_ctx = len(ops)
    rcv_shape = range(4)
    dut = mod.PeerProgress(n_ctx, n_max, rcv_shape)
    lay = dut.layout
    sb = max(1, (n_max - 1).bit_length())

    def word(rcv, flagged, gone):
        return {"rcv": rcv, "flagged": flagged, "gone": gone}

    init = [word(0, 0, 0)] * (n_ctx << sb)
    for k, o in enumerate(ops):
        for s in range(n_max):
            init[(k << sb) | s] = word(int(o.p1.rcv[s]), (k + s) & 1, int(o.p1.gone[s]))
    m = Module()
    m.submodules.dut = dut
    m.submodules.table = table = Memory(shape=lay, depth=len(init), init=init)
    rd, wr = table.read_port(), table.write_port()
    owed = Array(Const(int(o.p1.exp[sender]), rcv_shape) for o in ops)
    m.d.comb += [
        rd.addr.eq(dut.rd_addr),
        dut.rd_data.eq(rd.data),
        wr.addr.eq(dut.wr_addr),
        wr.data.eq(dut.wr_data),
        wr.en.eq(dut.wr_en),
        dut.owed.eq(owed[dut.ctx]),
    ]
    # the owner's bits: a valid context, op <= j - K, not ended, expecting the sender
    hit = sum(
        1 << k
        for k, o in enumerate(ops)
        if o.valid and not o.done and o.op_id <= op_j - k_ops and o.p1.end is None
        and o.p1.exp[sender] > 0
    )  # fmt: skip
    out = SimpleNamespace(gone=[], owing=[], cycles=None)

    async def tb(ctx):
        ctx.set(dut.hit, hit)
        ctx.set(dut.sender, sender)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for cycle in range(1, 10 * n_ctx + 10):
            if ctx.get(dut.gone):
                out.gone.append(ctx.get(dut.ctx))
            if ctx.get(dut.owing):
                out.owing.append(ctx.get(dut.ctx))
            if ctx.get(dut.done):
                out.cycles = cycle
                break
            await ctx.tick()
        await ctx.tick()
        out.table = [ctx.get(table.data[a]) for a in range(len(init))]

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    out.hits = bin(hit).count("1")
    out.sb = sb
    return out


def check(mod, seed: int, n_ctx: int, n_max: int, k_ops: int) -> None:
    rng = random.Random(seed)
    ops, op_j, sender, now = _case(rng, n_ctx, n_max, k_ops)
    before = [(o.p1.gone.copy(), o.p1.last_gone, _owing(o.p1)) for o in ops]
    got = run_block(mod, ops, op_j, sender, n_max, k_ops)
    run_model(ops, op_j, sender, now, k_ops)
    moved = [k for k, o in enumerate(ops) if o.p1.last_gone == now]
    assert got.gone == moved, (got.gone, moved)
    owing = [before[k][2] - _owing(o.p1) for k, o in enumerate(ops)]
    assert [got.owing.count(k) for k in range(n_ctx)] == owing
    for k, o in enumerate(ops):
        for s in range(n_max):
            e = got.table[(k << got.sb) | s]
            assert (e.rcv, e.flagged) == (o.p1.rcv[s], (k + s) & 1), (k, s)
            assert e.gone == o.p1.gone[s], (k, s)
    assert got.cycles == n_ctx + 1 + 2 * got.hits


@pytest.mark.parametrize(("n_ctx", "n_max", "k_ops"), SIZES)
def test_the_scan_marks_the_senders_gone_as_the_model_does(n_ctx, n_max, k_ops):
    for seed in range(40):
        check(peer_progress, seed, n_ctx, n_max, k_ops)


@pytest.mark.parametrize(
    "edits",
    [
        {"with m.If(~old.gone):": "with m.If(1):"},  # a gone sender reported again
        {"self.owing.eq(old.rcv < owed)": "self.owing.eq(old.rcv <= owed)"},
        {"m.d.sync += count.eq(count + 1)\n                m.next": "m.next"},  # a hit twice
    ],
)
def test_the_check_fails_on_a_broken_scan(edits):
    broken = mutant(peer_progress.__name__, edits)
    with pytest.raises(AssertionError):
        for seed in range(40):
            check(broken, seed, 4, 8, 2)
