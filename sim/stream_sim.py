"""Drive a block's input stream and drain its output stream in amaranth.sim.

The same harness serves the unit tests (random idle and backpressure) and the
throughput figures (none: cycles per element and latency are read off it).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from amaranth.sim import Simulator


@dataclass
class StreamRun:
    outputs: list = field(default_factory=list)  # output payloads, as given by `read`
    in_cycles: list[int] = field(default_factory=list)  # cycle each input beat was taken
    out_cycles: list[int] = field(default_factory=list)  # cycle each output beat left

    @property
    def latency(self) -> int:
        """Cycles from the first input beat taken to the first output beat."""
        return self.out_cycles[0] - self.in_cycles[0]

    def cycles_per_beat(self) -> float:
        """Steady-state output rate: cycles between first and last output beats."""
        n = len(self.out_cycles)
        return (self.out_cycles[-1] - self.out_cycles[0]) / max(1, n - 1)

    def element_figures(self, lanes: int) -> dict:
        """The figures of a stream block: output cycles per element, latency in cycles."""
        return {
            "cycles_per_element": self.cycles_per_beat() / lanes,
            "latency_cycles": self.latency,
        }


def element_payload(values: Sequence[int], first: bool, last: bool) -> dict:
    return {"data": [int(v) for v in values], "first": int(first), "last": int(last)}


def frame_payloads(values: Sequence[int], lanes: int, frame_beats: int | None = None) -> list:
    """`values` as beats of `lanes` elements, in frames of `frame_beats` beats (one frame
    if None): `first` and `last` mark each frame's ends."""
    n = len(values) // lanes
    fb = frame_beats or n
    return [
        element_payload(values[j * lanes : (j + 1) * lanes], j % fb == 0, j % fb == fb - 1)
        for j in range(n)
    ]


def read_element(payload) -> tuple[list[int], int, int]:
    return [int(v) for v in payload.data], int(payload.first), int(payload.last)


def set_ports(ctx, dut, **values: int) -> None:
    """Drive `dut`'s configuration ports, by name."""
    for name, value in values.items():
        ctx.set(getattr(dut, name), value)


