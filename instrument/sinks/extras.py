"""The optional packages of sinks (the ``tensorboard`` and ``wandb`` extras): checked and
imported when a sink is made (never inside a flush), a missing one named with the
``pip install`` that adds it."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def require(package: str, hint: str) -> None:
    """Raise ``ModuleNotFoundError(hint)`` unless ``package`` is installed (nothing imported)."""
    if importlib.util.find_spec(package) is None:
        raise ModuleNotFoundError(hint, name=package)


def load(module: str, package: str, hint: str) -> ModuleType:
    """Import ``module``; if that fails (``package`` is missing or broken), raise
    ``ModuleNotFoundError(hint)``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ModuleNotFoundError(hint, name=package) from error
