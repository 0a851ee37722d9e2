"""The optional C hot path (``instrument._speedups``), or ``None`` for pure Python.

Set ``INSTRUMENT_NO_EXTENSIONS=1`` to force the pure-Python path (same results, slower
regions); it is also used when the extension was not built (no C compiler).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

speedups: ModuleType | None = None
if not os.environ.get("INSTRUMENT_NO_EXTENSIONS"):
    try:
        speedups = importlib.import_module("instrument._speedups")
    except ImportError:  # pragma: no cover - depends on the build
        speedups = None
if speedups is not None and not all(hasattr(speedups, n) for n in ("bind_stack", "take_tree")):
    # An extension built from an older _speedups.c: rebuild it (pip install, or
    # python setup.py build_ext --inplace); until then the pure-Python path runs.
    import warnings

    warnings.warn(
        "instrument: the C accelerator is out of date with this source; using pure Python "
        "(rebuild it: python setup.py build_ext --inplace)",
        RuntimeWarning,
        stacklevel=2,
    )
    speedups = None
