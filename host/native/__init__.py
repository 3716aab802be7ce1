"""The native host engine (C++, nanobind): the extension `_engine` built at install.

`available` says whether it imported; if not, `why` says what failed (one line for the
driver's backend log) and `_engine` is None. Rebuild with `make install`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_engine: ModuleType | None
try:
    _engine = importlib.import_module(f"{__name__}._engine")
except ImportError as e:  # not built, or built for another Python / CPU
    _engine = None
    available = False
    why = f"native engine not importable ({e}); rebuild it with `make install`"
else:
    available = True
    why = ""

__all__ = ["_engine", "available", "why"]
