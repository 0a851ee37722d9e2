"""The start/stop timer and the group of named timers that DeepSpeed's and bing_bert's
``SynchronizedWallClockTimer`` share.

Misuse raises :class:`~instrument.compat.errors.TimerStateError` in the source's own words,
each interval can also feed the ``instrument`` registry, and reading a running timer stops,
reads and restarts it. Each source keeps its own clock and unit in its subclass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Generic, TypeVar

from instrument.compat.errors import TimerStateError, check_timer_name
from instrument.compat.feed import RegistryFeed, feeds_registry

__all__ = ["StartStopTimer", "TimerGroup"]


class StartStopTimer(ABC):
    """One named timer summing start/stop intervals.

    A subclass reads its clock in ``_start_clock`` / ``_stop_clock``, returns the sum from
    ``_total`` and drops it in ``_clear``; ``started_`` and ``name_`` keep the sources' names.
    """

    #: The :class:`TimerStateError` message of ``start()`` on a started timer
    #: (``{name}``: the timer's name).
    ALREADY_STARTED: ClassVar[str]
    #: The :class:`TimerStateError` message of ``stop()`` on a stopped timer.
    NOT_STARTED: ClassVar[str] = "timer is not started: {name!r}; start() it before stop()"

    def __init__(self, name: str, *, to_registry: bool | None = None) -> None:
        self.name_ = name
        self.started_ = False
        self._feed = RegistryFeed(name) if feeds_registry(to_registry) else None

    def start(self) -> None:
        """Start an interval; raises :class:`TimerStateError` if already started."""
        if self.started_:
            raise TimerStateError(self.ALREADY_STARTED.format(name=self.name_))
        self._start_clock()
        if self._feed is not None:
            self._feed.start()

    def stop(self) -> None:
        """End the interval and add it; raises :class:`TimerStateError` if not started."""
        if not self.started_:
            raise TimerStateError(self.NOT_STARTED.format(name=self.name_))
        self._stop_clock()
        if self._feed is not None:
            self._feed.stop()

    def reset(self) -> None:
        """Drop every interval; a running timer stops uncounted."""
        self._clear()
        self.started_ = False
        if self._feed is not None:
            self._feed.stop()

    def elapsed(self, reset: bool = True) -> float:
        """The intervals since the last reset, summed in the source's unit; then drop them
        when ``reset``. A running timer is stopped, read and started again, so the time up
        to now counts and it keeps running."""
        running = self.started_
        if running:
            self._stop_clock()
        total = self._total()
        if reset:
            self._clear()
        if running:
            self._start_clock()
        return total

    @abstractmethod
    def _start_clock(self) -> None:
        """Read the clock at the start of an interval and set ``started_``."""

    @abstractmethod
    def _stop_clock(self) -> None:
        """Read the clock at the end of an interval, add it and clear ``started_``."""

    @abstractmethod
    def _total(self) -> float:
        """The sum of the intervals since the last reset."""

    @abstractmethod
    def _clear(self) -> None:
        """Drop the intervals summed so far."""


TimerT = TypeVar("TimerT", bound=StartStopTimer)


class TimerGroup(ABC, Generic[TimerT]):
    """Named timers, each created on first use.

    Args:
        to_registry: Also time each start/stop as an ``instrument`` region named after the
            timer ('/' becomes '.'); ``None`` follows :func:`instrument.compat.to_registry`.
    """

    def __init__(self, *, to_registry: bool | None = None) -> None:
        self.timers: dict[str, TimerT] = {}
        self._to_registry = feeds_registry(to_registry)

    def __call__(self, name: str) -> TimerT:
        """The timer ``name``, created on first use."""
        timer = self.timers.get(name)
        if timer is None:
            timer = self.timers[name] = self._new_timer(check_timer_name(name))
        return timer

    @abstractmethod
    def _new_timer(self, name: str) -> TimerT:
        """A new timer called ``name``."""
