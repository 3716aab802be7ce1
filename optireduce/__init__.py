"""optireduce: SmartNIC offload of OptiReduce, the tail-optimal AllReduce.

Subpackages: optireduce.hw (gateware), optireduce.sim (co-simulation),
optireduce.host (software model, transport, driver).
"""

from optireduce.params import NicParams, ParamError

__version__ = "0.1.0"
__all__ = [
    "NicParams",
    "OptiReduceState",
    "ParamError",
    "__version__",
    "optireduce_hook",
    "simulate_allreduce",
]


def __getattr__(name: str) -> object:
    # Lazy: importing the package must not JIT-compile the model or import torch.
    if name == "simulate_allreduce":
        from optireduce.host.model.virtual_cluster import simulate_allreduce

        return simulate_allreduce
    if name in ("OptiReduceState", "optireduce_hook"):
        from optireduce.host import ddp_hook

        return getattr(ddp_hook, name)
    raise AttributeError(f"module 'optireduce' has no attribute {name!r}")
