"""A model of litedram's native port for the Amaranth simulator: the SDRAM-backed blocks'
ordering tests stall it on purpose, which the real controller under Verilator does only
when it must."""

from __future__ import annotations


class PortModel:
    """litedram's native port as its user sees it: commands executed in order, one
        per cycle, LATENCY cycles after they were taken; a write takes its word in the cycle it
        executes (raising wdata_ready, whatever wdata_valid says); a read's word comes CL cycles
        later. Commands are refused until cycle `open_at`, and with `refresh` = (every, cycles)
    for that many cycles in every `every`, as a refresh holds litedram's commands."""

    LATENCY, CL = 3, 2

    def __init__(
        self,
        mem,
        open_at: int,
        refresh: tuple[int, int] | None = None,
        latency: int | None = None,
        cl: int | None = None,
    ) -> None:
        """`mem`: the user's port (its `native_port` members); `latency`, `cl`: the class's
        unless given."""
        self.d, self.open_at, self.refresh = mem, open_at, refresh
        self.LATENCY = latency or self.LATENCY
        self.CL = cl or self.CL
        self.mem: dict[int, int] = {}
        self.underruns = 0

    async def run(self, ctx) -> None:
        d, queue, words = self.d, [], []
        self.cycle = cycle = 0
        ctx.set(d.ready, 1)
        while True:
            every, cycles = self.refresh or (1, 0)
            open_ = cycle >= self.open_at and cycle % every >= cycles
            ctx.set(d.cmd_ready, int(open_))
            if ctx.get(d.cmd_valid) and open_:
                queue.append((cycle + self.LATENCY, ctx.get(d.cmd_we), ctx.get(d.cmd_addr)))
            wready = 0
            if queue and queue[0][0] <= cycle:
                _, we, addr = queue.pop(0)
                if we:
                    wready = 1
                    self.underruns += not ctx.get(d.wdata_valid)
                    self.mem[addr] = ctx.get(d.wdata_data)
                else:
                    words.append((cycle + self.CL, self.mem.get(addr, 0xDEAD_BEEF)))
            ctx.set(d.wdata_ready, wready)
            due = words and words[0][0] <= cycle
            ctx.set(d.rdata_valid, int(bool(due)))
            if due:
                ctx.set(d.rdata_data, words.pop(0)[1])
            await ctx.tick()
            self.cycle = cycle = cycle + 1
