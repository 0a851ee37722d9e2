"""One-time warnings: each key warns once per process (``instrument.testing.reset()`` forgets)."""

from __future__ import annotations

import os
import sys
import warnings

import torch.optim

_warned: set[str] = set()

#: Code that a warning never names: instrument's own, and torch's optimizer wrappers (a
#: hook's warning names the loop's ``optimizer.step()``).
_INSIDE = tuple(
    os.path.join(os.path.dirname(path), "") for path in (__file__, torch.optim.__file__)
)


def warn_once(key: str, message: str, *, stacklevel: int | None = 3) -> None:
    """Warn ``message`` (a ``RuntimeWarning``) the first time ``key`` is seen in this process.

    ``stacklevel`` is as for ``warnings.warn`` called here: the default 3 names the caller of
    the function that calls ``warn_once``; None names the first caller outside instrument
    and torch's optimizer code (the user's line, however many frames lead there).
    """
    if key not in _warned:
        _warned.add(key)
        level = _first_outside() if stacklevel is None else stacklevel
        warnings.warn(message, RuntimeWarning, stacklevel=level)


def _first_outside() -> int:
    """The ``stacklevel`` (for ``warn_once``'s call) of the first frame outside ``_INSIDE``."""
    frame = sys._getframe(1)  # warn_once: level 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame = frame.f_back
        level += 1
    return level


def reset() -> None:
    """Forget every key, so each warns again (``instrument.testing.reset()``)."""
    _warned.clear()


def deprecated(what: str, replacement: str) -> None:
    """Warn (a ``DeprecationWarning`` naming the user's line) that ``what`` is deprecated in
    favour of ``replacement``; docs/api.md lists each under "Deprecated"."""
    warnings.warn(
        f"{what} is deprecated; use {replacement}",
        DeprecationWarning,
        stacklevel=_first_outside(),
    )
