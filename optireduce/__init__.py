"""optireduce: SmartNIC offload of OptiReduce, the tail-optimal AllReduce.

Subpackages: optireduce.hw (gateware), optireduce.sim (co-simulation),
optireduce.host (software model, transport, driver).
"""

from optireduce.params import NicParams, ParamError

__version__ = "0.1.0"
__all__ = ["NicParams", "ParamError", "__version__", "simulate_allreduce"]


def __getattr__(name: str) -> object:
    # Lazy: importing the package must not JIT-compile the model.
    if name == "simulate_allreduce":
        from optireduce.host.virtual_cluster import simulate_allreduce

        return simulate_allreduce
    raise AttributeError(f"module 'optireduce' has no attribute {name!r}")
