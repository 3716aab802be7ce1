"""Co-simulation: Verilog generation, Verilator builds, cocotb benches, replay."""
