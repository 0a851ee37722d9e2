"""Drop-in ``kempnerforge.profiling`` timers: :class:`CUDATimer` and :class:`CUDATimerCollection`.

Change ``from kempnerforge.profiling import CUDATimer, CUDATimerCollection`` to
``from instrument.compat.kempnerforge import CUDATimer, CUDATimerCollection``; the calls and the
numbers stay the same: ``elapsed_ms()`` is the last start/stop interval in milliseconds, read
from a pair of CUDA events recorded on the current stream, synchronizing only the end event
when it is read. ``CUDATimerCollection(regions, enabled=False)`` does nothing at all: no timer
objects, no events, no clock reads.

What differs from KempnerForge (on purpose):

- Without CUDA (or with a test clock injected through ``instrument.configure(clock=...)``) the
  timers read the host clock instead of failing; the missing CUDA is warned about once.
- Events come from ``instrument``'s reused pool, and a superseded interval's events go back to
  it, so a timer never waits on the device before ``elapsed_ms()``.
- ``stop()`` without ``start()`` is ignored with a warning (KempnerForge records a lone end event
  and fails later, when the time is read); ``elapsed_ms()`` before any completed interval raises
  a ``RuntimeError`` that says so; a timer restarted while running keeps reporting its previous
  completed interval until it stops again.
- An unknown region raises a ``KeyError`` naming the known regions.
- With ``to_registry=True`` (or after :func:`instrument.compat.to_registry`) each interval is
  also an ``instrument`` region of the same name, so it reaches reporters, trees and sinks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from instrument import _state, clocks
from instrument._warn import warn_once
from instrument.compat.clock import cuda_events_usable
from instrument.compat.errors import check_timer_name
from instrument.compat.feed import RegistryFeed, feeds_registry

__all__ = ["CUDATimer", "CUDATimerCollection"]

_NO_CUDA = (
    "instrument.compat.kempnerforge: CUDA is not available; CUDATimer measures host wall time "
    "with the host clock instead of CUDA events"
)


class CUDATimer:
    """Time one region with a pair of CUDA events (the host clock without CUDA).

    Args:
        name: The ``instrument`` region this timer feeds (only used with ``to_registry``).
        to_registry: Also record each interval as an ``instrument`` region (``None``: the
            default set by :func:`instrument.compat.to_registry`).

    Example:
        >>> t = CUDATimer()
        >>> t.start()
        >>> y = model(x)
        >>> t.stop()
        >>> t.elapsed_ms()   # the last start/stop interval, in milliseconds
        12.3
    """

    __slots__ = ("_events", "_feed", "_last_ms", "_pending", "_running", "_start", "_t0", "name")

    def __init__(self, *, name: str = "cuda_timer", to_registry: bool | None = None) -> None:
        self.name = check_timer_name(name)
        self._feed = RegistryFeed(name) if feeds_registry(to_registry) else None
        self._events = cuda_events_usable(_NO_CUDA, stacklevel=2)
        self._running = False
        self._t0 = 0
        self._start: torch.cuda.Event | None = None
        # the last completed interval: an unresolved event pair, or its resolved milliseconds
        self._pending: clocks.EventPair | None = None
        self._last_ms: float | None = None

    @property
    def running(self) -> bool:
        """True between ``start()`` and ``stop()``."""
        return self._running

    @property
    def uses_cuda_events(self) -> bool:
        """True when this timer records CUDA events, False when it reads the host clock."""
        return self._events

    def start(self) -> None:
        """Start an interval (record the start event on the current stream); a running timer
        restarts, as in KempnerForge."""
        if self._feed is not None:
            self._feed.start()
        if self._events:
            self._start = clocks.record_event()
        else:
            self._t0 = _state.now()
        self._running = True

    def stop(self) -> None:
        """End the interval (record the end event; nothing waits for the device)."""
        if not self._running:
            warn_once(
                f"compat.kempnerforge:stop:{self.name}",
                f"CUDATimer {self.name!r}: stop() called without start(); ignored",
                stacklevel=4,
            )
            return
        if self._events:
            end = clocks.record_event()
            if self._pending is not None:  # superseded before anyone read it
                clocks.release_pair(self._pending)
            assert self._start is not None
            self._pending = (self._start, end, torch.cuda.current_device())
            self._start = None
        else:
            self._last_ms = (_state.now() - self._t0) / 1e6
        self._running = False
        if self._feed is not None:
            self._feed.stop()

    @property
    def completed(self) -> bool:
        """True once a start/stop interval has completed."""
        return self._pending is not None or self._last_ms is not None

    def elapsed_ms(self) -> float:
        """The last completed start/stop interval in milliseconds (waits for its end event).

        Raises:
            RuntimeError: No interval has completed yet.
        """
        if self._pending is not None:
            self._last_ms = clocks.pair_ms(self._pending)
            self._pending = None
        if self._last_ms is None:
            raise RuntimeError(
                f"CUDATimer {self.name!r}: elapsed_ms() called before any start()/stop() "
                "interval completed; call start() and stop() first"
            )
        return self._last_ms

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<CUDATimer {self.name!r} {state}>"


def _check_regions(regions: object) -> list[str]:
    if isinstance(regions, str):
        raise TypeError(
            f"regions must be a list of region names, got the string {regions!r}; "
            f"did you mean [{regions!r}]?"
        )
    if not isinstance(regions, Iterable):
        raise TypeError(f"regions must be a list of region names, got {regions!r}")
    return list(dict.fromkeys(check_timer_name(name) for name in regions))


class CUDATimerCollection:
    """Named :class:`CUDATimer` s for the phases of a step, reported together in milliseconds.

    Args:
        regions: The region names to time (given up front).
        enabled: ``False`` makes every call a no-op that allocates nothing and reads no clock;
            ``elapsed_ms`` and ``elapsed_all`` then report 0.0.
        to_registry: Also record each interval as an ``instrument`` region named after its
            region (``None``: the default set by :func:`instrument.compat.to_registry`).

    Example:
        >>> timers = CUDATimerCollection(regions=["forward", "backward", "comm"])
        >>> timers.start("forward"); loss = model(x, y); timers.stop("forward")
        >>> timers.elapsed_all()
        {'forward': 12.3, 'backward': 0.0, 'comm': 0.0}
    """

    __slots__ = ("_enabled", "_regions", "_timers")

    def __init__(
        self, regions: list[str], enabled: bool = True, *, to_registry: bool | None = None
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, got {enabled!r}")
        self._enabled = enabled
        self._regions = _check_regions(regions)
        self._timers: dict[str, CUDATimer] = {}
        if enabled:
            to_registry = feeds_registry(to_registry)
            for name in self._regions:
                self._timers[name] = CUDATimer(name=name, to_registry=to_registry)

    @property
    def enabled(self) -> bool:
        """Whether timing is active."""
        return self._enabled

    def _timer(self, region: str) -> CUDATimer:
        timer = self._timers.get(region)
        if timer is None:
            raise KeyError(
                f"unknown region {region!r}; this CUDATimerCollection times {self._regions}"
            )
        return timer

    def start(self, region: str) -> None:
        """Start timing ``region``."""
        if self._enabled:
            self._timer(region).start()

    def stop(self, region: str) -> None:
        """Stop timing ``region``."""
        if self._enabled:
            self._timer(region).stop()

    def elapsed_ms(self, region: str) -> float:
        """The last completed interval of ``region`` in milliseconds (0.0 while disabled).

        Raises:
            KeyError: ``region`` is not one of this collection's regions.
            RuntimeError: ``region`` has not completed an interval yet.
        """
        if not self._enabled:
            return 0.0
        return self._timer(region).elapsed_ms()

    def elapsed_all(self) -> dict[str, float]:
        """Every region's last completed interval in milliseconds; 0.0 for a region that has
        not completed one (never started, or still in its first interval)."""
        if not self._enabled:
            return dict.fromkeys(self._regions, 0.0)
        return {
            name: timer.elapsed_ms() if timer.completed else 0.0
            for name, timer in self._timers.items()
        }

    def __repr__(self) -> str:
        state = "enabled" if self._enabled else "disabled"
        return f"<CUDATimerCollection {self._regions} {state}>"
