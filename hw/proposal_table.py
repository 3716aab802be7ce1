"""In-band exponent agreement: the proposals heard for each coming op, and a START's lookup.

Model: `host/model/nic_model.py: NicModel` with `NicParams.exp_inband`: `_note_proposal`
(a peer frame of op j that passed the parser's checks, or was dropped as stale_op, proposes
for op j + lead; the first value heard from a sender counts; only ops not started yet),
`inband_exponent` (the max of what was heard, own included; no value if some rank sent
"no proposal" or this rank gave none; the live peers not heard), and `start_op`'s record
keeping (the started op's records go, its own proposal for op + lead is kept).

Storage: one entry per target op, in entry `target mod size`, size the smallest power of
two >= 2K + lead. A target is always in (last started, last started + 2K + lead] (the
parser's window bounds the frames' op ids, a START clears its own entry), so no two live
targets share an entry. An entry: a heard bitmap and a no-proposal bitmap over ranks, and
the max of the values heard (-128 when none), updated only for a sender not heard yet.

Ports:
  rank, world           configuration
  next_op               the op the host starts next: proposals for older ops are ignored
  note, note_op, note_sender, note_word   the parser's note (hw/parser.py)
  start, start_op, start_word   a START taken: clear op start_op's entry, keep this rank's
                        proposal word for op start_op + lead (ubt.proposal_word)
  q_op                  the op to look up; one cycle later q_exp (the max), q_unknown
                        (no in-band value: `inband_exponent(...).exponent is None`) and
                        q_missing (peers not heard) hold the table as it was when q_op was
                        given, and `fresh` says no write landed since (else look again)
A note and a START in the same cycle: the START comes first (a note for the op it starts
is dropped, as one that arrives after it).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from optireduce import ubt
from optireduce.host.model.nic_model import NicModel
from optireduce.params import NicParams


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


class ProposalTable(wiring.Component):
    """The in-band proposals of the next 2K + lead ops (see the module docstring)."""

    MODEL = NicModel  # _note_proposal, inband_exponent, start_op's records
    LATENCY = 1  # q_op to q_*

    def __init__(self, p: NicParams) -> None:
        if not p.exp_inband:
            raise ValueError("ProposalTable: NicParams.exp_inband is off")
        self.p = p
        self.lead = p.exp_lead_eff
        self.size = 1 << _bits(p.rx_window + self.lead)
        super().__init__(
            {
                "rank": In(range(p.n_max)),
                "world": In(range(p.n_max + 1)),
                "next_op": In(32),
                "note": In(1),
                "note_op": In(32),
                "note_sender": In(16),
                "note_word": In(16),
                "start": In(1),
                "start_op": In(32),
                "start_word": In(16),
                "q_op": In(32),
                "q_exp": Out(signed(8)),
                "q_unknown": Out(1),
                "q_missing": Out(range(p.n_max)),
                "fresh": Out(1),
            }
        )

    def elaborate(self, platform) -> Module:
        m = Module()
        n, size, ib = self.p.n_max, self.size, _bits(self.size)
        heard = Array(Signal(n, name=f"heard{k}") for k in range(size))
        none = Array(Signal(n, name=f"none{k}") for k in range(size))
        mx = Array(Signal(signed(8), name=f"max{k}", init=-128) for k in range(size))

        def value(word):
            return word[8:16].as_signed()

        def present(word):
            return (word & ubt.PROPOSAL_PRESENT) != 0

        target = Signal(32)
        m.d.comb += target.eq(self.note_op + self.lead)
        s_bit, r_bit = Signal(n), Signal(n)
        m.d.comb += [s_bit.eq(Const(1, n) << self.note_sender[: _bits(n)]),
                     r_bit.eq(Const(1, n) << self.rank)]  # fmt: skip
        # a note for an op not started yet, from a sender not heard for it yet
        note_ok = Signal()
        m.d.comb += note_ok.eq(
            self.note & (target >= self.next_op) & ~(heard[target[:ib]] & s_bit).any()
        )
        own_slot = (self.start_op + self.lead)[:ib]
        for k in range(size):
            clr = self.start & (self.start_op[:ib] == k)
            own = self.start & (own_slot == k)
            nt = note_ok & (target[:ib] == k) & ~clr
            base = Mux(clr, -128, mx[k])
            with_own = Mux(own & present(self.start_word) & (value(self.start_word) > base),
                           value(self.start_word), base)  # fmt: skip
            with_note = Mux(nt & present(self.note_word) & (value(self.note_word) > with_own),
                            value(self.note_word), with_own)  # fmt: skip
            m.d.sync += [
                heard[k].eq(Mux(clr, 0, heard[k]) | Mux(own, r_bit, 0) | Mux(nt, s_bit, 0)),
                none[k].eq(
                    Mux(clr, 0, none[k])
                    | Mux(own & ~present(self.start_word), r_bit, 0)
                    | Mux(nt & ~present(self.note_word), s_bit, 0)
                ),
                mx[k].eq(with_note),
            ]

        # the lookup, registered
        live = Signal(n)  # ranks of the world
        m.d.comb += live.eq(Cat(Const(r, 8) < self.world for r in range(n)))
        q = self.q_op[:ib]
        not_heard = Signal(n)
        m.d.comb += not_heard.eq(~heard[q] & live & ~r_bit)
        m.d.sync += [
            self.q_exp.eq(mx[q]),
            self.q_unknown.eq((none[q] & live).any() | ~(heard[q] & r_bit).any()),
            self.q_missing.eq(sum(not_heard[r] for r in range(n))),
            self.fresh.eq(~(note_ok | self.start)),
        ]
        return m
