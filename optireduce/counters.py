"""The NIC's counters by name: one list for model, engine, CSRs and host."""

from __future__ import annotations

from optireduce import ubt

COUNTERS = (
    *ubt.DROP_REASONS,
    "rx_scatter", "rx_gather", "tx_scatter", "tx_gather", "ops_started", "ops_completed",
)  # fmt: skip
