"""Argument checks for constructors: each raises at construction, naming the argument, the
bad value and what is accepted (``TypeError`` for a wrong kind of value, ``ValueError``
for a right kind out of range), and returns the value in its normal form."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch


def _quoted(choices: Iterable[object]) -> str:
    return ", ".join(repr(choice) for choice in choices)


def check_choice(name: str, value: object, choices: Iterable[object]) -> Any:
    """``value`` if it is one of ``choices``, else ``ValueError: unknown <name> ...``."""
    options = tuple(choices)
    try:
        known = value in options
    except TypeError:  # an unhashable or oddly comparing value
        known = False
    if not known:
        raise ValueError(f"unknown {name} {value!r}; expected one of {_quoted(options)}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def check_timeout(name: str, value: object) -> timedelta:
    """``value`` as a ``timedelta``: a positive, finite number of seconds or a positive
    ``timedelta``."""
    accepted = "a number of seconds > 0 or a datetime.timedelta"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{name} must be {accepted}, got {value!r}")
    if not 0.0 < seconds < math.inf:
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    try:
        return value if isinstance(value, timedelta) else timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{name} must be {accepted} (at most days={timedelta.max.days}), "
                         f"got {value!r}") from None  # fmt: skip


def check_writable_stream(name: str, value: object) -> Any:
    """``value`` if it is ``None`` or has a callable ``write`` (a text stream)."""
    if value is not None and not callable(getattr(value, "write", None)):
        raise TypeError(
            f"{name} must be a text stream with write() (e.g. sys.stderr or an open file) or "
            f"None, got {value!r}"
        )
    return value


def check_optional_bool(name: str, value: object) -> bool | None:
    """``value`` if it is ``True``, ``False`` or ``None``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None, got {value!r}")
    return value


def check_process_group(name: str, value: object) -> Any:
    """``value`` if it is ``None`` or a ``torch.distributed`` process group (checked against
    the ``ProcessGroup`` type of whatever ``torch.distributed`` is: a stub has none)."""
    if value is None:
        return value
    group_type = getattr(getattr(torch, "distributed", None), "ProcessGroup", None)
    if isinstance(group_type, type) and not isinstance(value, group_type):
        raise TypeError(
            f"{name} must be a torch.distributed process group (e.g. dist.new_group([0, 1])) "
            f"or None for the world, got {value!r}"
        )
    return value
