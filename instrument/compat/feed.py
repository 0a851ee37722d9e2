"""Compat timers feeding the ``instrument`` registry: one process-wide default, one helper.

A compat timer that feeds the registry opens an :func:`instrument.timer` region on
``start()`` and closes it on ``stop()``, so its timings also reach reporters and sinks
(nested under whatever region is open). Its own numbers (Megatron's seconds, DeepSpeed's
milliseconds, ...) are unchanged.
"""

from __future__ import annotations

from instrument.regions.timer import Timer, timer

_default = False


def to_registry(enabled: bool = True) -> None:
    """Make compat timers created from now on feed the registry by default (``False``: stop).

    Example:
        >>> from instrument import compat
        >>> compat.to_registry()          # before the framework builds its Timers
    """
    global _default
    if not isinstance(enabled, bool):
        raise ValueError(f"to_registry(enabled) takes a bool, got {enabled!r}")
    _default = enabled


def feeds_registry(requested: bool | None = None) -> bool:
    """Whether a compat timer built with ``to_registry=requested`` feeds the registry
    (``None``: the default set by :func:`to_registry`)."""
    if requested is None:
        return _default
    if not isinstance(requested, bool):
        raise ValueError(f"to_registry must be True, False or None, got {requested!r}")
    return requested


class RegistryFeed:
    """The region one compat timer drives: ``start()`` / ``stop()`` never raise on misuse
    (the compat timer already reported it), and a stop without a start does nothing."""

    __slots__ = ("_timer",)

    def __init__(self, name: str) -> None:
        self._timer: Timer = timer(name.replace("/", "."))

    def start(self) -> None:
        """Open the region unless it is already open."""
        if not self._timer.running:
            self._timer.start()

    def stop(self) -> None:
        """Close the region if it is open."""
        if self._timer.running:
            self._timer.stop()
