"""One-time warnings: each key warns once per process."""

from __future__ import annotations

import warnings

_warned: set[str] = set()


def warn_once(key: str, message: str, *, stacklevel: int = 3) -> None:
    """Warn ``message`` (a ``RuntimeWarning``) the first time ``key`` is seen in this process;
    ``instrument.testing.reset()`` forgets the keys. ``stacklevel`` is as for ``warnings.warn``
    called here."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
