"""Clocks: the host clock, CUDA events from a reused pool, and the synchronizing clock.

A region reads the host clock on enter and exit. On the ``"cuda"`` clock it also records a
CUDA event at each end on the current stream — recording never waits for the device — and
the pair is resolved at flush time, in one pass, after which the events go back to the pool.

Every CUDA call the clocks, the registry and the regions make goes through :data:`cuda`
(``torch.cuda`` itself), so the project's tests drive the same code with a fake device on
machines without a GPU (``tests/fake_cuda.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from instrument._warn import warn_once

CLOCKS = ("auto", "cpu", "cuda", "sync")

#: The CUDA API used for events, devices and synchronization: ``torch.cuda`` (a seam:
#: tests swap in a fake with the same few functions and an ``Event`` type).
cuda: Any = torch.cuda


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now_ns()``: an injectable host clock (``instrument.testing.FakeClock``)."""

    def now_ns(self) -> int:
        """Return the current time in integer nanoseconds."""


def in_bad_fork() -> bool:
    """True in a process forked after its parent initialised CUDA (a DataLoader worker, say):
    CUDA cannot be used there, so every region runs on the host clock."""
    return bool(cuda._is_in_bad_fork())


def cuda_ready() -> bool:
    """True when CUDA is available *and* already initialised in this process (asked in
    that order of cost: ``is_initialized()`` is a flag, ``is_available()`` asks the driver)."""
    return cuda.is_initialized() and cuda.is_available() and not in_bad_fork()


def check_clock(clock: object) -> None:
    """Raise ``ValueError`` unless ``clock`` is a clock name or a ``Clock`` object."""
    if isinstance(clock, str):
        if clock not in CLOCKS:
            raise ValueError(
                f"unknown clock {clock!r}; expected one of 'auto', 'cpu', 'cuda', 'sync'"
                " or an object with a now_ns() method"
            )
    elif not isinstance(clock, Clock):
        raise ValueError(
            f"unknown clock {clock!r}; expected one of 'auto', 'cpu', 'cuda', 'sync'"
            " or an object with a now_ns() method"
        )


def reader(clock: Clock) -> Callable[[], int]:
    """``clock.now_ns`` as regions call it: a value that is not an int (nanoseconds) fails
    with a ``TypeError`` naming the clock. Checked at each read, never at adoption: a clock
    is not read until a region needs it (a disabled timer never reads its clock)."""
    now_ns = clock.now_ns

    def now() -> int:
        value = now_ns()
        if type(value) is not int:
            if isinstance(value, int) and not isinstance(value, bool):
                return int(value)
            raise TypeError(
                f"instrument: clock {clock!r}: now_ns() must return an int (nanoseconds), "
                f"got {value!r}"
            )
        return value

    return now


def resolve(clock: object, *, warn: bool = True) -> str:
    """Turn a clock request into the mode a region runs on: "cpu", "cuda" or "sync".

    A ``Clock`` object is a host clock ("cpu"). "auto" means "cuda" when CUDA is available
    and initialised, else "cpu". An explicit "cuda" or "sync" without CUDA warns once and
    falls back to "cpu".
    """
    check_clock(clock)
    if not isinstance(clock, str):
        return "cpu"
    if clock == "auto":
        return "cuda" if cuda_ready() else "cpu"
    if clock in ("cuda", "sync") and in_bad_fork():
        return "cpu"
    if clock in ("cuda", "sync") and not cuda.is_available():
        if warn:
            warn_once(
                f"clock:{clock}",
                f"instrument: clock={clock!r} asked for but CUDA is not available; "
                "using the host clock ('cpu') instead",
                stacklevel=4,
            )
        return "cpu"
    return clock


class EventPool:
    """Reusable ``torch.cuda.Event(enable_timing=True)`` objects, one free list per device.

    ``acquire`` and ``release`` are list pops and appends: atomic under the GIL, no lock.
    """

    def __init__(self) -> None:
        self._free: dict[int, list[torch.cuda.Event]] = {}
        self._lock = threading.Lock()

    def acquire(self) -> torch.cuda.Event:
        """An event for the current device (new if the pool is empty)."""
        free = self._free.get(cuda.current_device())
        if free:
            try:
                return free.pop()
            except IndexError:  # another thread took the last one
                pass
        event: torch.cuda.Event = cuda.Event(enable_timing=True)
        return event

    def release(self, device: int, events: list[torch.cuda.Event]) -> None:
        """Give resolved events back for reuse."""
        free = self._free.get(device)
        if free is None:
            with self._lock:
                free = self._free.setdefault(device, [])
        free.extend(events)

    def clear(self) -> None:
        """Drop every pooled event (after fork, or on reset)."""
        self._free = {}
        self._lock = threading.Lock()


events = EventPool()


def record_event() -> torch.cuda.Event:
    """Record a pooled timing event on the current stream; never waits for the device."""
    event = events.acquire()
    event.record()
    return event


EventPair = tuple[torch.cuda.Event, torch.cuda.Event, int]
"""Pooled (start, end) events of one interval and the device they were recorded on."""


def pair_ms(pair: EventPair) -> float:
    """Milliseconds between a pair's events, waiting for its end event (at once when it has
    completed); the events then go back to the pool."""
    start, end, device = pair
    end.synchronize()
    milliseconds: float = start.elapsed_time(end)
    events.release(device, [start, end])
    return milliseconds


def release_pair(pair: EventPair) -> None:
    """Give an unread pair's events back to the pool."""
    events.release(pair[2], [pair[0], pair[1]])


def synchronize() -> None:
    """Wait for the current device (the ``"sync"`` clock, at both ends of a region)."""
    cuda.synchronize()


def wall_time() -> float:
    """Seconds since the epoch, for report timestamps."""
    return time.time()
