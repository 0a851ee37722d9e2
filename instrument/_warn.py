"""One-time warnings: each key warns once per process (``instrument.testing.reset()`` forgets)."""

from __future__ import annotations

import warnings

_warned: set[str] = set()


def warn_once(key: str, message: str, *, stacklevel: int = 3) -> None:
    """Warn ``message`` (a ``RuntimeWarning``) the first time ``key`` is seen in this process.

    ``stacklevel`` is as for ``warnings.warn`` called here: the default 3 names the caller of
    the function that calls ``warn_once``.
    """
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def reset() -> None:
    """Forget every key, so each warns again (``instrument.testing.reset()``)."""
    _warned.clear()
