"""Verilog from Amaranth components: deterministic text, cached by content."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from amaranth.back import verilog
from amaranth.lib import wiring

REPO = Path(__file__).resolve().parents[1]
BUILD = Path.cwd() / "build" if not (REPO / "pyproject.toml").exists() else REPO / "build"


_MODULE = re.compile(r"^(module [^(]+\()(.*)(\);)$", re.MULTILINE)


def _sorted_ports(m: re.Match) -> str:
    # escaped identifiers keep the space that ends them
    ports = sorted(t.lstrip() for t in m.group(2).split(","))
    return m.group(1) + ", ".join(ports) + m.group(3)


class SynthesisPlatform:
    """What a block is elaborated for when its Verilog is for synthesis (kind "synth"), not
    simulation: hw/block_ram.py then leaves out the check it builds for simulators, as a
    board's platform does."""


def convert(component: wiring.Component, name: str, platform=None) -> str:
    """The Verilog text, the same in every process: Amaranth orders the ports of a design
    with several clock domains by string hashes, which differ from process to process, so
    each module's port list is sorted (every instance connects its ports by name)."""
    text = verilog.convert(component, name=name, platform=platform, emit_src=False)
    return _MODULE.sub(_sorted_ports, text)


def write(component: wiring.Component, name: str, kind: str = "rtl") -> Path:
    """Write `name`.v under build/<kind>/<name>-<hash of the text>/ and return its path
    (kind "synth": elaborated for SynthesisPlatform)."""
    text = convert(component, name, SynthesisPlatform() if kind == "synth" else None)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    d = BUILD / kind / f"{name}-{digest}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.v"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # workers may write the same design
        tmp.write_text(text)
        tmp.replace(path)
    return path
