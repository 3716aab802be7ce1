"""Throughput, latency and area of the phase-2 gather tracker (hw/gather_tracker.py).

The tracker is an event block, not a stream block (no `i`/`o` element streams), so
`run_stream` cannot feed it; this bench drives its event port with its own
amaranth.sim testbench, with no idle, at the default NicParams (world 2):

  cycles_per_event   cycles per GATHER event, back to back, in an op whose context is
                     made (the first event, which claims and clears it, is not counted)
  cycles_per_element the same per payload element (P elements per event): the payload
                     streams into the gather buffer meanwhile
  latency_cycles     from taking a GATHER event (ev handshake) to its verdict strobe
  claim_cycles       the first event of an op: claim, clear, divide, verdict
"""

from __future__ import annotations

from optireduce.hw.gather_tracker import GatherTracker, Kind
from optireduce.params import NicParams
from optireduce.sim.stream_sim import set_ports, simulate


def figures(p: NicParams | None = None) -> dict:
    p = p or NicParams()
    dut = GatherTracker(p)
    world, rank, n = 2, 0, p.c
    idx = list(range(1, p.packets_for(n), world))  # rank 1 owns the odd slots
    res = {}

    async def bench(ctx):
        set_ports(ctx, dut, rank=rank, world=world, t_b=p.t_b_us, alpha_q8=p.alpha_q8)
        cycle = 0
        takes, verdicts = [], []
        k = 0
        while len(verdicts) < len(idx):
            if k < len(idx):
                ctx.set(dut.ev.valid, 1)
                ctx.set(dut.ev.payload, {"kind": Kind.GATHER, "op_id": 0, "op_len": n,
                                         "sender": 1, "pkt_index": idx[k], "last": 0,
                                         "t_c": p.t_b_us, "at": 0, "p1_start": 0,
                                         "t1": 0})  # fmt: skip
            else:
                ctx.set(dut.ev.valid, 0)
            took = k < len(idx) and ctx.get(dut.ev.ready)
            if ctx.get(dut.verdict_valid):
                verdicts.append(cycle)
            await ctx.tick()
            if took:
                takes.append(cycle)
                k += 1
            cycle += 1
        lat = [v - t for t, v in zip(takes, verdicts, strict=True)]
        span = takes[-1] - takes[1]
        res["cycles_per_event"] = span / (len(takes) - 2)
        res["cycles_per_element"] = res["cycles_per_event"] / p.p
        res["latency_cycles"] = lat[-1]
        res["claim_cycles"] = lat[0]

    simulate(dut, bench)
    return res


def area_component() -> tuple[GatherTracker, str]:
    return GatherTracker(NicParams()), "gather_tracker"
