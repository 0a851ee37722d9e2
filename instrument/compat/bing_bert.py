"""Drop-in for DeepSpeedExamples' ``bing_bert/timer.py``: change one import, keep the calls.

Same names, signatures, units and output: :func:`print_rank_0`,
:class:`SynchronizedWallClockTimer` (``elapsed()`` in seconds, ``log`` printing
``"time (ms) | name: x.xx | ..."`` on rank 0) and :class:`ThroughputTimer` (samples/s and
steps/s after ``start_step`` warm-up steps, ``-999`` before; ``print_elapsed_time`` every
1000 steps, with TFLOPs when given ``num_ops``). What differs:

* No CUDA needed: the host clock (``time.perf_counter_ns``, or a ``Clock`` given to
  ``instrument.configure(clock=...)``) is read after ``torch.cuda.synchronize()`` when CUDA
  is initialised, without the sync otherwise.
* ``ThroughputTimer`` gives the original's figures (step ``start_step`` counted in, the
  total divided by ``count - 2``); ``corrected=True`` leaves out exactly the first
  ``start_step`` steps and divides by the steps it kept.
* ``ThroughputTimer.stop()`` without ``start()`` warns and goes on (the original calls
  ``exit(0)``); ``log`` of an unknown timer raises a ``KeyError`` naming the known ones.
* With ``to_registry=True`` (or :func:`instrument.compat.to_registry`) every start/stop is
  also an ``instrument`` region, so the same timings reach reporters, trees and sinks.

Example:
    >>> from instrument.compat.bing_bert import SynchronizedWallClockTimer   # was: from timer
    >>> timers = SynchronizedWallClockTimer()
    >>> timers("forward").start(); loss = model(batch); timers("forward").stop()
    >>> timers.log(["forward"])
    time (ms) | forward: 12.34
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from instrument import _state
from instrument.compat.clock import sync_device as _sync_device
from instrument.compat.errors import (
    TimerArgumentError,
    TimerStateError,
    check_count,
    check_names,
    check_normalizer,
)
from instrument.compat.feed import RegistryFeed, feeds_registry
from instrument.compat.startstop import StartStopTimer, TimerGroup
from instrument.rank import rank

__all__ = [
    "NOT_ENOUGH_STEPS",
    "PRINT_EVERY",
    "SynchronizedWallClockTimer",
    "ThroughputTimer",
    "TimerArgumentError",
    "TimerStateError",
    "print_rank_0",
]

#: What the throughput rates read before any step was timed.
NOT_ENOUGH_STEPS = -999
#: ``print_elapsed_time`` prints on every this-many-th step.
PRINT_EVERY = 1000
#: The original divides the total by ``count - 2`` whatever ``start_step`` is.
ORIGINAL_DIVISOR_OFFSET = 2


def print_rank_0(message: object) -> None:
    """Print ``message`` (flushed) on rank 0, or on every process without a process group."""
    if rank() == 0:
        print(message, flush=True)


def _seconds(ns: int) -> float:
    return ns / 1e9


class SynchronizedWallClockTimer(TimerGroup["SynchronizedWallClockTimer.Timer"]):
    """A group of named timers in seconds (bing_bert's ``SynchronizedWallClockTimer``).

    Args:
        to_registry: Also time each start/stop as an ``instrument`` region named after the
            timer ('/' becomes '.'); ``None`` follows :func:`instrument.compat.to_registry`.

    Distributed:
        Nothing is collective: ``log`` prints rank 0's own times.

    Example:
        >>> timers = SynchronizedWallClockTimer()
        >>> timers("forward").start()
        >>> loss = model(batch)
        >>> timers("forward").stop()
        >>> timers("forward").elapsed()   # seconds; resets
        0.0123
    """

    class Timer(StartStopTimer):
        """One timer: seconds summed over start/stop intervals, synchronizing CUDA at both
        ends when it is in use."""

        ALREADY_STARTED = "timer has already been started: {name!r}; stop() it before start()"

        def __init__(self, name: str, *, to_registry: bool | None = None) -> None:
            super().__init__(name, to_registry=to_registry)
            self.elapsed_ = 0.0
            self._start_ns = _state.now()
            self.start_time = _seconds(self._start_ns)

        def _start_clock(self) -> None:
            _sync_device()
            self._start_ns = _state.now()
            self.start_time = _seconds(self._start_ns)
            self.started_ = True

        def _stop_clock(self) -> None:
            _sync_device()
            self.elapsed_ += _seconds(_state.now() - self._start_ns)
            self.started_ = False

        def _total(self) -> float:
            return self.elapsed_

        def _clear(self) -> None:
            self.elapsed_ = 0.0

        def __repr__(self) -> str:
            state = "running" if self.started_ else "stopped"
            return f"<bing_bert Timer {self.name_!r} {state}, {self.elapsed_:.6f} s>"

    def _new_timer(self, name: str) -> SynchronizedWallClockTimer.Timer:
        return self.Timer(name, to_registry=self._to_registry)

    def log(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> None:
        """Print ``"time (ms) | name: x.xx | ..."`` on rank 0: each timer's elapsed time in
        milliseconds divided by ``normalizer``.

        Raises:
            KeyError: A name that is not one of these timers.
        """
        normalizer = check_normalizer(normalizer)
        wanted = check_names(names)
        unknown = [name for name in wanted if name not in self.timers]
        if unknown:
            raise KeyError(f"unknown timers {unknown}; this group holds {list(self.timers)}")
        line = "time (ms)"
        for name in wanted:
            milliseconds = self.timers[name].elapsed(reset=reset) * 1000.0 / normalizer
            line += f" | {name}: {milliseconds:.2f}"
        print_rank_0(line)

    def __repr__(self) -> str:
        return f"<bing_bert SynchronizedWallClockTimer {list(self.timers)}>"


class ThroughputTimer:
    """Samples and steps per second after ``start_step`` warm-up steps (bing_bert's
    ``ThroughputTimer``). Host time, no device synchronization.

    By default the figures are the original's: the time of every step from step
    ``start_step`` on is summed and divided by ``count - 2`` (3 steps of 1 s with the default
    ``start_step=2``: 2 s over 1 step). ``corrected=True`` sums the steps after the first
    ``start_step`` and divides by how many there are (1 s over 1 step).

    Args:
        name: Printed by :meth:`print_elapsed_time`; also the ``instrument`` region fed with
            ``to_registry`` (``"throughput"`` when ``None``).
        batch_size: Samples per step and worker.
        num_workers: Workers (data-parallel ranks) stepping together.
        start_step: Warm-up steps.
        corrected: Leave out exactly ``start_step`` steps and divide by the steps kept.
        to_registry: Also time each start/stop as an ``instrument`` region (``None``:
            follow :func:`instrument.compat.to_registry`).

    Example:
        >>> tput = ThroughputTimer(name="bert", batch_size=32, num_workers=world_size)
        >>> for batch in loader:
        ...     tput.start(); train_step(batch); tput.stop()
        ...     tput.print_elapsed_time(num_ops=flops_per_step)
        >>> tput.avg_samples_per_sec()
    """

    def __init__(
        self,
        name: str | None = None,
        batch_size: int = 1,
        num_workers: int = 1,
        start_step: int = 2,
        *,
        corrected: bool = False,
        to_registry: bool | None = None,
    ) -> None:
        if name is not None and not isinstance(name, str):
            raise TimerArgumentError(f"name must be a string or None, got {name!r}")
        if not isinstance(corrected, bool):
            raise TimerArgumentError(f"corrected must be True or False, got {corrected!r}")
        self.corrected = corrected
        self.start_time = 0.0  # host clock, seconds
        self.end_time = 0.0
        self.started = False
        self.count = 0
        self.total_elapsed_time = 0.0
        self.batch_size = check_count(batch_size, "batch_size", 1)
        self.num_workers = check_count(num_workers, "num_workers", 1)
        self.start_step = check_count(start_step, "start_step", 0)
        self.name = name
        self._start_ns = 0
        self._warned_unstarted = False
        self._feed = RegistryFeed(name or "throughput") if feeds_registry(to_registry) else None

    def start(self, cond: bool = True) -> None:
        """Start a step when ``cond`` (restarts a running one)."""
        if cond:
            self._start_ns = _state.now()
            self.start_time = _seconds(self._start_ns)
            self.started = True
            if self._feed is not None:
                self._feed.start()

    def stop(self, cond: bool = True) -> None:
        """End the step when ``cond``: count it, and add its time from step ``start_step``
        on (after step ``start_step`` with ``corrected``)."""
        if not cond:
            return
        if not self.started:
            if not self._warned_unstarted:
                self._warned_unstarted = True
                warnings.warn(
                    f"ThroughputTimer {self.name!r}: Cannot stop timer without starting; "
                    "ignored (bing_bert exits here)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        end_ns = _state.now()
        self.end_time = _seconds(end_ns)
        self.started = False
        if self._feed is not None:
            self._feed.stop()
        self.count += 1
        first_counted = self.start_step + 1 if self.corrected else self.start_step
        if self.count >= first_counted:
            self.total_elapsed_time += _seconds(end_ns - self._start_ns)

    def _seconds_per_step(self) -> float | None:
        """Seconds per step after warm-up (the original's ``total / (count - 2)``, or the
        corrected mean), or ``None`` while there is nothing to divide."""
        if self.corrected:
            divisor = self.count - self.start_step
        else:
            divisor = self.count - ORIGINAL_DIVISOR_OFFSET
        if divisor <= 0 or self.total_elapsed_time <= 0:
            return None
        return self.total_elapsed_time / divisor

    def avg_samples_per_sec(self) -> float:
        """``batch_size * num_workers`` per step time after warm-up; ``-999`` before."""
        seconds = self._seconds_per_step()
        if seconds is None:
            return NOT_ENOUGH_STEPS
        return self.batch_size * self.num_workers / seconds

    def avg_steps_per_sec(self) -> float:
        """Steps per second after warm-up; ``-999`` before."""
        seconds = self._seconds_per_step()
        return NOT_ENOUGH_STEPS if seconds is None else 1 / seconds

    def print_elapsed_time(self, num_ops: float | None = None) -> None:
        """On every 1000th step (after warm-up), print the step time in seconds and,
        with ``num_ops`` (floating-point operations per step), the TFLOP/s they give."""
        seconds = self._seconds_per_step()
        if seconds is None or self.count % PRINT_EVERY != 0:
            return
        if num_ops is None:
            print(self.name, " forward pass execution time: ", seconds)
        else:
            tflops = num_ops / (seconds * 1e12)
            print(self.name, " forward pass execution time: ", seconds, " TFlops : ", tflops)

    def __repr__(self) -> str:
        return f"<bing_bert ThroughputTimer {self.name!r} count={self.count}>"
