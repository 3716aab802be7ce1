"""Network impairment in software (these machines have no netem): delay, loss,
reordering and duplication, seeded, on any clock.

Delay: lognormal with a given median m and tail ratio r = P99/P50, i.e.
delay = m * exp(sigma * Z), Z ~ N(0, 1), sigma = ln(r) / z_0.99 (z_0.99 = 2.3263).
Lognormal is the usual fit of cloud RTT tails, has exactly one parameter for the
ratio and no negative delays. r = 1 is a constant delay.
Loss: each copy is dropped with probability `loss`. Duplication: with
probability `duplicate` a second copy is sent, with its own delay. Reordering:
with probability `reorder` a copy is held back one more median, behind the
packets sent after it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

Z99 = 2.3263478740408408  # standard normal quantile at 0.99


@dataclass(frozen=True)
class ImpairmentSpec:
    median_us: float = 0.0
    p99_ratio: float = 1.0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    extra_us: float = 0.0  # added to every copy's delay: a late link (a straggler's step)

    def __post_init__(self) -> None:
        if self.median_us < 0:
            raise ValueError(f"ImpairmentSpec.median_us={self.median_us}: must be >= 0")
        if self.extra_us < 0:
            raise ValueError(f"ImpairmentSpec.extra_us={self.extra_us}: must be >= 0")
        if self.p99_ratio < 1:
            raise ValueError(f"ImpairmentSpec.p99_ratio={self.p99_ratio}: must be >= 1")
        for name in ("loss", "duplicate", "reorder"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ValueError(f"ImpairmentSpec.{name}={v}: must be in [0, 1)")

    @property
    def sigma(self) -> float:
        return math.log(self.p99_ratio) / Z99

    def reliable(self) -> ImpairmentSpec:
        """The same path without loss or duplication (for warm-up and baselines)."""
        return dataclasses.replace(self, loss=0.0, duplicate=0.0)


class Impairment:
    """Draws the fate of each packet: the delays of the copies that arrive (none: lost)."""

    def __init__(self, spec: ImpairmentSpec, seed: int = 0) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.lost = 0
        self.duplicated = 0
        self.reordered = 0

    def delay_us(self) -> float:
        s = self.spec
        if s.median_us == 0:
            return s.extra_us
        d = s.median_us * math.exp(s.sigma * self.rng.standard_normal()) if s.sigma else s.median_us
        d += s.extra_us
        if s.reorder and self.rng.random() < s.reorder:
            self.reordered += 1
            d += s.median_us
        return d

    def fates(self) -> list[float]:
        """Delays (microseconds) of the copies of one packet that get through."""
        s = self.spec
        copies = 1
        if s.duplicate and self.rng.random() < s.duplicate:
            copies = 2
            self.duplicated += 1
        out = []
        for _ in range(copies):
            if s.loss and self.rng.random() < s.loss:
                self.lost += 1
                continue
            out.append(self.delay_us())
        return out
