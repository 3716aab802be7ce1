"""An elaborate split into named sections, in the order the data flows."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from amaranth import Module


def elaborate_sections(*sections: Callable[[Module, SimpleNamespace], None],
                       platform=None) -> Module:  # fmt: skip
    """One Module built by `sections` in turn: each section(m, s) adds its part and leaves
    in the namespace `s` the signals a later section uses (and `s.platform`)."""
    m, s = Module(), SimpleNamespace(platform=platform)
    for section in sections:
        section(m, s)
    return m
