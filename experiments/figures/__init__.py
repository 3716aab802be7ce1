"""Per-block figures of the gateware (rate, latency, area), measured in simulation."""
