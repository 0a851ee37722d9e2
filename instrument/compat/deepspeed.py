"""Drop-in for DeepSpeed's ``deepspeed/utils/timer.py``: change one import, keep the calls.

Same classes, signatures, units and output formats: :class:`SynchronizedWallClockTimer`
(``elapsed()`` and ``log`` in milliseconds, ``log`` printing
``"[Rank 0] time (ms) | forward: 12.34 | ..."`` on the given ranks), :class:`NoopTimer`, and
:class:`ThroughputTimer` with DeepSpeed's current signature ``(config, batch_size,
start_step=2, steps_per_output=None, monitor_memory=False, logging_fn=None)``. What differs:

* No CUDA or accelerator needed: without CUDA (or with ``instrument.configure(clock="cpu")``
  or a test ``Clock``) the timers read the host clock (``time.perf_counter_ns``).
* With CUDA, start/stop record pooled CUDA events and never wait for the device; the
  pairs are resolved when a time is read.
* Misuse raises errors that say what went wrong; ``avg_samples_per_sec()`` during warm-up
  is ``-inf`` instead of a ``ZeroDivisionError``.
* With ``to_registry=True`` (or :func:`instrument.compat.to_registry`) every start/stop is
  also an ``instrument`` region, so the same timings reach reporters, trees and sinks.

Example:
    >>> from instrument.compat.deepspeed import SynchronizedWallClockTimer
    >>> timers = SynchronizedWallClockTimer()          # was: from deepspeed.utils.timer
    >>> timers("fwd").start(); loss = model(batch); timers("fwd").stop()
    >>> timers.log(["fwd"])                            # on rank 0 of a job
    [Rank 0] time (ms) | fwd: 12.34
"""

from __future__ import annotations

import importlib
import logging
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

import torch

from instrument import _state, clocks
from instrument.compat.clock import cuda_events_usable
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
from instrument.rank import rank as _rank

__all__ = [
    "BACKWARD_GLOBAL_TIMER",
    "BACKWARD_INNER_GLOBAL_TIMER",
    "BACKWARD_INNER_MICRO_TIMER",
    "BACKWARD_MICRO_TIMER",
    "BACKWARD_REDUCE_GLOBAL_TIMER",
    "BACKWARD_REDUCE_MICRO_TIMER",
    "FORWARD_GLOBAL_TIMER",
    "FORWARD_MICRO_TIMER",
    "STEP_GLOBAL_TIMER",
    "STEP_MICRO_TIMER",
    "TIME_EPSILON",
    "NoopTimer",
    "SynchronizedWallClockTimer",
    "ThroughputTimer",
    "ThroughputTimerConfig",
    "TimerArgumentError",
    "TimerStateError",
    "trim_mean",
]

logger = logging.getLogger("instrument.compat.deepspeed")

# The timer names DeepSpeed's engine uses.
FORWARD_MICRO_TIMER = "fwd_microstep"
FORWARD_GLOBAL_TIMER = "fwd"
BACKWARD_MICRO_TIMER = "bwd_microstep"
BACKWARD_GLOBAL_TIMER = "bwd"
BACKWARD_INNER_MICRO_TIMER = "bwd_inner_microstep"
BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER = "bwd_allreduce_microstep"
BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce"
STEP_MICRO_TIMER = "step_microstep"
STEP_GLOBAL_TIMER = "step"
TIME_EPSILON = 1e-6

_GB = 1024**3


def _records_events() -> bool:
    """Whether a new timer records CUDA events: CUDA is usable here (silently the host clock
    otherwise, as DeepSpeed on a CPU accelerator) and ``clock="cpu"`` was not asked for."""
    return _state.requested_clock != "cpu" and cuda_events_usable(None)


def _check_ranks(ranks: Iterable[int] | None) -> list[int]:
    """DeepSpeed's ``ranks or [0]``: ``None`` or empty means rank 0; ``[-1]`` means every rank."""
    if ranks is None:
        return [0]
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise TimerArgumentError(f"ranks must be a list of ints or None, got {ranks!r}")
    out = list(ranks)
    if any(not isinstance(r, numbers.Integral) or isinstance(r, bool) for r in out):
        raise TimerArgumentError(f"ranks must be a list of ints or None, got {ranks!r}")
    return [int(r) for r in out] or [0]


