"""Throughput, latency and area of the phase-1 aggregator (hw/aggregator.py).

The aggregator is not a one-in, one-out stream block: a packet's payload on `i`
follows its event on `ev`, and the means come out on `o` when the phase ends. So
`run_stream` (which drives `i` alone) cannot feed it, and this bench drives it with
its own amaranth.sim testbench, with no idle and no backpressure, at the default
NicParams:

  cycles_per_element   ingest: cycles per payload element, events and payloads
                       back to back (own packets and one peer's, world 2), from
                       the first payload beat to the last
  readout_cycles_per_element   emission of the means: cycles per output element
  latency_cycles       from the phase-end decision (`end_valid`) to the first mean
"""

from __future__ import annotations

import numpy as np

from optireduce.hw.aggregator import Aggregator, Kind
from optireduce.params import NicParams
from optireduce.sim.stream_sim import set_ports, simulate


def figures(p: NicParams | None = None) -> dict:
    p = p or NicParams()
    dut = Aggregator(p)
    world, rank, n = 2, 0, p.c
    slots = list(range(rank, p.packets_for(n), world))
    beats = p.p // p.lanes
    rng = np.random.default_rng(0)
    res = {}

    async def bench(ctx):
        set_ports(ctx, dut, rank=rank, world=world, t_b=p.t_b_us, alpha_q8=p.alpha_q8)
        ctx.set(dut.o.ready, 1)
        cycle = 0
        first_beat = last_beat = None
        end_cycle = first_out = None
        n_out = 0
        events = [(Kind.START, rank, 0, False)]  # then the own packets, then the peer's
        for kind, sender in ((Kind.OWN, rank), (Kind.SCATTER, 1)):
            for k, i in enumerate(slots):
                events.append((kind, sender, i, k == len(slots) - 1))
        pending = list(events)
        beat = None
        while n_out < len(slots) * beats:
            if beat is None and pending:
                kind, sender, i, last = pending[0]
                ctx.set(dut.ev.valid, 1)
                ctx.set(dut.ev.payload, {"kind": kind, "op_id": 0, "op_len": n,
                                         "sender": sender, "pkt_index": i, "last": last,
                                         "t_c": p.t_b_us})  # fmt: skip
            else:
                ctx.set(dut.ev.valid, 0)
            if beat is not None:
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, [int(v) for v in rng.integers(-99, 99, p.lanes)])
            else:
                ctx.set(dut.i.valid, 0)
            took_ev = beat is None and pending and ctx.get(dut.ev.ready)
            took_i = beat is not None and ctx.get(dut.i.ready)
            if ctx.get(dut.end_valid) and end_cycle is None:
                end_cycle = cycle
            if ctx.get(dut.o.valid):
                first_out = cycle if first_out is None else first_out
                n_out += 1
            await ctx.tick()
            cycle += 1
            if took_ev:
                kind = pending.pop(0)[0]
                beat = 0 if kind in (Kind.OWN, Kind.SCATTER) else None
            elif took_i:
                first_beat = cycle - 1 if first_beat is None else first_beat
                last_beat = cycle - 1
                beat += 1
                if beat == beats:
                    beat = None
        elements = 2 * len(slots) * p.p
        res["cycles_per_element"] = (last_beat - first_beat + 1) / elements
        res["latency_cycles"] = first_out - end_cycle
        res["readout_cycles_per_element"] = (cycle - first_out) / (len(slots) * p.p)

    simulate(dut, bench)
    return res


def area_component() -> tuple[Aggregator, str]:
    return Aggregator(NicParams()), "aggregator"
