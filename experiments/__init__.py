"""Experiments, figures and benchmarks. Only the command line imports them."""
