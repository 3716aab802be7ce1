"""Modules that load on first use: the model's numba kernels.

The gateware imports the model's functions as its reference (each block's MODEL); importing
the gateware must not load numba, so the kernels' modules load on the first attribute access.
The stand-in is not importlib's LazyLoader, which lets a second thread see the module half
executed on Python 3.11 (ranks run as threads in the tests): the first access imports the
real module through the import system, whose module locks make the others wait for it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


class _LazyModule(ModuleType):
    """Stands for module `name` until the first attribute is read; then forwards to it."""

    def __getattr__(self, attr: str) -> object:
        real = self.__dict__.get("_real")
        if real is None:
            real = importlib.import_module(self.__name__)
            self.__dict__["_real"] = real
        return getattr(real, attr)


def lazy_module(name: str) -> ModuleType:
    """Module `name`, executed on its first attribute access (or now if already imported)."""
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec(name) is None:
        raise ImportError(f"no module named {name!r}")
    return _LazyModule(name)
