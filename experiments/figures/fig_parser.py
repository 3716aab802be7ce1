"""Figures of the packet parser (hw/parser.py): rate, latency and ECP5 area at the default size."""

from __future__ import annotations

import numpy as np
from amaranth.lib import wiring

from optireduce import ubt
from optireduce.hw.parser import Parser
from optireduce.params import NicParams
from optireduce.sim.stream_sim import run_stream

RANK, WORLD = 0, 4


def _frames(p: NicParams, n: int) -> list[bytes]:
    """n valid scatter frames to RANK (1 KiB payloads at the default P)."""
    rng = np.random.default_rng(0)
    out = []
    for j in range(n):
        h = ubt.UbtHeader(
            version=1, msg_type=ubt.MSG_SCATTER, flags=0, exponent=-20, job_id=p.job_id,
            sender=1 + j % (WORLD - 1), op_id=0, pkt_index=WORLD * j % p.packets_for(p.c),
            count=p.p, contributors=0, t_c_us=1000, op_len=p.c, world=WORLD, reserved=0,
        )  # fmt: skip
        vals = rng.integers(-(2**31), 2**31, p.p)
        out.append(ubt.build_frame(h, ubt.payload_bytes(vals), src=h.sender, dst=RANK,
                                   port=p.udp_port))  # fmt: skip
    return out


def _beats(frame: bytes, nbytes: int) -> list[dict]:
    out = []
    for off in range(0, len(frame), nbytes):
        chunk = list(frame[off : off + nbytes])
        out.append({"data": chunk + [0] * (nbytes - len(chunk)), "keep": (1 << len(chunk)) - 1,
                    "last": int(off + nbytes >= len(frame))})  # fmt: skip
    return out


def figures(p: NicParams | None = None, n_frames: int = 4) -> dict:
    """Back-to-back valid frames, no backpressure: output rate and first-beat latency."""
    p = p or NicParams()
    dut = Parser(p)
    beats = [b for f in _frames(p, n_frames) for b in _beats(f, dut.nbytes)]

    async def setup(ctx) -> None:
        ctx.set(dut.rank, RANK)
        ctx.set(dut.world, WORLD)
        ctx.set(dut.base, 0)
        ctx.set(dut.mac, int.from_bytes(ubt.DEFAULT_ADDRESSING.mac(RANK), "big"))
        ctx.set(dut.ip, int.from_bytes(ubt.DEFAULT_ADDRESSING.ip(RANK), "big"))

    run = run_stream(dut, beats, n_frames * dut.n_words, setup=setup)
    return {
        "cycles_per_element": run.cycles_per_beat() / p.lanes,
        "latency_cycles": run.latency,
        "latency_const": dut.LATENCY,
        "verdict_latency_cycles": dut.verdict_latency,
    }


def area_component() -> tuple[wiring.Component, str]:
    return Parser(NicParams()), "parser"
