"""cocotb benches, one per gateware block: tb_<block>.py."""
