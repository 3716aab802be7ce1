"""Gateware of the OptiReduce NIC (Amaranth); blocks arrive with the gateware issue."""
