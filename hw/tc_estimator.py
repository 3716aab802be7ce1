"""t_C of phase 1: this node's integer EWMA estimator and the world's median consensus.

Models `host/model/deadline.py`: `TcEstimator.sample` (own t_C) and `agreed_timeout`
(T = min(lower median of the world's t_C table, t_B)), as `NicModel` keeps them
for phase 1 (`_set_tc`, `_timeout`, `_t_change`).

The median is kept by incremental rank counters instead of sorting: every entry j
of the table has a rank, its position in the order of the keys (value, j) (the
index breaks ties, so ranks are a permutation). When entry r changes from `old` to
`new`, each other entry's rank moves by at most one, by two comparisons, and r's
new rank is the number of keys below (new, r). One entry per cycle: an update takes
`world` + 4 cycles, with three key comparators, whatever n_max is (the scan is three
pipeline stages). Entries j >= world never move and rank above every
live one (they keep their reset ranks). The median register is the value whose rank
is (world - 1) // 2, so T is valid in every cycle in which `busy` is low. `floor` is
the tick of the last table change (the model's `_t_change`): a deadline that moved
into the past ends the phase there. Ticks wrap (hw/deadline.py, "Ticks"): `floor_live`
goes low once the floor is 2^(tick_bits - 2) ticks behind `now`, and after a reset or
restart (the model's floor is then 0, below every tick): every live phase began after
it, so the owners then ignore it.

Storage. The table and the ranks are LUT RAM with one read and one write port each
(the scan reads one entry a cycle and writes one rank a cycle), not n_max registers
behind wide muxes. A restart cannot rewrite every word at once, so a `fresh` bit per
entry says it still holds its restart value (the t_c_init last taken, rank j); the
entry's first write clears it. A reset sets every `fresh` bit, as a restart does.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from optireduce.params import NicParams


def tc_bits(p: NicParams) -> int:
    """Bits of a t_C value inside the NIC: NicParams.t_b_bits. Own t_C is at most t_B,
    and a peer's is recorded as at most NicParams.t_c_max_us = 2^t_b_bits - 1 (the core
    saturates the header's 32-bit field: `saturated_tc`), as the model records it."""
    return p.t_b_bits


def saturated_tc(p: NicParams, t_c_us: Value) -> Value:
    """A header's t_C as the NIC records it: min(t_c_us, t_c_max_us), tc_bits(p) wide."""
    w = tc_bits(p)
    return Mux(t_c_us[w:].any(), p.t_c_max_us, t_c_us[:w])


def tc_update_layout(p: NicParams) -> data.StructLayout:
    """One table write: rank, its new t_C, and the tick it happened."""
    return data.StructLayout({"rank": range(p.n_max), "value": tc_bits(p), "at": p.tick_bits})


def tc_sample_layout(p: NicParams) -> data.StructLayout:
    """One completion-time sample of this node's phase 1, and the tick of the phase end."""
    return data.StructLayout({"value": p.tick_bits, "at": p.tick_bits})


def tc_bank_signature(p: NicParams) -> wiring.Signature:
    """One phase's ports of the estimator, as the estimator sees them (an owner that uses
    a shared estimator has them flipped: In(tc_bank_signature(p)))."""
    return wiring.Signature(
        {
            "now": In(p.tick_bits),
            "update": In(stream.Signature(tc_update_layout(p))),
            "sample": In(stream.Signature(tc_sample_layout(p))),
            "busy": Out(1),
            "timeout": Out(tc_bits(p)),  # T, valid while busy is low
            "median": Out(tc_bits(p)),
            "own_tc": Out(tc_bits(p)),  # what this node's packets carry
            "floor": Out(p.tick_bits),
            "floor_live": Out(1),
        }
    )