def _print_dist(message: str, ranks: list[int]) -> None:
    """DeepSpeed's ``print_dist``: print ``"[Rank r] message"`` when there is no process group,
    when ``ranks[0] == -1``, or when this rank is in ``ranks``."""
    rank = _rank(default=-1)  # DeepSpeed prints -1 without a process group
    if rank == -1 or ranks[0] == -1 or rank in ranks:
        print(f"[Rank {rank}] {message}", flush=True)


def trim_mean(data: list[float], trim_percent: float) -> float:
    """The mean of ``data`` without its ``round(len * trim_percent)`` smallest and largest
    values (0.0 for no data), as DeepSpeed computes it."""
    if not 0.0 <= trim_percent <= 1.0:
        raise TimerArgumentError(f"trim_percent must be in [0, 1], got {trim_percent!r}")
    if not data:
        return 0.0
    n = len(data)
    k = round(n * trim_percent)
    kept = sorted(data)[k : n - k]
    return sum(kept) / len(kept) if kept else float("nan")


class SynchronizedWallClockTimer(TimerGroup["SynchronizedWallClockTimer.Timer"]):
    """A group of named timers in milliseconds (DeepSpeed's ``SynchronizedWallClockTimer``).

    Args:
        to_registry: Also time each start/stop as an ``instrument`` region named after the
            timer ('/' becomes '.'); ``None`` follows :func:`instrument.compat.to_registry`.
        log_memory: Make ``log(..., memory_breakdown=True)`` append :meth:`memory_usage` to
            the line, as older DeepSpeed releases did. By default the argument is accepted
            and ignored, as in DeepSpeed main, so the line keeps its fields.

    Distributed:
        Nothing is collective: ``log`` prints this rank's own times, on the ranks asked for.

    Example:
        >>> timers = SynchronizedWallClockTimer()
        >>> timers("fwd").start()
        >>> loss = model(batch)
        >>> timers("fwd").stop()
        >>> timers.log(["fwd"], normalizer=1)   # prints on rank 0
        [Rank 0] time (ms) | fwd: 12.34
    """

    class Timer(StartStopTimer):
        """One timer: start/stop intervals summed in milliseconds.

        With CUDA, ``start()`` and ``stop()`` record CUDA events on the current stream and
        never wait; ``elapsed()`` waits for the recorded events and sums the intervals.
        Without CUDA they read the host clock.
        """

        ALREADY_STARTED = "{name} timer has already been started; stop() it before start()"

        def __init__(self, name: str, *, to_registry: bool | None = None) -> None:
            super().__init__(name, to_registry=to_registry)
            self.use_host_timer = not _records_events()
            self.start_event: torch.cuda.Event | None = None
            self.elapsed_records: list[float] | None = None
            self.start_time = 0.0  # host clock, seconds (host timing only)
            self.end_time = 0.0
            self._start_ns = 0
            self._ms: list[float] = []  # resolved intervals
            self._pending: list[clocks.EventPair] = []  # recorded, not yet resolved

        def stop(self, reset: bool = False, record: bool = False) -> None:
            """End the interval (``reset`` and ``record`` are accepted and unused, as in
            DeepSpeed); raises :class:`TimerStateError` if not started."""
            super().stop()

        def reset(self) -> None:
            """Drop every interval and give back its CUDA events; a running timer stops
            uncounted."""
            if self.start_event is not None:
                clocks.events.release(torch.cuda.current_device(), [self.start_event])
                self.start_event = None
            self._release_pending()
            super().reset()

        def mean(self) -> float:
            """The 10 %-trimmed mean of the intervals since the last reset, in milliseconds
            (reads with ``elapsed(reset=False)``)."""
            self.elapsed(reset=False)
            return trim_mean(self.elapsed_records or [], 0.1)

        def _start_clock(self) -> None:
            if self.use_host_timer:
                self._start_ns = _state.now()
                self.start_time = self._start_ns / 1e9
            else:
                self.start_event = clocks.record_event()
            self.started_ = True

        def _stop_clock(self) -> None:
            if self.use_host_timer:
                end_ns = _state.now()
                self.end_time = end_ns / 1e9
                self._ms.append((end_ns - self._start_ns) / 1e6)
            else:
                assert self.start_event is not None
                end = clocks.record_event()
                self._pending.append((self.start_event, end, torch.cuda.current_device()))
                self.start_event = None
            self.started_ = False

        def _total(self) -> float:
            """Milliseconds, after waiting for the recorded CUDA events."""
            while self._pending:  # a pair leaves the list only once it is read and released
                self._ms.append(clocks.pair_ms(self._pending[0]))
                del self._pending[0]
            self.elapsed_records = list(self._ms)
            return sum(self._ms)

        def _clear(self) -> None:
            self.elapsed_records = None
            self._ms = []

        def _release_pending(self) -> None:
            for pair in self._pending:
                clocks.release_pair(pair)
            self._pending = []

        def __repr__(self) -> str:
            state = "running" if self.started_ else "stopped"
            return f"<deepspeed Timer {self.name_!r} {state}>"

    def __init__(self, *, to_registry: bool | None = None, log_memory: bool = False) -> None:
        super().__init__(to_registry=to_registry)
        if not isinstance(log_memory, bool):
            raise TypeError(f"log_memory must be True or False, got {log_memory!r}")
        self.log_memory = log_memory

    def _new_timer(self, name: str) -> SynchronizedWallClockTimer.Timer:
        return self.Timer(name, to_registry=self._to_registry)

    def get_timers(self) -> dict[str, SynchronizedWallClockTimer.Timer]:
        """Every timer by name."""
        return self.timers

    @staticmethod
    def memory_usage() -> str:
        """``" | mem_allocated: x GB | max_mem_allocated: ... | cache_allocated: ... |
        max_cache_allocated: ..."`` for the current CUDA device (zeros without CUDA)."""
        ready = clocks.cuda_ready()
        values = (
            ("mem_allocated", torch.cuda.memory_allocated() if ready else 0),
            ("max_mem_allocated", torch.cuda.max_memory_allocated() if ready else 0),
            ("cache_allocated", torch.cuda.memory_reserved() if ready else 0),
            ("max_cache_allocated", torch.cuda.max_memory_reserved() if ready else 0),
        )
        return "".join(f" | {label}: {value / _GB:.4f} GB" for label, value in values)

    def log(
        self,
        names: Iterable[str],
        normalizer: float = 1.0,
        reset: bool = True,
        memory_breakdown: bool = False,
        ranks: Iterable[int] | None = None,
    ) -> None:
        """Print ``"[Rank r] time (ms) | name: x.xx | ..."`` for the ``names`` this group
        holds (others are skipped), each divided by ``normalizer``, on ``ranks`` (default:
        rank 0; ``[-1]``: every rank; every process without a process group).
        ``memory_breakdown`` is ignored (DeepSpeed main) unless the group was built with
        ``log_memory=True``; then it appends :meth:`memory_usage`."""
        scale = check_normalizer(normalizer)
        wanted = check_names(names)
        on_ranks = _check_ranks(ranks)
        line = "time (ms)"
        for name in wanted:
            timer = self.timers.get(name)
            if timer is not None:
                line += f" | {name}: {timer.elapsed(reset=reset) / scale:.2f}"
        if memory_breakdown and self.log_memory:
            line += self.memory_usage()
        _print_dist(line, on_ranks)

    def get_mean(
        self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True
    ) -> dict[str, float]:
        """``{name: Timer.mean() * 1000 / normalizer}`` for the ``names`` this group holds.

        The numbers are DeepSpeed's: ``mean()`` is already in milliseconds, so these are
        microseconds. As in DeepSpeed, ``reset`` is accepted and ignored (nothing is reset).
        """
        scale = check_normalizer(normalizer)
        return {
            name: self.timers[name].mean() * 1000.0 / scale
            for name in check_names(names)
            if name in self.timers
        }

    def __repr__(self) -> str:
        return f"<deepspeed SynchronizedWallClockTimer {list(self.timers)}>"


