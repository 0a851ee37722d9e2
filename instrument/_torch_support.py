"""The torch features that not every supported torch release has: one message for each.

instrument installs beside torch 2.6 and newer (docs/compatibility.md). Where a feature it
uses came later, or may leave torch again, the caller looks it up with :func:`feature` and,
when it is missing, either falls back (and says so once, :func:`degraded`) or raises the
error of :func:`missing`: both name the feature, this torch and the release that has it.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from instrument._warn import warn_once

#: The oldest torch the test suite runs on (docs/compatibility.md); pyproject's lower bound.
OLDEST_TORCH = "2.6"


def feature(module: str, name: str) -> Any:
    """``module.name`` where this torch has it, else None (the module too may be missing)."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def missing(what: str, since: str) -> str:
    """The message for a feature this torch lacks: what, this torch, the release that has it."""
    return f"instrument: {what} needs torch {since} or newer (this is torch {torch.__version__})"


def degraded(what: str, since: str, instead: str) -> None:
    """Warn once that ``what`` is missing here and ``instead`` runs in its place."""
    warn_once(f"torch-feature:{what}", f"{missing(what, since)}; {instead}", stacklevel=None)
