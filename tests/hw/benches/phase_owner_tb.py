"""What the cocotb benches of the two phase owners share (tb_aggregator, tb_gather_tracker):
the scenarios the pytest side wrote, the event word, the owner's configuration, the event
handshake, a monitor of phase ends, the wind-down and the checks of the ends, counters,
own t_C and T against the model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import cocotb
from cocotb.triggers import RisingEdge

from optireduce.sim.cocotb_run import bench_config

REASONS = {1: "complete", 2: "early", 3: "deadline"}
EVENT_BOUND_CYCLES = 100_000  # an SDRAM-backed owner's init takes about 21 000


def scenarios(dut) -> Iterator[tuple[int, dict, dict]]:
    """(k, scenario, config) for each scenario the pytest side wrote, logged as it starts."""
    cfg = bench_config()
    with open(cfg["scenarios"]) as f:
        scs = json.load(f)
    for k, sc in enumerate(scs):
        dut._log.info("scenario %s", sc["name"])
        yield k, sc, cfg


def configure(dut, sc: dict) -> None:
    """The owner's static configuration."""
    dut.rank.value = sc["rank"]
    dut.world.value = sc["world"]
    dut.t_b.value = sc["t_b"]
    dut.t_c_min.value = sc["t_c_min"]
    dut.t_c_init.value = sc["t_c_init"]
    dut.alpha_q8.value = sc["alpha_q8"]


async def send_event(dut, word: int, at: int) -> None:
    """Offer `word` on the event port until taken; the owner's clock then reads `at`."""
    dut.ev_payload.value = word
    dut.ev_valid.value = 1
    for _ in range(EVENT_BOUND_CYCLES):
        await RisingEdge(dut.clk)
        if int(dut.ev_ready.value):
            break
    else:
        raise AssertionError(f"the event waited {EVENT_BOUND_CYCLES} cycles")
    dut.ev_valid.value = 0
    assert int(dut.now.value) == at, (int(dut.now.value), at)


class EndMonitor:
    """Every cycle until stopped: the phase end strobed, if any (each op ends once), into
    `ends` (op -> [reason, tick, T, received, expected]) and `order`; then `also()`."""

    def __init__(self, dut, also: Callable[[], None]) -> None:
        self.dut, self.also = dut, also
        self.ends, self.order, self.running = {}, [], True
        self.task = cocotb.start_soon(self._run())

    async def _run(self) -> None:
        dut = self.dut
        while self.running:
            await RisingEdge(dut.clk)
            if int(dut.end_valid.value):
                op = int(dut.end_op.value)
                assert str(op) not in self.ends, f"op {op} ended twice"
                self.order.append(op)
                self.ends[str(op)] = [
                    REASONS[int(dut.end_reason.value)], int(dut.end_tick.value),
                    int(dut.end_timeout.value), int(dut.end_received.value),
                    int(dut.end_expected.value),
                ]  # fmt: skip
            self.also()

    async def wind_down(self, t_end: int, limit: int) -> None:
        """Up to `limit` cycles until the owner's clock reads t_end with the event port
        ready, 40 more in which nothing may come out; then stop."""
        dut = self.dut
        for _ in range(limit):
            await RisingEdge(dut.clk)
            if int(dut.now.value) == t_end and int(dut.ev_ready.value):
                break
        for _ in range(40):
            await RisingEdge(dut.clk)
        self.running = False
        await self.task

    def check(self, sc: dict, rx_name: str) -> None:
        """The ends, in the model's order, the counters (cnt_rx under the model's
        `rx_name`), own t_C and T: the model's."""
        dut = self.dut
        assert self.ends == sc["ends"], (self.ends, sc["ends"])
        assert self.order == sc["end_order"], (self.order, sc["end_order"])
        counters = {
            rx_name: int(dut.cnt_rx.value),
            "duplicate": int(dut.cnt_duplicate.value),
            "late": int(dut.cnt_late.value),
        }
        assert counters == sc["counters"], (counters, sc["counters"])
        assert int(dut.own_tc.value) == sc["own_tc"]
        assert int(dut.timeout.value) == sc["timeout"]