def simulate(dut, bench: Callable, *background: Callable) -> None:
    """Run testbench `bench` on `dut` to its end (10 ns clock), `background` ones beside it."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    for b in background:
        sim.add_testbench(b, background=True)
    sim.run()


def run_stream(
    dut,
    payloads: Sequence,
    n_out: int,
    *,
    sink: str = "i",
    source: str = "o",
    read: Callable = read_element,
    idle: float = 0.0,
    backpressure: float = 0.0,
    seed: int = 0,
    setup: Callable | None = None,
    max_cycles: int | None = None,
) -> StreamRun:
    """Send `payloads` into dut.<sink>, collect `n_out` beats from dut.<source>.

    setup(ctx) runs once before the first beat (to set configuration ports).
    Raises TimeoutError if the outputs do not all arrive within max_cycles.
    """
    run = StreamRun()
    rng_in, rng_out = random.Random(seed), random.Random(seed + 1)
    limit = max_cycles or 64 * (len(payloads) + n_out) + 100_000
    s_port, o_port = getattr(dut, sink), getattr(dut, source)

    async def bench(ctx):
        # Both ends in one process, in lockstep: drive this cycle's valid/ready,
        # read the settled handshakes, then let the clock edge transfer them.
        if setup is not None:
            await setup(ctx)
        k = 0
        for cycle in range(limit):
            if len(run.outputs) >= n_out and k >= len(payloads):
                return
            offer = k < len(payloads) and not (idle and rng_in.random() < idle)
            ctx.set(s_port.valid, offer)
            if offer:
                ctx.set(s_port.payload, payloads[k])
            ready = not (backpressure and rng_out.random() < backpressure)
            ctx.set(o_port.ready, ready)
            if offer and ctx.get(s_port.ready):
                run.in_cycles.append(cycle)
                k += 1
            if ready and ctx.get(o_port.valid):
                run.outputs.append(read(ctx.get(o_port.payload)))
                run.out_cycles.append(cycle)
            await ctx.tick()
        raise TimeoutError(
            f"{k}/{len(payloads)} inputs taken, "
            f"{len(run.outputs)}/{n_out} outputs in {limit} cycles"
        )

    simulate(dut, bench)
    return run


@dataclass
class OpsRun:
    outputs: list = field(default_factory=list)  # (data, first, last) per output beat
    in_cycles: list[int] = field(default_factory=list)
    out_cycles: list[int] = field(default_factory=list)
    ports: dict = field(default_factory=dict)  # status ports read after the last beat


def run_ops(
    dut,
    ops: list[tuple[list[dict], dict]],
    n_out: int,
    *,
    idle: float = 0.0,
    backpressure: float = 0.0,
    seed: int = 0,
    scramble: dict[str, int] | None = None,
    read_ports: tuple[str, ...] = (),
    max_cycles: int = 200_000,
    keys: list[dict] | None = None,
    static: dict[str, int] | None = None,
    lead: int = 0,
) -> OpsRun:
    """Like run_stream, for several ops: each op is (payloads, {port: value}).

    The op's port values are driven only while its first beat is offered; at every other
    cycle the ports in `scramble` ({name: width}) carry random junk, so a block that does
    not latch them at `first` fails. Status ports are read once all outputs are out.
    `keys`: payloads of the block's `key` stream (one per op, given ahead, in order);
    `static`: ports held at one value throughout (configuration); `lead`: cycles before
    the first beat is offered (the keys' head start).
    """
    run = OpsRun()
    beats = [
        (pl, side if k == 0 else None) for pl_list, side in ops for k, pl in enumerate(pl_list)
    ]
    rng_in, rng_out, rng_junk = (
        random.Random(seed),
        random.Random(seed + 1),
        random.Random(seed + 2),
    )
    scramble = scramble or {}

    async def key_source(ctx):
        for key in keys or ():
            ctx.set(dut.key.payload, key)
            ctx.set(dut.key.valid, 1)
            await ctx.tick().until(dut.key.ready)
        ctx.set(dut.key.valid, 0)

    async def bench(ctx):
        for name, value in (static or {}).items():
            ctx.set(getattr(dut, name), value)
        k = 0
        for cycle in range(max_cycles):
            if len(run.outputs) >= n_out and k >= len(beats):
                break
            offer = k < len(beats) and cycle >= lead and not (idle and rng_in.random() < idle)
            ctx.set(dut.i.valid, offer)
            side = beats[k][1] if offer else None
            for name, width in scramble.items():
                value = side[name] if side is not None else rng_junk.getrandbits(width)
                ctx.set(getattr(dut, name), value)
            if offer:
                ctx.set(dut.i.payload, beats[k][0])
            ready = not (backpressure and rng_out.random() < backpressure)
            ctx.set(dut.o.ready, ready)
            if offer and ctx.get(dut.i.ready):
                run.in_cycles.append(cycle)
                k += 1
            if ready and ctx.get(dut.o.valid):
                p = ctx.get(dut.o.payload)
                run.outputs.append(([int(v) for v in p.data], int(p.first), int(p.last)))
                run.out_cycles.append(cycle)
            await ctx.tick()
        else:
            raise TimeoutError(f"{k}/{len(beats)} in, {len(run.outputs)}/{n_out} out")
        ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(2)
        run.ports = {name: ctx.get(getattr(dut, name)) for name in read_ports}

    simulate(dut, bench, *((key_source,) if keys else ()))
    return run


def run_registered_ready(
    dut,
    payloads: Sequence,
    n_out: int,
    *,
    read: Callable,
    seed: int = 0,
    offer: float = 0.7,
    take: float = 0.5,
    max_cycles: int = 10_000,
    on_cycle: Callable | None = None,
) -> tuple[list, int]:
    """Send `payloads` (each set whole on dut.i.payload) into dut.i while taking dut.o at
    random, and in every cycle toggle o.ready and check that i.ready does not move: it
    comes from a register, not from the consumer. `on_cycle(ctx, k, offered, ready,
    took)` may check more each cycle (k: the beat offered). Returns (the `n_out` output
    payloads read by `read`, cycles in which a beat was offered and refused)."""
    rng = random.Random(seed)
    got, stalls = [], 0

    async def bench(ctx):
        nonlocal stalls
        k = 0
        for _ in range(max_cycles):
            offered = k < len(payloads) and rng.random() < offer
            ctx.set(dut.i.valid, offered)
            if offered:
                ctx.set(dut.i.payload, payloads[k])
            ready = ctx.get(dut.i.ready)
            took = rng.random() < take
            for r in (0, 1, took):  # o.ready toggled inside the cycle
                ctx.set(dut.o.ready, int(r))
                assert ctx.get(dut.i.ready) == ready, "i.ready follows o.ready"
            if on_cycle is not None:
                on_cycle(ctx, k, offered, ready, took)
            if ctx.get(dut.o.valid) and took:
                got.append(read(ctx.get(dut.o.payload)))
            k += offered and ready
            stalls += offered and not ready
            await ctx.tick()
            if len(got) == n_out:
                return
        raise TimeoutError(f"{len(got)} of {n_out} outputs after {max_cycles} cycles")

    simulate(dut, bench)
    return got, stalls


async def send_bytes(ctx, port, frame: bytes, rng: random.Random | None = None,
                     gap: float = 0.0, domain: str = "sync") -> None:  # fmt: skip
    """One frame into a byte stream (frame_stream(1)), with idle cycles at random
    (probability `gap` before each byte)."""
    for k, b in enumerate(frame):
        while rng is not None and rng.random() < gap:
            await ctx.tick(domain)
        ctx.set(port.valid, 1)
        ctx.set(port.payload.data[0], b)
        ctx.set(port.payload.keep, 1)
        ctx.set(port.payload.last, k == len(frame) - 1)
        await ctx.tick(domain).until(port.ready)
        ctx.set(port.valid, 0)


SYNC_NS, CORE_NS = 8.0, 19.2  # the boards' 125 MHz and 52.08 MHz (docs/boards.md, "Clocks")


def two_clock_sim(dut, extra=None) -> Simulator:
    """A simulator of `dut` with a `sync` clock of 8 ns and a `core` clock of 19.2 ns, the
    two unrelated; `extra(top)` may add more to the top module (e.g. a bank in `core`)."""
    from amaranth import ClockDomain, Module

    top = Module()
    top.domains.sync = ClockDomain("sync")
    top.domains.core = ClockDomain("core")
    top.submodules.dut = dut
    if extra is not None:
        extra(top)
    sim = Simulator(top)
    sim.add_clock(SYNC_NS * 1e-9, domain="sync")
    sim.add_clock(CORE_NS * 1e-9, domain="core")
    return sim
