"""Drop-in ``nanotron.logging.timers``: :data:`nanotron_timer`, :class:`Timers`,
:class:`TimerRecord`, :class:`TimerType`.

Change ``from nanotron.logging.timers import nanotron_timer`` to
``from instrument.compat.nanotron import nanotron_timer``; the calls and the numbers stay the
same. ``nanotron_timer(name, timer_type="cuda", cuda_sync=False)`` returns the same
:class:`TimerRecord` for the same name, usable as ``with nanotron_timer("x"):``, as
``@nanotron_timer("x")`` / ``@nanotron_timer``, and as ``t.start(); ...; t.end()``; ``elapsed``
(the last interval, or the time so far while running), ``total_time`` and ``average_time`` are
in seconds and ``call_count`` counts completed intervals. As in nanotron, timing is off unless
``ENABLE_TIMERS=1`` is set or :meth:`Timers.enable` is called; while off, ``nanotron_timer``
returns a record that does nothing (no clock read, nothing stored).

What differs from nanotron (on purpose):

- CUDA event pairs are resolved as they complete (checked without waiting, every 64 pairs) and
  summed, and their events are reused, so a long run does not keep one event pair per call;
  ``total_time`` still waits for the pairs not yet resolved.
- Without CUDA, ``timer_type="cuda"`` falls back to the host clock when the record is created
  (warned once per process, not at every record); an injected test clock
  (``instrument.configure(clock=...)``) also selects the host clock.
- Host times come from ``instrument``'s host clock (``time.perf_counter``), not ``time.time``,
  so ``start_time`` / ``end_time`` are not epoch seconds.
- Asking again for an existing timer with other settings raises ``ValueError`` as the latest
  nanotron does, but the comparison is with the settings asked for, so a record that fell back
  to the CPU is not a conflict; ``@nanotron_timer("x")`` and ``@nanotron_timer(timer_type=...)``
  work as nanotron documents them, and ``async def`` functions are timed until they return.
- ``log`` / ``log_all`` use rank 0 when no process group is initialized. As in nanotron they
  log at INFO to the ``nanotron.logging.timers`` logger (nanotron's logging setup applies;
  without it, configure ``logging`` or pass ``logger=``).
- With ``instrument.compat.to_registry()`` set before a record is created, its intervals are
  also ``instrument`` regions of the same name, so they reach reporters, trees and sinks.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable, ItemsView
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeVar, overload

import torch

from instrument import _state, clocks
from instrument.compat.clock import cuda_events_usable
from instrument.compat.errors import check_timer_name
from instrument.compat.feed import RegistryFeed, feeds_registry
from instrument.rank import rank as _rank

__all__ = ["TimerRecord", "TimerType", "Timers", "nanotron_timer"]

F = TypeVar("F", bound=Callable[..., Any])

#: nanotron's own logger for this module (``nanotron.logging.get_logger(__name__)`` in
#: ``nanotron/logging/timers.py``): inside the ``nanotron`` hierarchy, so nanotron's logging
#: setup (``set_verbosity``, ``set_formatter``, its library root logger) applies to it.
_log = logging.getLogger("nanotron.logging.timers")

#: Completed CUDA pairs kept before ``end()`` resolves the finished ones (without waiting).
FOLD_AT = 64


class TimerType(Enum):
    """How a timer measures: the host clock, or CUDA events on the current stream."""

    CPU = "cpu"
    CUDA = "cuda"


def _timer_type(value: object) -> TimerType:
    if isinstance(value, TimerType):
        return value
    if isinstance(value, str) and value in ("cpu", "cuda"):
        return TimerType(value)
    raise ValueError(f"unknown timer_type {value!r}; expected 'cuda' or 'cpu' (or a TimerType)")


def _check_bool(label: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{label} must be True or False, got {value!r}")
    return value


_NO_CUDA = (
    "instrument.compat.nanotron: CUDA timer requested but CUDA is not available; "
    "falling back to the CPU timer"
)


@dataclass(eq=False)
class TimerRecord:
    """Timing of one named timer: its intervals, their count and their total, in seconds.

    Example:
        >>> with nanotron_timer("forward"):
        ...     y = model(x)
        >>> t = nanotron_timer("forward")
        >>> t.elapsed, t.total_time, t.average_time, t.call_count
    """

    name: str
    timer_type: TimerType = TimerType.CUDA
    start_time: float = 0.0
    end_time: float = 0.0
    running: bool = False
    call_count: int = 0
    cuda_sync: bool = False
    enabled: bool = True
    to_registry: bool | None = None

    _start_ns: int = field(default=0, init=False, repr=False)
    _end_ns: int = field(default=0, init=False, repr=False)
    _cpu_total_ns: int = field(default=0, init=False, repr=False)
    _cuda_total: float = field(default=0.0, init=False, repr=False)
    _cuda_last: float = field(default=0.0, init=False, repr=False)
    _cuda_events: list[clocks.EventPair] = field(default_factory=list, init=False, repr=False)
    _current_start_event: torch.cuda.Event | None = field(default=None, init=False, repr=False)
    _requested: TimerType = field(default=TimerType.CUDA, init=False, repr=False)
    _feed: RegistryFeed | None = field(default=None, init=False, repr=False)
    # set on records handed out by Timers: how a decorator finds the current record per call
    _timers: Timers | None = field(default=None, init=False, repr=False)
    _enabled_arg: bool | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        check_timer_name(self.name)
        self.timer_type = self._requested = _timer_type(self.timer_type)
        _check_bool("cuda_sync", self.cuda_sync)
        _check_bool("enabled", self.enabled)
        if not self.enabled:
            return
        if self.timer_type is TimerType.CUDA and not cuda_events_usable(_NO_CUDA, stacklevel=3):
            self.timer_type = TimerType.CPU
        if feeds_registry(self.to_registry):
            self._feed = RegistryFeed(self.name)

    # -- start / end -------------------------------------------------------------------------

    def start(self) -> TimerRecord:
        """Start an interval (a running timer restarts, with a warning, as in nanotron)."""
        if not self.enabled:
            return self
        if self.running:
            _log.warning("Timer '%s' already running. Restarting.", self.name)
        if self._feed is not None:
            self._feed.start()
        if self.timer_type is TimerType.CUDA:
            if self.cuda_sync:
                clocks.synchronize()
            self._current_start_event = clocks.record_event()
        else:
            self._start_ns = _state.now()
            self.start_time = self._start_ns / 1e9
        self.running = True
        return self

    def end(self) -> None:
        """End the interval; a CUDA interval is only recorded here, resolved when read."""
        if not self.enabled:
            return
        if not self.running:
            _log.warning("Timer '%s' was not running. Ignoring end call.", self.name)
            return
        if self.timer_type is TimerType.CUDA:
            if self.cuda_sync:
                clocks.synchronize()
            end_event = clocks.record_event()
            start_event, self._current_start_event = self._current_start_event, None
            assert start_event is not None
            self._cuda_events.append((start_event, end_event, torch.cuda.current_device()))
            if len(self._cuda_events) >= FOLD_AT:
                self._resolve(wait=False)
        else:
            self._end_ns = _state.now()
            self.end_time = self._end_ns / 1e9
            self._cpu_total_ns += self._end_ns - self._start_ns
        self.call_count += 1
        self.running = False
        if self._feed is not None:
            self._feed.stop()

    def _resolve(self, *, wait: bool) -> None:
        """Fold completed CUDA pairs into the total (``wait``: all of them, synchronizing)."""
        done = 0
        try:
            for pair in self._cuda_events:
                if not wait and not pair[1].query():  # type: ignore[no-untyped-call]
                    break
                seconds = clocks.pair_ms(pair) / 1000.0
                self._cuda_total += seconds
                self._cuda_last = seconds
                done += 1
        finally:  # the pairs read went back to the pool: never read them again
            del self._cuda_events[:done]

    def reset(self) -> None:
        """Forget every interval; a running one is dropped (its registry region, if fed,
        is closed so later regions do not nest under it)."""
        if self.running and self._feed is not None:
            self._feed.stop()
        self.start_time = self.end_time = 0.0
        self._start_ns = self._end_ns = self._cpu_total_ns = 0
        self.running = False
        self.call_count = 0
        self._cuda_total = self._cuda_last = 0.0
        self._cuda_events = []
        self._current_start_event = None

    # -- readings, in seconds -----------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        """The last interval in seconds, or the time so far while running (a CUDA timer waits
        for the device)."""
        if not self.enabled:
            return 0.0
        cuda = self.timer_type is TimerType.CUDA
        if not self.running:
            if not cuda:
                return (self._end_ns - self._start_ns) / 1e9
            self._resolve(wait=True)
            return self._cuda_last
        if cuda and self._current_start_event is not None:
            if self.cuda_sync:
                clocks.synchronize()
            now = clocks.record_event()
            now.synchronize()
            seconds = self._current_start_event.elapsed_time(now) / 1000.0
            clocks.events.release(torch.cuda.current_device(), [now])
            return float(seconds)
        return (_state.now() - self._start_ns) / 1e9

    @property
    def total_time(self) -> float:
        """Seconds over every completed interval (a CUDA timer waits for the device)."""
        if self.timer_type is TimerType.CPU:
            return self._cpu_total_ns / 1e9
        self._resolve(wait=True)
        return self._cuda_total

    @property
    def average_time(self) -> float:
        """Seconds per completed interval (0.0 before the first)."""
        if self.call_count == 0:
            return 0.0
        return self.total_time / self.call_count

    # -- with / decorator ---------------------------------------------------------------------

    def __enter__(self) -> TimerRecord:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.end()

    def _current(self) -> TimerRecord:
        """The record a decorated call uses: looked up again per call when handed out by
        :class:`Timers`, so ``Timers.disable()`` / ``enable()`` apply to decorated functions."""
        if self._timers is None:
            return self
        return self._timers(self.name, self._requested, self.cuda_sync, self._enabled_arg)

    def __call__(self, func: F) -> F:
        """``@nanotron_timer("name")``: time each call of ``func``."""
        return _decorate(func, self._current)


def _decorate(func: F, record: Callable[[], TimerRecord]) -> F:
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            with record():
                return await func(*args, **kwargs)

        return timed_coroutine  # type: ignore[return-value]

    @functools.wraps(func)
    def timed_call(*args: Any, **kwargs: Any) -> Any:
        with record():
            return func(*args, **kwargs)

    return timed_call  # type: ignore[return-value]


def _line(name: str, timer: TimerRecord) -> str:
    total_ms = timer.total_time * 1000
    average_ms = timer.average_time * 1000
    return (
        f"Timer '{name}' ({timer.timer_type.value}): {total_ms:.2f}ms total, "
        f"{average_ms:.2f}ms avg, {timer.call_count} calls"
    )


class Timers:
    """The process-wide registry of named timers; :data:`nanotron_timer` is its one instance.

    Timing is on when the environment has ``ENABLE_TIMERS=1`` at import, or after
    :meth:`enable`.
    """

    _instance: ClassVar[Timers | None] = None
    _enabled: ClassVar[bool] = os.environ.get("ENABLE_TIMERS", "0") == "1"
    _timers: dict[str, TimerRecord]
    _disabled: dict[tuple[str, TimerType, bool, bool | None], TimerRecord]

    def __new__(cls) -> Timers:
        if cls._instance is None:
            instance = super().__new__(cls)
            instance._timers = {}
            instance._disabled = {}
            cls._instance = instance
        return cls._instance

    @classmethod
    def enable(cls) -> None:
        """Turn timing on for records handed out from now on."""
        cls._enabled = True

    @classmethod
    def disable(cls) -> None:
        """Turn timing off: :meth:`__call__` hands out records that do nothing."""
        cls._enabled = False

    @classmethod
    def is_enabled(cls) -> bool:
        """Whether timing is on."""
        return cls._enabled

    @overload
    def __call__(
        self,
        name: str,
        timer_type: TimerType | str = ...,
        cuda_sync: bool = ...,
        enabled: bool | None = ...,
    ) -> TimerRecord: ...

    @overload
    def __call__(
        self,
        name: F,
        timer_type: TimerType | str = ...,
        cuda_sync: bool = ...,
        enabled: bool | None = ...,
    ) -> F: ...

    @overload
    def __call__(
        self,
        name: None = None,
        timer_type: TimerType | str = ...,
        cuda_sync: bool = ...,
        enabled: bool | None = ...,
    ) -> Callable[[F], F]: ...

    def __call__(
        self,
        name: str | Callable[..., Any] | None = None,
        timer_type: TimerType | str = TimerType.CUDA,
        cuda_sync: bool = False,
        enabled: bool | None = None,
    ) -> TimerRecord | Callable[..., Any]:
        """The timer called ``name``, created on first use (the same record every time).

        ``@nanotron_timer`` and ``@nanotron_timer(timer_type=...)`` decorate a function under
        its ``__name__``. ``enabled`` overrides :meth:`is_enabled` for this call; a disabled
        call returns a record that does nothing.

        Raises:
            ValueError: ``name`` exists with another ``timer_type`` or ``cuda_sync``, or an
                argument is not one of the allowed values.
        """
        kind = _timer_type(timer_type)
        _check_bool("cuda_sync", cuda_sync)
        if enabled is not None:
            _check_bool("enabled", enabled)
        if name is None or callable(name):

            def decorator(func: F) -> F:
                timer_name = func.__name__
                return _decorate(func, lambda: self(timer_name, kind, cuda_sync, enabled))

            return decorator if name is None else decorator(name)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a timer name must be a non-empty string or a function, got {name!r}")
        if not (self._enabled if enabled is None else enabled):
            return self._disabled_record(name, kind, cuda_sync, enabled)
        record = self._timers.get(name)
        if record is None:
            fresh = TimerRecord(name=name, timer_type=kind, cuda_sync=cuda_sync)
            fresh._timers, fresh._enabled_arg = self, enabled
            record = self._timers.setdefault(name, fresh)
        if record._requested is not kind or record.cuda_sync != cuda_sync:
            raise ValueError(
                f"Timer {name!r} already exists with different settings: existing "
                f"timer_type={record._requested.value!r}, cuda_sync={record.cuda_sync}; "
                f"requested timer_type={kind.value!r}, cuda_sync={cuda_sync}"
            )
        return record

    def _disabled_record(
        self, name: str, kind: TimerType, cuda_sync: bool, enabled: bool | None
    ) -> TimerRecord:
        key = (name, kind, cuda_sync, enabled)
        record = self._disabled.get(key)
        if record is None:
            record = TimerRecord(name=name, timer_type=kind, cuda_sync=cuda_sync, enabled=False)
            record._timers, record._enabled_arg = self, enabled
            record = self._disabled.setdefault(key, record)
        return record

    def reset_all(self) -> None:
        """Reset every timer."""
        for timer in self._timers.values():
            timer.reset()

    def reset(self, name: str) -> None:
        """Reset the timer called ``name`` (nothing if there is none)."""
        timer = self._timers.get(name)
        if timer is not None:
            timer.reset()

    def log(
        self,
        name: str,
        logger: logging.Logger | None = None,
        rank: int | None = 0,
        group: Any = None,
    ) -> None:
        """Log ``name``'s total and average (ms) and call count on ``rank`` (``None``: every
        rank); nothing for an unknown or never completed timer."""
        timer = self._timers.get(name)
        if timer is None:
            return
        if rank is not None and _rank(group) != rank:
            return
        if timer.call_count > 0:
            (logger or _log).info(_line(name, timer))

    def log_all(
        self, logger: logging.Logger | None = None, rank: int | None = 0, group: Any = None
    ) -> None:
        """Log every completed timer, sorted by name, between two ruler lines, on ``rank``."""
        if rank is not None and _rank(group) != rank:
            return
        timers = sorted(self._timers.items())
        if not timers:
            return
        out = logger or _log
        out.info("---- Timing Information ----")
        for name, timer in timers:
            if timer.call_count > 0:
                out.info(_line(name, timer))
        out.info("----------------------------")

    def items(self) -> ItemsView[str, TimerRecord] | list[tuple[str, TimerRecord]]:
        """``(name, record)`` pairs; empty while timing is off."""
        if not self._enabled:
            return []
        return self._timers.items()


#: The process-wide :class:`Timers`, as in ``from nanotron.logging.timers import nanotron_timer``.
nanotron_timer = Timers()
