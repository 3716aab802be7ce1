"""Input-combinational logic only when an input changed: a patch of Verilator's C++.

Verilator (5.048 here) runs the model's 'ico' region, all the logic combinationally
downstream of a top-level input, on every eval(), changed inputs or not. The NIC's stream
ready signals ripple back through every pipeline, so that region is most of the core: a
harness cycle is two evals (inputs, then the rising edge), and the second one redid the
first's 'ico' work with the same inputs, about a fifth of the run time.

The patch makes the region's first trigger ask whether an input it reads differs from its
value at the last evaluation (the same check upstream Verilator added after this version,
verilator/verilator#7784). It is sound for these models: logic driven by an input and by
state is replicated into the 'nba' region, which re-runs it after every clock edge, and no
model writes its own inputs. An input no 'ico' logic reads (a clock) is not compared. The
previous values are the file's statics: one model per process, as every harness has.
"""

from __future__ import annotations

import re
from pathlib import Path

_INPUT = re.compile(r"^\s*VL_IN(8|16|64|W)?\((\w+),\d+,\d+(?:,\d+)?\);", re.MULTILINE)
_FIRST = "(IData)(vlSelfRef.__VicoFirstIteration)"


class PatchError(RuntimeError):
    """The generated code is not what the patch expects (another Verilator version)."""


def _ico_bodies(sources: list[str], prefix: str) -> str:
    head = re.compile(rf"^void {prefix}___024root___ico_sequent__\w+\([^;]*\{{$", re.MULTILINE)
    out = []
    for text in sources:
        for m in head.finditer(text):
            end = text.find("\n}\n", m.end())
            out.append(text[m.end() : end])
    return "\n".join(out)


def gate_ico(mdir: Path, prefix: str) -> list[str]:
    """Patch the Verilated model `prefix` in `mdir`; returns the inputs compared."""
    header = (mdir / f"{prefix}___024root.h").read_text()
    files = sorted(mdir.glob(f"{prefix}___024root__*.cpp"))
    texts = [f.read_text() for f in files]
    bodies = _ico_bodies(texts, prefix)
    inputs = [(m.group(2), m.group(1) == "W") for m in _INPUT.finditer(header)]
    read = [(n, wide) for n, wide in inputs if re.search(rf"\bvlSelfRef\.{n}\b", bodies)]
    if not inputs or not bodies:
        raise PatchError(f"{prefix}: no inputs or no ico logic found in {mdir}")
    trigger = f"void {prefix}___024root___eval_triggers_vec__ico({prefix}___024root* vlSelf) {{"
    hits = [i for i, t in enumerate(texts) if trigger in t]
    if len(hits) != 1 or texts[hits[0]].count(_FIRST) != 1:
        raise PatchError(f"{prefix}: the ico trigger is not where Verilator 5.048 puts it")
    k = hits[0]
    prev, compare = [], []
    for n, wide in read:
        prev.append(f"static decltype({prefix}___024root::{n}) optireduce_prev_{n};")
        differs = (f"std::memcmp(&s.{n}, &optireduce_prev_{n}, sizeof(s.{n})) != 0" if wide
                   else f"s.{n} != optireduce_prev_{n}")  # fmt: skip
        compare.append(f"    if ({differs}) {{ changed = true; optireduce_prev_{n} = s.{n}; }}")
    helper = "\n".join([
        "#include <cstring>",
        "// optireduce: the ico region only when an input it reads changed (sim/ico_gate.py)",
        "static bool optireduce_ico_first = true;",
        *prev,
        f"static bool optireduce_inputs_changed({prefix}___024root& s) {{",
        "    bool changed = optireduce_ico_first;",
        "    optireduce_ico_first = false;",
        *compare,
        "    return changed;",
        "}",
        "",
    ])  # fmt: skip
    gated = "(IData)(vlSelfRef.__VicoFirstIteration && optireduce_inputs_changed(vlSelfRef))"
    text = texts[k].replace(trigger, helper + trigger).replace(_FIRST, gated)
    files[k].write_text(text)
    return [n for n, _ in read]