class NoopTimer:
    """What DeepSpeed uses when ``wall_clock_breakdown`` is off: the same API, doing nothing.

    Every name gives one shared :class:`NoopTimer.Timer`; times read as 0.
    """

    class Timer:
        """A timer that records nothing."""

        def start(self) -> None:
            """Do nothing."""

        def reset(self) -> None:
            """Do nothing."""

        def stop(self, **kwargs: object) -> None:
            """Do nothing."""

        def elapsed(self, **kwargs: object) -> float:
            """Always 0."""
            return 0

        def mean(self) -> float:
            """Always 0."""
            return 0

    def __init__(self) -> None:
        self.timer = self.Timer()

    def __call__(self, name: str) -> NoopTimer.Timer:
        """The shared no-op timer, whatever ``name``."""
        return self.timer

    def get_timers(self) -> dict[str, NoopTimer.Timer]:
        """No timers: ``{}``."""
        return {}

    def log(
        self,
        names: Iterable[str],
        normalizer: float = 1.0,
        reset: bool = True,
        memory_breakdown: bool = False,
        ranks: Iterable[int] | None = None,
    ) -> None:
        """Print nothing."""

    def get_mean(self, names: Iterable[str], normalizer: float = 1.0, reset: bool = True) -> None:
        """No means: ``None``, as DeepSpeed's (its body is ``...``)."""
        return


