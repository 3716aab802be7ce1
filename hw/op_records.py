"""The STATS words the core keeps per op context until the op's record is out.

The words come in groups, each written at one moment of an op: the encoder's counts
when its chunk is in, phase 1's end, phase 2's end, both t_C a few cycles after that.
Each group is a small memory (n_ctx entries, LUT RAM) with its one write port and an
asynchronous read port at the drain's slot. A bit per (group, context), cleared when
the context takes a new op and set by the group's write, stands in for zeroing the
words: a group not written yet reads 0. Registers and their 4-way read mux cost about
1 600 flip-flops and 1 500 LUTs here, and the drain's slot fanned out to 1 700 LUT
inputs (docs/gateware.md, "The core's wiring").

Timing is that of registers: a write in cycle t (the port's enable under the caller's
conditions) reads back from t + 1; of a clear and a write of the same context in one
cycle, the one the elaboration states last wins, as for `m.d.sync` statements.
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import data
from amaranth.lib.memory import Memory


class OpRecords:
    """`groups`: group -> {word name: bits}. Call `clear`, `write` (inside the caller's
    conditions) and `read` while elaborating module `m`."""

    def __init__(self, m: Module, n_ctx: int, groups: dict[str, dict[str, int]]) -> None:
        names = [name for words in groups.values() for name in words]
        assert len(set(names)) == len(names), "a word belongs to one group"
        self._groups = groups
        self._wr, self._rd, self._valid = {}, {}, {}
        for g, words in groups.items():
            lay = data.StructLayout({name: unsigned(bits) for name, bits in words.items()})
            # two contexts (K = 1) fit flip-flops better than 16-deep LUT RAM
            attrs = {"ram_style": "logic"} if n_ctx <= 2 else {}
            mem = Memory(shape=lay, depth=n_ctx, init=[], attrs=attrs)
            m.submodules[f"rec_{g}"] = mem
            self._wr[g] = mem.write_port()
            self._rd[g] = mem.read_port(domain="comb")
            self._valid[g] = Signal(n_ctx, name=f"rec_{g}_valid")

    def clear(self, m: Module, slot) -> None:
        """Every group of context `slot` reads 0 from the next cycle."""
        for g in self._groups:
            m.d.sync += self._valid[g].bit_select(slot, 1).eq(0)

    def write(self, m: Module, group: str, slot, values: dict) -> None:
        """Group `group` of context `slot` holds `values` (every word of it) from the next
        cycle."""
        assert set(values) == set(self._groups[group]), f"{group}: write every word of it"
        wr = self._wr[group]
        m.d.comb += [wr.en.eq(1), wr.addr.eq(slot)]
        m.d.comb += [getattr(wr.data, name).eq(v) for name, v in values.items()]
        m.d.sync += self._valid[group].bit_select(slot, 1).eq(1)

    def read(self, m: Module, slot) -> tuple[dict, dict]:
        """Every word of context `slot`, by name, and whether its group was written since
        the clear (the word means 0 if not). The caller gates the one word it selects: a
        gate on each word's bits was 300 LUTs of the 25F core."""
        words, written = {}, {}
        for g, names in self._groups.items():
            rd = self._rd[g]
            m.d.comb += rd.addr.eq(slot)
            ok = self._valid[g].bit_select(slot, 1)
            for name in names:
                words[name], written[name] = getattr(rd.data, name), ok
        return words, written