class TcEstimator(wiring.Component):
    """Own t_C (EWMA) + the world's t_C table + live T = min(lower median, t_B).

    Ports: `update` (a peer's piggybacked t_C), `sample` (own phase-1 duration);
    both are taken only when `busy` is low (their `ready`). `world`, `rank`, `t_b`,
    `t_c_min` are static configuration (change them only between ops). Reset value of
    every t_C: `NicParams.t_c_init`; a new value on `t_c_init` restarts the estimator from
    it (the table, the median, the EWMA) once it is idle, so one build serves every
    t_c_init and t_c_min the registers give it.

    `banks` = 2: one estimator for both phases (the NIC core's). Each bank is a phase's
    own state (table, median, EWMA, floor) behind its own ports `b0` and `b1`
    (tc_bank_signature); one engine serves their requests in turn, so a bank's request
    may wait for the other's (at most world + 10 cycles). A sample is latched when it
    is offered (an owner offers it for one cycle, with its bank not busy).
    """

    # not a stream block: an update is in T after at most world + 4 cycles (busy low again),
    # a sample after world + 10 (with two banks, plus what the other bank's request takes)
    LATENCY = 0
    # the EWMA steps: `own_tc` holds a sample's result OWN_LATENCY cycles after the owner's
    # registered end strobe (OWN_LATENCY + 1 after the sample is taken) when the engine is
    # free for it; nothing waits on this count any more (the core waits for the bank)
    OWN_LATENCY = 6

    def __init__(self, p: NicParams, banks: int = 1) -> None:
        if banks not in (1, 2):
            raise ValueError(f"TcEstimator: banks={banks}; one or two phases")
        self.p, self.banks = p, banks
        config = {
            "world": In(range(p.n_max + 1)),
            "rank": In(range(p.n_max)),
            "t_b": In(32),
            "t_c_min": In(tc_bits(p), init=p.t_c_min_us),
            "t_c_init": In(tc_bits(p), init=p.t_c_init),
        }
        sig = tc_bank_signature(p)
        if banks == 1:
            super().__init__({**config, **sig.members})
        else:
            super().__init__({**config, **{f"b{k}": Out(sig) for k in range(banks)}})

    def elaborate(self, platform):
        p, nb = self.p, self.banks
        m = Module()
        n = p.n_max
        jb = max(1, (n - 1).bit_length())  # a bank's entries are at bank * 2^jb + j
        ports = [self] if nb == 1 else [getattr(self, f"b{k}") for k in range(nb)]
        init = p.t_c_init
        restart = changed(m, self.t_c_init, init)
        # the tables and their ranks in LUT RAM (module docstring, "Storage")
        depth = n if nb == 1 else nb << jb
        m.submodules.vals = vals = Memory(shape=tc_bits(p), depth=depth, init=[])
        m.submodules.ranks = ranks = Memory(shape=range(n), depth=depth, init=[])
        vals_rd, ranks_rd = vals.read_port(domain="comb"), ranks.read_port(domain="comb")
        vals_wr, ranks_wr = vals.write_port(), ranks.write_port()
        eb = Signal(range(nb))  # the bank the engine works for

        def at(j):
            """The memory address of entry j of bank eb."""
            return j if nb == 1 else Cat(j[:jb], eb)

        def banked(name, shape, init=0, **kw):
            return [Signal(shape, name=f"{name}{k}" if nb > 1 else name, init=init, **kw)
                    for k in range(nb)]  # fmt: skip

        def cur(regs):
            """The engine's bank's register (to read or to assign)."""
            return regs[0] if nb == 1 else Array(regs)[eb]

        fresh_v = banked("fresh_v", n, (1 << n) - 1)  # entry j reads restart.seen
        fresh_r = banked("fresh_r", n, (1 << n) - 1)  # rank j reads j
        read_at = Signal(range(n))
        val_j = Mux(cur(fresh_v).bit_select(read_at, 1), restart.seen, vals_rd.data)
        rank_j = Mux(cur(fresh_r).bit_select(read_at, 1), read_at, ranks_rd.data)
        m.d.comb += [vals_rd.addr.eq(at(read_at)), ranks_rd.addr.eq(at(read_at))]
        med = banked("med", tc_bits(p), init)
        tb = p.tick_bits
        floor, floor_live = banked("floor", tb), banked("floor_live", 1)
        for k, port in enumerate(ports):
            with m.If((port.now - floor[k])[tb - 2]):  # 2^(tick_bits - 2) old: retired
                m.d.sync += floor_live[k].eq(0)

        # EWMA state: a tick-wide sample s < 2^tb keeps mean and dev in [0, 2^tb) (each step
        # moves them toward s or |s - mean|, rounding down to no lower than 0), so they and
        # the error s - mean fit tb + 1 signed bits; t_C = mean + 16 dev at most, tb + 6
        wide = tb + 1
        mean = banked("mean", signed(wide))
        dev = banked("dev", signed(wide))
        have = banked("have", 1)  # a first sample was taken (the model's mean is not None)
        own = banked("own", tc_bits(p), init)

        # one table write in progress
        r = Signal(range(n))
        new = Signal(tc_bits(p))
        old = Signal(tc_bits(p))
        at_tick = Signal(tb)
        j = Signal(range(n + 1))
        below = Signal(range(n + 1))  # keys below (new, r) so far
        k_med = Signal(range(n))
        m.d.comb += k_med.eq((self.world - 1) >> 1)

        for k, port in enumerate(ports):
            m.d.comb += [
                port.median.eq(med[k]),
                port.timeout.eq(Mux(med[k] < self.t_b, med[k], self.t_b)),
                port.own_tc.eq(own[k]),
                port.floor.eq(floor[k]),
                port.floor_live.eq(floor_live[k]),
            ]

        def key_lt(va, ia, vb, ib):
            return (va < vb) | ((va == vb) & (ia < ib))

        # the scan in three stages (125 MHz): A reads entry j, B compares its key with the
        # old and new keys of r, C moves its rank and counts the keys below (new, r)
        vj_r = Signal(tc_bits(p))
        rj_r = Signal(range(n))
        jr = Signal(range(n + 1))
        a_valid, a_ok = Signal(), Signal()
        vj_b = Signal(tc_bits(p))
        rj_b = Signal(range(n))
        jb_r = Signal(range(n + 1))
        b_ok = Signal()
        was, now_, lt_new = Signal(), Signal(), Signal()
        m.d.sync += [
            vj_b.eq(vj_r), rj_b.eq(rj_r), jb_r.eq(jr), b_ok.eq(a_valid & a_ok),
            was.eq(key_lt(old, r, vj_r, jr)),  # r was below jr
            now_.eq(key_lt(new, r, vj_r, jr)),  # r is below jr
            lt_new.eq(key_lt(vj_r, jr, new, r)),
        ]  # fmt: skip
        # whether entry j's new rank is the median's, from its old rank compared ahead
        down, same, up = Signal(), Signal(), Signal()  # rank - 1, rank, rank + 1 is k_med
        m.d.sync += [down.eq(rj_r == k_med + 1), same.eq(rj_r == k_med), up.eq(rj_r + 1 == k_med)]
        with m.If(b_ok):
            m.d.sync += below.eq(below + lt_new)
            m.d.comb += [ranks_wr.en.eq(1), ranks_wr.addr.eq(at(jb_r)),
                         ranks_wr.data.eq(rj_b + now_ - was)]  # fmt: skip
            m.d.sync += cur(fresh_r).bit_select(jb_r, 1).eq(0)
            with m.If(Mux(now_ == was, same, Mux(now_, up, down))):
                m.d.sync += cur(med).eq(vj_b)

        # A sample is taken when offered (an owner offers one for a single cycle): by the
        # engine if it is free for it, else into its bank's latch, served first after.
        smp_pend = banked("smp_pend", 1)
        smp_val, smp_at = banked("smp_val", tb), banked("smp_at", tb)
        smp_asks, smp_in, smp_in_at, smp_took = [], [], [], []
        for k, port in enumerate(ports):
            took = Signal(name=f"smp_took{k}")
            m.d.comb += port.sample.ready.eq(~smp_pend[k])
            smp_asks.append(smp_pend[k] | port.sample.valid)
            smp_in.append(Mux(smp_pend[k], smp_val[k], port.sample.payload.value))
            smp_in_at.append(Mux(smp_pend[k], smp_at[k], port.sample.payload.at))
            smp_took.append(took)
            with m.If(took):
                m.d.sync += smp_pend[k].eq(0)
            with m.Elif(port.sample.valid & ~smp_pend[k]):
                m.d.sync += [smp_pend[k].eq(1), smp_val[k].eq(port.sample.payload.value),
                             smp_at[k].eq(port.sample.payload.at)]  # fmt: skip
        turn = Signal(range(nb))  # the bank served first when both ask (they alternate)

        smp = Signal(tb)
        with m.FSM() as fsm:
            with m.State("IDLE"):
                idle = ~restart.pending
                if nb == 1:
                    pick = Const(0, 1)
                else:
                    asks = [ports[k].update.valid | smp_asks[k] for k in range(nb)]
                    pick = Mux(asks[0] & asks[1], turn, asks[1])
                for k, port in enumerate(ports):  # a sample taken before goes first
                    m.d.comb += port.update.ready.eq(idle & (pick == k) & ~smp_asks[k])
                with m.If(restart.pending):  # every t_C state as after reset, from the new init
                    m.d.comb += restart.take.eq(1)
                    for k in range(nb):
                        m.d.sync += [fresh_v[k].eq(-1), fresh_r[k].eq(-1)]
                        m.d.sync += [med[k].eq(self.t_c_init), own[k].eq(self.t_c_init),
                                     floor_live[k].eq(0), mean[k].eq(0), dev[k].eq(0),
                                     have[k].eq(0)]  # fmt: skip
                        # a latched sample is the old estimator's: the restart undoes it
                        m.d.sync += smp_pend[k].eq(0)
                with m.Else():
                    for k, port in enumerate(ports):
                        with m.If(pick == k):
                            with m.If(smp_asks[k]):
                                m.d.comb += smp_took[k].eq(1)
                                m.d.sync += [eb.eq(k), turn.eq(k + 1), smp.eq(smp_in[k]),
                                             at_tick.eq(smp_in_at[k])]  # fmt: skip
                                m.next = "EWMA"
                            with m.Elif(port.update.valid):
                                m.d.sync += [
                                    eb.eq(k), turn.eq(k + 1),
                                    r.eq(port.update.payload.rank),
                                    new.eq(port.update.payload.value),
                                    at_tick.eq(port.update.payload.at),
                                ]  # fmt: skip
                                m.next = "CHECK"
            # the EWMA in steps: error, mean and deviation, t_C's clamp compares, the clamp.
            # Its magnitude and t_C are not registered (the core's 52 MHz allows two carry
            # chains a step); their states still wait a cycle each (the owners' bounds were
            # checked with them; the core no longer needs them)
            err = Signal(signed(wide + 1))
            abs_err = Mux(err < 0, -err, err)
            mean_n = Signal(signed(wide))
            dev_n = Signal(signed(wide))
            with m.State("EWMA"):
                m.d.sync += err.eq(smp - cur(mean))
                m.next = "EWMA_ABS"
            with m.State("EWMA_ABS"):
                m.next = "EWMA_MD"
            with m.State("EWMA_MD"):
                with m.If(~cur(have)):
                    m.d.sync += [mean_n.eq(smp), dev_n.eq(smp >> 1)]
                with m.Else():
                    m.d.sync += [
                        mean_n.eq(cur(mean) + (err >> p.tc_gain_shift)),
                        dev_n.eq(cur(dev) + ((abs_err - cur(dev)) >> p.tc_dev_shift)),
                    ]
                m.next = "EWMA_TC"
            tc_w = Signal(signed(wide + 6))
            m.d.comb += tc_w.eq(mean_n + dev_n * p.tc_dev_mult)
            with m.State("EWMA_TC"):
                m.next = "EWMA_CLAMP"
            lo = self.t_c_min  # the model clamps at t_c_min, not 1
            below_lo, above_tb = Signal(), Signal()
            with m.State("EWMA_CLAMP"):
                m.d.sync += [below_lo.eq(tc_w < lo), above_tb.eq(self.t_b < tc_w)]
                m.next = "EWMA_SET"
            with m.State("EWMA_SET"):
                tc_c = Mux(below_lo, lo, Mux(above_tb, self.t_b, tc_w))
                m.d.sync += [cur(mean).eq(mean_n), cur(dev).eq(dev_n), cur(have).eq(1),
                             cur(own).eq(tc_c[:tc_bits(p)])]  # fmt: skip
                m.d.sync += [new.eq(tc_c[: tc_bits(p)]), r.eq(self.rank)]
                m.next = "CHECK"
            with m.State("CHECK"):  # read the entry (a wide mux), then compare
                m.d.comb += read_at.eq(r)
                m.d.sync += [old.eq(val_j), j.eq(0), below.eq(0), a_valid.eq(0)]
                m.next = "CHECK_EQ"
            with m.State("CHECK_EQ"):
                # only a change moves the ranks and the floor (the model's _set_tc)
                with m.If(old == new):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "SCAN"
            with m.State("SCAN"):  # stage A: read entry j (stage B below moves it)
                m.d.sync += [vj_r.eq(val_j), rj_r.eq(rank_j), jr.eq(j)]
                m.d.sync += [a_valid.eq(j < self.world), a_ok.eq((j < self.world) & (j != r))]
                with m.If(j < self.world):  # j = world = n_max would read past the RAM
                    m.d.comb += read_at.eq(j)
                    m.d.sync += j.eq(j + 1)
                with m.Else():
                    m.next = "DRAIN"
            with m.State("DRAIN"):  # stage C takes the last entry
                m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += [
                    vals_wr.en.eq(1), vals_wr.addr.eq(at(r)), vals_wr.data.eq(new),
                    ranks_wr.en.eq(1), ranks_wr.addr.eq(at(r)), ranks_wr.data.eq(below),
                ]  # fmt: skip
                m.d.sync += [cur(fresh_v).bit_select(r, 1).eq(0),
                             cur(fresh_r).bit_select(r, 1).eq(0),
                             cur(floor).eq(at_tick), cur(floor_live).eq(1)]  # fmt: skip
                with m.If(below == k_med):
                    m.d.sync += cur(med).eq(new)
                m.next = "IDLE"
        # a request in flight already makes T stale (a bank's: the other's leaves it valid)
        working = ~fsm.ongoing("IDLE")
        for k, port in enumerate(ports):
            mine = working & (eb == k) if nb > 1 else working
            m.d.comb += port.busy.eq(
                mine | Cat(port.update.valid, port.sample.valid, smp_pend[k],
                           restart.pending).any()
            )  # fmt: skip
        return m


