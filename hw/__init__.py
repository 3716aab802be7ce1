"""Gateware of the OptiReduce NIC (Amaranth): one block per file, each with its model and tests."""
