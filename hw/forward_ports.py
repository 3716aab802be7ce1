"""Forwarding a sub-component's ports through its parent, by name."""

from __future__ import annotations

from collections.abc import Iterable

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In


def forward_ports(m: Module, outer, inner: wiring.Component, names: Iterable[str]) -> None:
    """Connect each port `name` of `inner` with `outer`'s port of the same name: the
    outer port drives an inner input, an inner output drives the outer port."""
    for name in names:
        i, o = getattr(inner, name), getattr(outer, name)
        m.d.comb += i.eq(o) if inner.signature.members[name].flow == In else o.eq(i)