def owner_estimator(m: Module, owner: wiring.Component, now) -> wiring.PureInterface:
    """An owner's phase estimator, as `tc`: its own TcEstimator, configured from its ports,
    or (`owner.tc_external`) its `tc` port, a bank of the core's shared one. `now` is the
    owner's clock; the owner's `own_tc` port shows the estimator's."""
    if owner.tc_external:
        tc = owner.tc
    else:
        m.submodules.tc = tc = TcEstimator(owner.p)
        m.d.comb += [tc.world.eq(owner.world), tc.rank.eq(owner.rank), tc.t_b.eq(owner.t_b),
                     tc.t_c_min.eq(owner.t_c_min), tc.t_c_init.eq(owner.t_c_init)]  # fmt: skip
    m.d.comb += [tc.now.eq(now), owner.own_tc.eq(tc.own_tc)]
    return tc


def owner_estimator_port(p: NicParams, external: bool) -> dict:
    """The `tc` member of an owner whose estimator is outside (a bank of the shared one)."""
    return {"tc": In(tc_bank_signature(p))} if external else {}


class Change:
    """`pending`: the watched value differs from the one last taken (`seen`); `take` (a
    strobe the user drives) records it."""

    def __init__(self, pending: Signal, take: Signal, seen: Signal) -> None:
        self.pending, self.take, self.seen = pending, take, seen


def changed(m: Module, value, init: int) -> Change:
    """Whether a configuration value moved since it was last taken (its reset value
    counts as taken): what restarts the t_C state built with `init` from the new one."""
    seen = Signal(len(value), init=init)
    c = Change(Signal(), Signal(), seen)
    m.d.comb += c.pending.eq(value != seen)
    with m.If(c.take):
        m.d.sync += seen.eq(value)
    return c
