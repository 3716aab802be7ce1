"""The STATS words the core keeps per op context until the op's record is out.

The words come in groups, each written at one moment of an op: the encoder's counts
when its chunk is in, phase 1's end, phase 2's end, both t_C a few cycles after that.
They live in one memory: per context a few rows of ROW_BITS bits, a group's words packed
into as few rows as they fit (first fit, widest first). A group's write takes
its values into the group's holding rows (flip-flops with an enable: no logic) and
marks the group pending; a writer copies the pending groups' rows into the memory, one
row a cycle, the group listed first first. A bit per (group, context), cleared when the
context takes a new op and set by the group's write, stands in for zeroing the words: a
group not written yet reads 0.

Before, the words were registers per context (K = 1) or a LUT RAM per group, read
through a select by the drain's word and one by context: with their producers, 690 LUTs
of the 25F (measured by tying them off). Now the context and the row are the memory's
address, and the drain's select is over the few places a word can sit in a row.

Contract (the core keeps it; `overrun` says when it was not, sticky):
- a group is written again only after its last write has reached the memory. The writer
  needs at most `rows` cycles for every group at once (8 on the 25F); the core writes a
  group at most once per phase end of an owner, which settles for longer than that.
- `busy` while any group is pending: a read sees the memory, so the drain reads once
  `busy` is low.
- a read: `read(m, slot, row)` addresses row `row` of context `slot` and gives every
  word of that row from the memory's output in the same cycle (an asynchronous read
  port), and whether its group was written since the clear.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib.memory import Memory

ROW_BITS = 36  # a DP16KD's widest port, if the memory is ever deep enough for block RAM


class OpRecords:
    """`groups`: group -> {word name: bits}, in the writer's priority order. Call `clear`,
    `write` (inside the caller's conditions) and `read` while elaborating module `m`."""

    def __init__(self, m: Module, n_ctx: int, groups: dict[str, dict[str, int]]) -> None:
        names = [name for words in groups.values() for name in words]
        assert len(set(names)) == len(names), "a word belongs to one group"
        self._groups = groups
        self.place: dict[str, tuple[int, int, int]] = {}  # name -> (row, offset, bits)
        self._rows: dict[str, list[list[str]]] = {}  # group -> its rows' names
        self._first: dict[str, int] = {}  # group -> its first row
        row = 0
        for g, words in groups.items():
            # first fit, widest word first: the 25F's records take 8 rows a context, not
            # 9 (16 words of LUT RAM, not 32)
            rows: list[list[str]] = []
            used: list[int] = []
            for name, bits in sorted(words.items(), key=lambda w: -w[1]):
                assert bits <= ROW_BITS, f"{name}: {bits} bits, a row has {ROW_BITS}"
                r = next((j for j, u in enumerate(used) if u + bits <= ROW_BITS), len(rows))
                if r == len(rows):
                    rows.append([])
                    used.append(0)
                rows[r].append(name)
                self.place[name] = (row + r, used[r], bits)
                used[r] += bits
            self._rows[g], self._first[g] = rows, row
            row += len(rows)
        self.rows = row  # rows per context
        self._row_bits = max(1, (row - 1).bit_length())
        mem = Memory(shape=ROW_BITS, depth=n_ctx << self._row_bits, init=[])
        m.submodules.records = mem
        self._wr, self._rd = mem.write_port(), mem.read_port(domain="comb")

        self.busy = Signal(name="rec_busy")
        self.overrun = Signal(name="rec_overrun")
        self._valid = {g: Signal(n_ctx, name=f"rec_{g}_valid") for g in groups}
        self._hold = {g: [Signal(ROW_BITS, name=f"rec_{g}_hold{k}") for k in range(len(r))]
                      for g, r in self._rows.items()}  # fmt: skip
        self._pend = {g: Signal(name=f"rec_{g}_pend") for g in groups}
        self._slot = {g: Signal(range(n_ctx), name=f"rec_{g}_slot") for g in groups}
        self._at = {g: Signal(range(len(r)), name=f"rec_{g}_at") for g, r in self._rows.items()}
        self._last = {}  # the group's last row goes to the memory this cycle
        m.d.comb += self.busy.eq(Cat(*self._pend.values()).any())
        self._writer(m)

    def _row(self, row) -> Value:
        """`row` as the address's row field (exactly `_row_bits` wide)."""
        return Cat(row, Const(0, self._row_bits))[: self._row_bits]

    def _writer(self, m: Module) -> None:
        """The first pending group's next row into the memory, one row a cycle."""
        wr = self._wr
        for j, g in enumerate(self._groups):
            at, n_rows = self._at[g], len(self._rows[g])
            self._last[g] = Signal(name=f"rec_{g}_last")
            with (m.Elif if j else m.If)(self._pend[g]):
                row = Array(self._hold[g])[at] if n_rows > 1 else self._hold[g][0]
                m.d.comb += [
                    wr.en.eq(1),
                    wr.addr.eq(Cat(self._row(at + self._first[g]), self._slot[g])),
                    wr.data.eq(row),
                    self._last[g].eq(at == n_rows - 1),
                ]
                m.d.sync += at.eq(Mux(self._last[g], 0, at + 1))
                with m.If(self._last[g]):
                    m.d.sync += self._pend[g].eq(0)

    def clear(self, m: Module, slot) -> None:
        """Every group of context `slot` reads 0 from the next cycle."""
        for g in self._groups:
            m.d.sync += self._valid[g].bit_select(slot, 1).eq(0)

    def write(self, m: Module, group: str, slot, values: dict) -> None:
        """Group `group` of context `slot` holds `values` (every word of it), in the memory
        within `rows` cycles and read as written from the next cycle (`busy` until then)."""
        assert set(values) == set(self._groups[group]), f"{group}: write every word of it"
        for hold, names in zip(self._hold[group], self._rows[group], strict=True):
            bits = [Const(0, 0)]
            for name in names:
                bits.append(values[name][: self.place[name][2]])
            m.d.sync += hold.eq(Cat(*bits))
        with m.If(self._pend[group] & ~self._last[group]):
            m.d.sync += self.overrun.eq(1)
        m.d.sync += [
            self._pend[group].eq(1),
            self._at[group].eq(0),
            self._slot[group].eq(slot),
            self._valid[group].bit_select(slot, 1).eq(1),
        ]

    def read(self, m: Module, slot, row) -> tuple[dict, dict]:
        """Every word of row `row` of context `slot`, by name (a word of another row reads
        whatever sits at its place), and whether its group was written since the clear
        of the context (the word means 0 if not). The caller gates the one word it
        selects."""
        m.d.comb += self._rd.addr.eq(Cat(self._row(row), slot))
        words, written = {}, {}
        for g, names in self._groups.items():
            ok = self._valid[g].bit_select(slot, 1)
            for name in names:
                _, off, bits = self.place[name]
                words[name], written[name] = self._rd.data[off : off + bits], ok
        return words, written