@dataclass
class ThroughputTimerConfig:
    """The fields of DeepSpeed's ``timers.throughput`` config that :class:`ThroughputTimer`
    reads (``DeepSpeedThroughputTimerConfig``): both default to ``True``."""

    enabled: bool = True
    synchronized: bool = True  # wait for the device before reading the clock


def _as_config(config: object) -> Any:
    """``None`` -> the defaults; a mapping -> :class:`ThroughputTimerConfig`; an object with
    ``enabled`` and ``synchronized`` (DeepSpeed's ``timers_config``) as it is."""
    if config is None:
        return ThroughputTimerConfig()
    known = [field.name for field in fields(ThroughputTimerConfig)]
    if isinstance(config, Mapping):
        unknown = sorted(str(key) for key in config if key not in known)
        if unknown:
            raise TimerArgumentError(
                f"unknown ThroughputTimer config keys {unknown}; expected 'enabled', 'synchronized'"
            )
        return ThroughputTimerConfig(**config)
    missing = [name for name in known if not hasattr(config, name)]
    if missing:
        raise TypeError(
            f"config {config!r} has no {', '.join(missing)}; pass DeepSpeed's timers_config, "
            "an object or dict with 'enabled' and 'synchronized', or None"
        )
    return config


def _check_batch_size(batch_size: object) -> float:
    if batch_size is None:
        return 1
    if (
        not isinstance(batch_size, numbers.Real)
        or isinstance(batch_size, bool)
        or not float(batch_size) > 0.0
    ):
        raise TimerArgumentError(f"batch_size must be a number > 0 or None, got {batch_size!r}")
    return batch_size if isinstance(batch_size, int) else float(batch_size)


def _check_steps_per_output(steps: object) -> int | None:
    if steps is None:
        return None
    # Both wordings DeepSpeed has used are kept, so a match on either still works.
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool):
        raise TimerArgumentError(
            "steps_per_output must be a positive integer or None, "
            f"got {type(steps).__name__} {steps!r}"
        )
    if steps <= 0:
        raise TimerArgumentError(
            f"steps_per_output must be a positive integer or None, got {steps!r} "
            "(steps_per_output must be greater than 0)"
        )
    return int(steps)


def _import_psutil() -> ModuleType:
    try:
        return importlib.import_module("psutil")
    except ImportError as exc:
        raise ImportError(
            "Unable to import 'psutils', please install package: "
            "ThroughputTimer(monitor_memory=True) needs psutil (pip install psutil)"
        ) from exc


