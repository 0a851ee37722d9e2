"""The misuse errors of the Megatron, DeepSpeed and bing_bert timers, and the argument
checks that raise them (the timer-name check serves every compat module).

Those projects ``assert`` these conditions, so both errors are also ``AssertionError``\\ s:
code written for them still catches what it caught. Each compat module re-exports both.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

__all__ = [
    "TimerArgumentError",
    "TimerStateError",
    "check_count",
    "check_names",
    "check_normalizer",
    "check_timer_name",
]


class TimerArgumentError(ValueError, AssertionError):
    """A bad argument (timer name, log level or option, normalizer, ranks)."""


class TimerStateError(RuntimeError, AssertionError):
    """A timer started twice, or stopped without a start."""


def check_timer_name(name: object) -> str:
    """``name``, if it is a non-empty string; else :class:`TimerArgumentError`."""
    if not isinstance(name, str) or not name:
        raise TimerArgumentError(f"timer name must be a non-empty string, got {name!r}")
    return name


def check_normalizer(normalizer: object) -> float:
    """``normalizer`` as a float, if it is a real number > 0; else :class:`TimerArgumentError`."""
    if (
        not isinstance(normalizer, numbers.Real)
        or isinstance(normalizer, bool)
        or not float(normalizer) > 0.0
    ):
        raise TimerArgumentError(f"normalizer must be a number > 0, got {normalizer!r}")
    return float(normalizer)


def check_count(value: object, what: str, minimum: int) -> int:
    """``value``, if it is an int >= ``minimum``; else :class:`TimerArgumentError` naming
    ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise TimerArgumentError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def check_names(names: Iterable[str]) -> list[str]:
    """``names`` as a list; one string (a likely slip for a list of one) is a ``TypeError``."""
    if isinstance(names, str):
        raise TypeError(f"names must be a list of timer names, got the string {names!r}")
    return list(names)
