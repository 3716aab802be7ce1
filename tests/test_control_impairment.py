"""The control plane carries the same injected impairment as the data path: a delay given
to the hook's `impairment` makes every control exchange (exponents, loss decision,
replica checksum) wait for it too, as the experiments' tail requires."""

import threading
import time
from datetime import timedelta

import torch

from optireduce.host.control import ControlPlane
from optireduce.host.model.impairment import ImpairmentSpec

DELAY_US = 40_000  # a constant delay: p99_ratio 1


def _exchange(spec: ImpairmentSpec | None) -> tuple[list[list[int]], float]:
    store = torch.distributed.HashStore()
    store.set_timeout(timedelta(seconds=20))
    planes: list[ControlPlane | None] = [None, None]

    def build(r: int) -> None:
        planes[r] = ControlPlane(r, 2, store, timeout_s=10.0, impairment=spec, seed=r)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    got: list[list[int]] = [[], []]

    def run(r: int) -> None:
        got[r] = planes[r].max_ints([10 * r, 5 - r])

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    took = time.monotonic() - start
    for p in planes:
        p.close()
    return got, took


def test_control_exchange_waits_for_the_injected_delay():
    got, took = _exchange(ImpairmentSpec(median_us=DELAY_US, p99_ratio=1.0))
    assert got == [[10, 5], [10, 5]]  # the max of both ranks on each, delayed or not
    # each rank's message to the other left DELAY_US late: the exchange cannot end sooner
    assert took >= DELAY_US * 1e-6


def test_control_plane_without_impairment_sends_at_once():
    got, _ = _exchange(None)
    assert got == [[10, 5], [10, 5]]
