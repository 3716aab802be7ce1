"""Random mutations of a trace's network frames, for the RTL-vs-model equivalence suite.

Only network frames are mutated: the host port is the trusted side (a corrupted
START would be a host bug, not input the NIC must survive). Ticks stay in order:
a mutation changes what arrives and in which order, never makes time run back.
"""

from __future__ import annotations

import numpy as np

from optireduce import host_port
from optireduce.sim.trace import Frame

MUTATIONS = ("bit_flip", "truncate", "duplicate", "shuffle")


def mutate(frames: list[Frame], seed: int, rate: float = 0.1) -> list[Frame]:
    """A mutated copy of `frames`: each network frame is, with probability `rate`,
    bit-flipped (1 to 3 bits anywhere), truncated, or duplicated (a copy a few ticks
    later); then a few windows of network frames are shuffled in place (the frames
    move, the ticks stay)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, float, bytes]] = []
    for k, (t, f) in enumerate(frames):
        if host_port.is_host_frame(f) or rng.random() >= rate:
            out.append((t, k, f))
            continue
        kind = MUTATIONS[int(rng.integers(0, 3))]
        if kind == "bit_flip":
            b = bytearray(f)
            for pos in rng.integers(0, 8 * len(b), int(rng.integers(1, 4))):
                b[pos // 8] ^= 1 << (pos % 8)
            out.append((t, k, bytes(b)))
        elif kind == "truncate":
            out.append((t, k, f[: int(rng.integers(1, len(f)))]))
        else:
            out += [(t, k, f), (t + int(rng.integers(0, 30)), k + 0.5, f)]
    out.sort(key=lambda e: (e[0], e[1]))
    net = [i for i, (_, _, f) in enumerate(out) if not host_port.is_host_frame(f)]
    for _ in range(max(1, len(net) // 40)):
        if len(net) < 2:
            break
        lo = int(rng.integers(0, len(net) - 1))
        win = net[lo : lo + int(rng.integers(2, 8))]
        moved = [out[i][2] for i in win]
        rng.shuffle(moved)
        for i, f in zip(win, moved, strict=True):
            out[i] = (out[i][0], out[i][1], f)
    return [(t, f) for t, _, f in out]
