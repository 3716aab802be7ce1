"""Peer progress at an owner: the sender of op j is done with every op <= j - K.

Model: `host/model/nic_model.py: NicModel._peer_progress`: a packet of op j from rank s
(scatter or gather) proves that s finished every op <= j - K (a NIC starts op j only
after op j - K is complete), so for each such op not yet over, `PhaseTracker.sender_gone`
marks s gone, once, at `now`: what s has not sent will never come.

Both phase owners (hw/aggregator.py, phase 1; hw/gather_tracker.py, phase 2) run this
scan after a peer's event. The owner says which of its contexts it applies to (`hit`, a
bit per context, registered: the context holds an op <= j - K, not ended, from which the
sender is expected and is not this rank); the scan then visits those contexts in index
order, reads the sender's entry of the owner's per-sender table (rcv, flagged, gone) and,
when it is not gone yet, writes it back gone and reports it (`gone`, on the context
`ctx`): the owner sets the context's last-gone tick to the event's tick and, when the
sender still owed that context packets (rcv < `owed`), takes one off its count of
senders still owing (`owing`). States, each registered (125 MHz): READ (address the
entry, or skip a context not hit in one cycle), REG (its data and `owed` registered),
WRITE (write back, report). A scan over n_ctx contexts with h hits takes
n_ctx + 1 + 2h cycles from `start` to `done`.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from optireduce.host.model.nic_model import NicModel


def peer_layout(rcv_shape) -> data.StructLayout:
    """One sender's entry in an owner's per-sender table of a context."""
    return data.StructLayout({"rcv": rcv_shape, "flagged": 1, "gone": 1})


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


class PeerProgress(wiring.Component):
    """The peers-gone scan of one event (see the module docstring).

    `start` (one cycle) begins a scan with `hit` and `sender` held until `done`. `rd_addr`
    is the table address (sender, context) to read, nonzero only in READ; `rd_data` the
    port's output a cycle later. `wr_en` asks the owner to write `wr_data` at `wr_addr`
    (it stages the write). `owed` is what the sender owes context `ctx`, sampled in REG
    (the cycle after the read of `ctx`). `gone` and `owing` are one-cycle reports on
    `ctx`; `done` is high in the scan's last cycle.
    """

    MODEL = NicModel  # _peer_progress

    def __init__(self, n_ctx: int, n_max: int, rcv_shape) -> None:
        self.n_ctx, self.n_max = n_ctx, n_max
        self.layout = peer_layout(rcv_shape)
        cb, sb = _bits(n_ctx), _bits(n_max)
        super().__init__(
            {
                "start": In(1),
                "hit": In(n_ctx),
                "sender": In(range(n_max)),
                "owed": In(rcv_shape),
                "ctx": Out(cb),
                "rd_addr": Out(cb + sb),
                "rd_data": In(self.layout),
                "wr_en": Out(1),
                "wr_addr": Out(cb + sb),
                "wr_data": Out(self.layout),
                "gone": Out(1),
                "owing": Out(1),
                "done": Out(1),
            }
        )

    def elaborate(self, platform):
        m = Module()
        n_ctx, sb = self.n_ctx, _bits(self.n_max)
        count = Signal(range(n_ctx + 1))  # the context visited; n_ctx: the scan is over
        gk = count[: len(self.ctx)]
        entry = Cat(self.sender[:sb], gk)
        old = Signal(self.layout)  # the entry, registered before any logic (125 MHz)
        owed = Signal.like(self.owed)
        m.d.comb += self.ctx.eq(gk)
        with m.FSM():
            with m.State("IDLE"), m.If(self.start):
                m.d.sync += count.eq(0)
                m.next = "READ"
            with m.State("READ"):
                m.d.comb += self.rd_addr.eq(entry)
                with m.If(count == n_ctx):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
                with m.Elif(self.hit.bit_select(gk, 1)):
                    m.next = "REG"
                with m.Else():
                    m.d.sync += count.eq(count + 1)
            with m.State("REG"):
                m.d.sync += [old.eq(self.rd_data), owed.eq(self.owed)]
                m.next = "WRITE"
            with m.State("WRITE"):
                with m.If(~old.gone):
                    m.d.comb += [
                        self.wr_en.eq(1),
                        self.wr_addr.eq(entry),
                        self.wr_data.rcv.eq(old.rcv),
                        self.wr_data.flagged.eq(old.flagged),
                        self.wr_data.gone.eq(1),
                        self.gone.eq(1),
                        self.owing.eq(old.rcv < owed),
                    ]
                m.d.sync += count.eq(count + 1)
                m.next = "READ"
        return m

    def serve(self, m: Module, rd, wr, contexts, now) -> None:
        """The owner's side, in the owner's module inside its scan state: the table's read
        port `rd` and staged write `wr` (hw/staged_write.py), and the reports onto its
        contexts (hw/deadline.py PhaseContexts: last_gone, owing) at the event's `now`."""
        m.d.comb += [rd.addr.eq(self.rd_addr), self.rd_data.eq(rd.data)]
        with m.If(self.wr_en):
            m.d.sync += [wr.addr.eq(self.wr_addr), wr.en.eq(1), wr.data.eq(self.wr_data)]
        k = self.ctx
        with m.If(self.gone):
            m.d.sync += contexts.last_gone[k].eq(now)
        with m.If(self.owing):
            m.d.sync += contexts.owing[k].eq(contexts.owing[k] - 1)