class ThroughputTimer:
    """Samples per second over training steps, skipping the first ``start_step`` global steps
    (DeepSpeed's engine ``tput_timer``).

    ``start()`` / ``stop()`` bracket each micro step; ``stop(global_step=True)`` ends an
    optimizer step. Every ``steps_per_output`` global steps the running and current
    samples/s go to ``logging_fn``.

    Args:
        config: DeepSpeed's ``timers_config`` (or any object with ``enabled`` and
            ``synchronized``), a dict of those, or ``None`` (both ``True``).
        batch_size: Samples per global step (DeepSpeed passes ``train_batch_size``);
            ``None`` counts 1.
        start_step: Global steps left out as warm-up.
        steps_per_output: Report every this many global steps (``None``: never).
        monitor_memory: Also report virtual memory and swap use (needs ``psutil``).
        logging_fn: Where reports go (default: ``logging.getLogger(
            "instrument.compat.deepspeed").info``).
        name: The ``instrument`` region fed with ``to_registry``.
        to_registry: Also time each start/stop as an ``instrument`` region (``None``:
            follow :func:`instrument.compat.to_registry`).

    Example:
        >>> tput = ThroughputTimer(None, batch_size=32, steps_per_output=50, logging_fn=print)
        >>> for batch in loader:
        ...     tput.start(); train_step(batch); tput.stop(global_step=True)
        >>> tput.avg_samples_per_sec()
    """

    def __init__(
        self,
        config: object,
        batch_size: float | None,
        start_step: int = 2,
        steps_per_output: int | None = None,
        monitor_memory: bool = False,
        logging_fn: Callable[[str], object] | None = None,
        *,
        name: str = "throughput",
        to_registry: bool | None = None,
    ) -> None:
        check_count(start_step, "start_step", 0)
        if logging_fn is not None and not callable(logging_fn):
            raise TypeError(f"logging_fn must be callable or None, got {logging_fn!r}")
        self.config: Any = _as_config(config)
        self.start_time = 0.0  # host clock, seconds
        self.end_time = 0.0
        self.started = False
        self.batch_size = _check_batch_size(batch_size)
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0
        self.steps_per_output = _check_steps_per_output(steps_per_output)
        self.monitor_memory = monitor_memory
        self.logging: Callable[[str], object] = logging_fn or logger.info
        self.initialized = False
        self._psutil = _import_psutil() if monitor_memory else None
        self._counting = False  # whether the running interval is past warm-up
        self._start_ns = 0
        self._feed = RegistryFeed(name) if feeds_registry(to_registry) else None

    def update_epoch_count(self) -> None:
        """Start a new epoch: count it, and restart the micro-step count."""
        self.epoch_count += 1
        self.micro_step_count = 0

    def _init_timer(self) -> None:
        self.initialized = True

    def start(self) -> None:
        """Start a micro step (restarts a running one); the clock is read only after
        warm-up, after waiting for the device when ``config.synchronized``."""
        if not self.config.enabled:
            return
        self._init_timer()
        self.started = True
        self._counting = self.global_step_count >= self.start_step
        if self._counting:
            if self.config.synchronized:
                _sync_device()
            self._start_ns = _state.now()
            self.start_time = self._start_ns / 1e9
        if self._feed is not None:
            self._feed.start()

    def _is_report_boundary(self) -> bool:
        if self.steps_per_output is None:
            return False
        if self.steps_per_output <= 0:  # changed after construction
            raise TimerArgumentError(
                f"steps_per_output must be a positive integer, got {self.steps_per_output!r} "
                "(it was changed after the ThroughputTimer was built)"
            )
        return self.global_step_count % self.steps_per_output == 0

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """End the micro step (``global_step``: it ended an optimizer step); counts its time
        after warm-up and reports on every ``steps_per_output``-th global step when
        ``report_speed``. A stop without a start does nothing."""
        if not self.config.enabled or not self.started:
            return
        self.started = False
        if self._feed is not None:
            self._feed.stop()
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if not self._counting:
            return
        if self.config.synchronized:
            _sync_device()
        end_ns = _state.now()
        self.end_time = end_ns / 1e9
        duration = (end_ns - self._start_ns) / 1e9
        self.total_elapsed_time += duration
        self.step_elapsed_time += duration
        if global_step:
            if report_speed and self._is_report_boundary():
                self._report()
            self.step_elapsed_time = 0.0

    def _report(self) -> None:
        ready = clocks.cuda_ready()
        allocated = torch.cuda.memory_allocated() if ready else 0
        max_allocated = torch.cuda.max_memory_allocated() if ready else 0
        where = (
            f"epoch={self.epoch_count}/micro_step={self.micro_step_count}"
            f"/global_step={self.global_step_count}"
        )
        self.logging(
            f"{where}, RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
            f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + TIME_EPSILON)}, "
            f"MemAllocated={round(allocated / _GB, 2)}GB, "
            f"MaxMemAllocated={round(max_allocated / _GB, 2)}GB"
        )
        if self._psutil is not None:
            virtual, swap = self._psutil.virtual_memory(), self._psutil.swap_memory()
            self.logging(f"{where}, vm %: {virtual.percent}, swap %: {swap.percent}")

    def avg_samples_per_sec(self) -> float:
        """``batch_size`` over the mean time of the global steps after warm-up; ``-inf``
        until one has been timed."""
        timed_steps = self.global_step_count - self.start_step
        if self.global_step_count > 0 and timed_steps > 0 and self.total_elapsed_time > 0:
            return self.batch_size / (self.total_elapsed_time / timed_steps)
        return float("-inf")

    def __repr__(self) -> str:
        return (
            f"<deepspeed ThroughputTimer global_step={self.global_step_count} "
            f"micro_step={self.micro_step_count}>"
        )
