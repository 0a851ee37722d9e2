"""Helpers for testing instrumented code: a fake clock, captured reports, a full reset.

Example:
    >>> from instrument.testing import FakeClock, use_clock, capture_reports
    >>> clock = FakeClock()
    >>> with use_clock(clock), capture_reports() as reports:
    ...     with instrument.timed("step"):
    ...         clock.advance(0.25)
    >>> reports[-1]["step"].total
    0.25
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from instrument import _state, _warn, config, observe, registry, reporter, selfcost
from instrument.auto import installed_handles
from instrument.compat import feed as compat_feed
from instrument.hooks import untraced
from instrument.regions import frames
from instrument.report import Report
from instrument.sinks.memory import InMemory

__all__ = ["FakeClock", "capture_reports", "reset", "use_clock"]


class FakeClock:
    """A host clock that moves only when told to (integer nanoseconds inside)."""

    def __init__(self, start: float = 0.0) -> None:
        self._ns = round(start * 1e9)

    def now_ns(self) -> int:
        """The current fake time in ns."""
        return self._ns

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (must be >= 0)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards: advance({seconds!r})")
        self._ns += round(seconds * 1e9)

    @property
    def seconds(self) -> float:
        """The current fake time in seconds."""
        return self._ns / 1e9

    def __repr__(self) -> str:
        return f"FakeClock({self.seconds!r})"


@contextmanager
def use_clock(clock: object) -> Iterator[object]:
    """Use ``clock`` (a ``Clock`` or a clock name) inside the block, then restore."""
    previous = _state.requested_clock
    config.configure(clock=clock)
    try:
        yield clock
    finally:
        config.configure(clock=previous)


@contextmanager
def capture_reports(**reporter_options: Any) -> Iterator[list[Report]]:
    """A :class:`~instrument.Reporter` (``every=None`` unless given) whose reports land in the
    yielded list; closed — so flushed once more — when the block ends."""
    sink = InMemory()
    reporter_options.setdefault("every", None)
    extra = list(reporter_options.pop("sinks", None) or ())
    rep = reporter.Reporter(sinks=[sink, *extra], **reporter_options)
    try:
        yield sink.reports
    finally:
        rep.close()


def reset() -> None:
    """Back to a fresh import: reporters detached (no flush), ``auto()`` handles removed,
    everything recorded dropped, default configuration, no open region in this context."""
    for live in reporter.live_reporters():
        live._detach()
    for handle in installed_handles():
        handle.remove()
    selfcost.reset()  # what the removed handles' hooks recorded is dropped below
    untraced.forget_compilations()
    _state.enabled = True
    _state.level = None
    observe.reset()
    compat_feed.to_registry(False)
    config.configure(clock="auto")
    registry.clear()
    registry.forget_idle_paths()
    registry.max_depth, registry.max_paths = registry.MAX_DEPTH, registry.MAX_PATHS
    frames.set_top(frames.ROOT_FRAME)
    _warn.reset()
