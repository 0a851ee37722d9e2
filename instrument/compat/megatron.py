"""Drop-in for Megatron-LM's ``megatron/core/timers.py`` and NeMo Automodel's
``nemo_automodel/components/training/timers.py``: change one import, keep the calls.

Same classes, signatures, units (seconds from ``elapsed()``, milliseconds in the log
strings, seconds in TensorBoard) and output formats. As in Megatron core >= 0.16,
``Timers.log()`` sends its text to ``logging.getLogger("megatron.core.timers")`` at INFO
(``Timers(..., log_to="print")`` prints it as core <= 0.15 does;
:mod:`instrument.compat.nemo` prints by default, as NeMo Automodel does). What differs:

* No CUDA needed: the host clock (``time.perf_counter_ns``, or a ``Clock`` given to
  ``instrument.configure(clock=...)``) is read after ``torch.cuda.synchronize()`` when
  CUDA is initialised, without the sync otherwise.
* No process group needed: without one the job is a single rank (rank 0 of 1).
* ``barrier=True`` waits at most ``barrier_timeout`` (a timeout is logged, never a hang).
* Ranks may hold different timers: the union of names is exchanged first, and a timer a
  rank does not hold is *absent* for that rank, never read as 0 and never a hang.
* With ``to_registry=True`` (or :func:`instrument.compat.to_registry`) each timer is also a
  region of the ``instrument`` timing tree, so the same timings reach reporters and sinks.

Example:
    >>> from instrument.compat.megatron import Timers   # was: from megatron.core.timers
    >>> timers = Timers(log_level=2, log_option="minmax")
    >>> with timers("forward-backward", log_level=1):
    ...     loss = train_step(batch)
    >>> timers.log(["forward-backward"], normalizer=log_interval)
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # typing.Self is Python 3.11+; annotations only, so no runtime import
    from typing_extensions import Self

from instrument import _state, checks
from instrument.compat.clock import sync_device as _sync_device
from instrument.compat.errors import (
    TimerArgumentError,
    TimerStateError,
    check_names,
    check_normalizer,
    check_timer_name,
)
from instrument.compat.feed import RegistryFeed, feeds_registry
from instrument.distributed.barrier import barrier_with_timeout
from instrument.distributed.gather import active, gather_totals, union_of_paths
from instrument.hooks.collectives import suppressed
from instrument.rank import rank_and_world
from instrument.regions.timed import BARRIER_TIMEOUT

__all__ = [
    "DummyTimer",
    "Timer",
    "TimerArgumentError",
    "TimerBase",
    "TimerStateError",
    "Timers",
]

logger = logging.getLogger("instrument")
#: Where Megatron core >= 0.16 sends the text of ``Timers.log()`` (its module's logger).
timers_logger = logging.getLogger("megatron.core.timers")

LOG_OPTIONS = ("max", "minmax", "all")
LOG_TO = ("logger", "print")
MAX_LOG_LEVEL = 2


def _barrier(group: Any, timeout: timedelta | float) -> bool:
    """Megatron's ``torch.distributed.barrier(group)``, but never longer than ``timeout``."""
    return barrier_with_timeout(timeout, group)


class TimerBase(ABC):
    """Timer base class: a context manager that starts on enter and stops on exit.

    Example:
        >>> with timers("optimizer").with_barrier():   # barrier at start and stop
        ...     optimizer.step()
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._context_barrier = False

    def with_barrier(self, barrier: bool = True) -> Self:
        """Use ``barrier`` in the next ``with`` block; returns ``self`` for chaining."""
        self._context_barrier = barrier
        return self

    def __enter__(self) -> Self:
        self.start(barrier=self._context_barrier)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop(barrier=self._context_barrier)
        self._context_barrier = False

    @abstractmethod
    def start(self, barrier: bool = False) -> None:
        """Start the timer (after a barrier over the ranks when ``barrier``)."""

    @abstractmethod
    def stop(self, barrier: bool = False) -> None:
        """Stop the timer (after a barrier over the ranks when ``barrier``)."""

    @abstractmethod
    def reset(self) -> None:
        """Zero the elapsed time."""

    @abstractmethod
    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Seconds timed so far; a running timer keeps running."""

    @abstractmethod
    def active_time(self) -> float:
        """Seconds the timer has run in total, across resets."""


_DUMMY_MESSAGE = (
    "should not be used to calculate elapsed time, check if timer's log_level <= self._log_level."
)


class DummyTimer(TimerBase):
    """What ``Timers(...)(name, log_level)`` returns above the configured level: start, stop
    and reset do nothing; reading a time raises ``RuntimeError``."""

    def __init__(self) -> None:
        super().__init__("dummy timer")

    def start(self, barrier: bool = False) -> None:
        """Do nothing."""

    def stop(self, barrier: bool = False) -> None:
        """Do nothing."""

    def reset(self) -> None:
        """Do nothing."""

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Raise: a disabled timer has no time."""
        raise RuntimeError(f"dummy timer {_DUMMY_MESSAGE}")

    def active_time(self) -> float:
        """Raise: a disabled timer has no time."""
        raise RuntimeError(f"active timer {_DUMMY_MESSAGE}")


class Timer(TimerBase):
    """A start/stop timer in seconds on the host clock, synchronizing CUDA when it is in use.

    ``barrier=True`` waits for every rank of the barrier group (default: the world) before
    reading the clock, for at most ``barrier_timeout``; without a process group it does
    nothing. Unlike Megatron, a rank that never arrives makes the others log a warning and
    go on instead of hanging.

    Args:
        name: The timer's name.
        to_registry: Also time each start/stop as an ``instrument`` region named ``name``
            ('/' becomes '.'); ``None`` follows :func:`instrument.compat.to_registry`.
        barrier_timeout: The longest a barrier waits (``timedelta`` or seconds).
    """

    def __init__(
        self,
        name: str,
        *,
        to_registry: bool | None = None,
        barrier_timeout: timedelta | float = BARRIER_TIMEOUT,
    ) -> None:
        super().__init__(check_timer_name(name))
        self._elapsed = 0.0
        self._active_time = 0.0
        self._started = False
        self._start_ns = 0
        self._barrier_group: Any = None
        self._barrier_timeout = checks.check_timeout("barrier_timeout", barrier_timeout)
        self._feed = RegistryFeed(name) if feeds_registry(to_registry) else None

    def set_barrier_group(self, barrier_group: Any) -> None:
        """Use ``barrier_group`` (a ``ProcessGroup``; ``None``: the world) for barriers."""
        self._barrier_group = barrier_group

    def start(self, barrier: bool = False) -> None:
        """Start timing; raises :class:`TimerStateError` if already started."""
        if self._started:
            raise TimerStateError(
                f"timer has already been started ({self.name!r}); stop() it before start()"
            )
        self._start_clock(barrier)
        if self._feed is not None:
            self._feed.start()

    def stop(self, barrier: bool = False) -> None:
        """Stop timing and add the time; raises :class:`TimerStateError` if not started."""
        if not self._started:
            raise TimerStateError(f"timer is not started ({self.name!r}); start() it before stop()")
        self._stop_clock(barrier)
        if self._feed is not None:
            self._feed.stop()

    def reset(self) -> None:
        """Zero the elapsed time (not :meth:`active_time`); a running timer stops uncounted."""
        self._elapsed = 0.0
        if self._started:
            self._started = False
            if self._feed is not None:
                self._feed.stop()

    def set_elapsed(self, value: float) -> None:
        """Set the elapsed seconds directly (a time measured elsewhere, reported by ``log``)."""
        self._elapsed = float(value)

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Seconds timed since the last reset; then zero them when ``reset``.

        A running timer is stopped, read and started again (Megatron's behaviour), so the
        time up to now counts and the timer keeps running.
        """
        running = self._started
        if running:
            self._stop_clock(barrier)
        seconds = self._elapsed
        if reset:
            self._elapsed = 0.0
        if running:
            self._start_clock(barrier)
        return seconds

    def active_time(self) -> float:
        """Seconds the timer has run in total, across resets."""
        return self._active_time

    def _start_clock(self, barrier: bool) -> None:
        if barrier:
            _barrier(self._barrier_group, self._barrier_timeout)
        _sync_device()
        self._start_ns = _state.now()
        self._started = True

    def _stop_clock(self, barrier: bool) -> None:
        if barrier:
            _barrier(self._barrier_group, self._barrier_timeout)
        _sync_device()
        seconds = (_state.now() - self._start_ns) / 1e9
        self._elapsed += seconds
        self._active_time += seconds
        self._started = False

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"<megatron Timer {self.name!r} {state}, {self._elapsed:.6f} s>"


class _AcrossRanks(NamedTuple):
    """Seconds per timer and rank: ``seconds[i][j]`` is ``ranks[i]``'s time for ``names[j]``
    (``None``: that rank does not hold the timer, or it did not run since its last reset)."""

    names: list[str]
    ranks: list[int]
    seconds: list[list[float | None]]

    def present(self, j: int) -> list[tuple[int, float]]:
        """``(rank, seconds)`` of the ranks that have a time for ``names[j]``."""
        out: list[tuple[int, float]] = []
        for rank, row in zip(self.ranks, self.seconds, strict=True):
            value = row[j]
            if value is not None:
                out.append((rank, value))
        return out


class Timers:
    """A group of named timers with levels, logged across ranks (Megatron's ``Timers``).

    Args:
        log_level: Timers above this level (0, 1 or 2) are :class:`DummyTimer`\\ s.
        log_option: Across ranks, "max" (the slowest rank), "minmax" or "all" (each rank).
        log_to: Where :meth:`log` sends its text: ``"logger"`` (Megatron core >= 0.16:
            ``logging.getLogger("megatron.core.timers").info``) or ``"print"`` (core <= 0.15
            and NeMo Automodel: ``print(..., flush=True)``).
        to_registry: Also feed each timer's start/stop to the ``instrument`` registry
            (``None``: follow :func:`instrument.compat.to_registry`).
        barrier_timeout: The longest any barrier of these timers waits.

    Distributed:
        ``log``, ``write``, ``write_to_wandb`` and ``get_all_timers_string`` are collective
        once a process group of several ranks is running: call them on every rank of the
        world (as with Megatron). The ranks may pass or hold different timer names.

    Example:
        >>> timers = Timers(log_level=1, log_option="max")
        >>> timers("interval-time", log_level=0).start(barrier=True)
        >>> with timers("forward-backward", log_level=1):
        ...     ...
        >>> timers.log(["forward-backward"], normalizer=10)
    """

    def __init__(
        self,
        log_level: int,
        log_option: str,
        *,
        log_to: str = "logger",
        to_registry: bool | None = None,
        barrier_timeout: timedelta | float = BARRIER_TIMEOUT,
    ) -> None:
        self._log_level = _check_level(log_level, "log_level")
        if log_to not in LOG_TO:
            raise TimerArgumentError(f"log_to must be 'logger' or 'print', got {log_to!r}")
        self._log_to = log_to
        if log_option not in LOG_OPTIONS:
            raise TimerArgumentError(
                f"input log option {log_option!r} is invalid; expected one of 'max', 'minmax', "
                "'all'"
            )
        self._log_option = log_option
        self._to_registry = feeds_registry(to_registry)
        self._barrier_timeout = checks.check_timeout("barrier_timeout", barrier_timeout)
        self._timers: dict[str, Timer] = {}
        self._log_levels: dict[str, int] = {}
        self._dummy_timer = DummyTimer()
        self._max_log_level = MAX_LOG_LEVEL

    def __call__(self, name: str, log_level: int | None = None, barrier: bool = False) -> TimerBase:
        """The timer ``name`` (created at ``log_level``, default 2, on first use), or the
        shared :class:`DummyTimer` when that level is above the configured one.
        ``barrier=True`` makes its next ``with`` block use barriers."""
        timer: TimerBase
        if name in self._timers:
            if log_level is not None and log_level != self._log_levels[name]:
                raise TimerArgumentError(
                    f"input log level {log_level!r} does not match already existing log level "
                    f"{self._log_levels[name]} for {name!r} timer"
                )
            timer = self._timers[name]
        else:
            level = self._max_log_level if log_level is None else log_level
            if _check_level(level, "log_level") > self._log_level:
                timer = self._dummy_timer
            else:
                timer = Timer(
                    name, to_registry=self._to_registry, barrier_timeout=self._barrier_timeout
                )
                self._timers[name] = timer
                self._log_levels[name] = level
        return timer.with_barrier(barrier) if barrier else timer

    # -- across ranks ----------------------------------------------------------------------

    def _elapsed_across_ranks(
        self, names: Iterable[str] | None, reset: bool, barrier: bool
    ) -> _AcrossRanks:
        """Read (and with ``reset`` zero) the timers, then gather them over the world.

        Every rank must call it. Names are the union of the ranks' ``names`` (default: the
        timers each holds); each rank reads only the timers it was asked for, and has
        ``None`` where it was not asked, does not hold the timer, or the timer did not run
        since its reset (Megatron's ``> 0`` filter). A failed barrier or gather leaves this
        rank's own times only.
        """
        together = _barrier(None, self._barrier_timeout) if barrier else True
        wanted = list(self._timers) if names is None else check_names(names)
        local: dict[str, float] = {}
        for name in wanted:
            timer = self._timers.get(name)
            if timer is not None:
                seconds = timer.elapsed(reset=reset)
                if seconds > 0.0:
                    local[name] = seconds
        if together and active():
            try:
                with suppressed():
                    union = union_of_paths(wanted)
                    if not union:  # no rank holds or asks for a timer: nothing to gather
                        return _AcrossRanks([], [], [])
                    rows = gather_totals([local.get(name) for name in union])
                return _AcrossRanks(union, list(range(len(rows))), rows)
            except Exception as exc:  # a broken group must not take training down
                logger.warning(
                    "instrument: Timers could not gather across ranks (%s: %s); "
                    "reporting this rank's times only",
                    type(exc).__name__,
                    exc,
                )
        elif not together:
            logger.warning("instrument: Timers barrier failed; reporting this rank's times only")
        return _AcrossRanks(wanted, [rank_and_world()[0]], [[local.get(name) for name in wanted]])

    def _get_global_min_max_time(
        self, names: Iterable[str] | None, reset: bool, barrier: bool, normalizer: float
    ) -> dict[str, tuple[float, float]]:
        """Per timer that ran on some rank: (min, max) over those ranks, divided by
        ``normalizer``."""
        gathered = self._elapsed_across_ranks(names, reset, barrier)
        out: dict[str, tuple[float, float]] = {}
        for j, name in enumerate(gathered.names):
            times = [seconds for _, seconds in gathered.present(j)]
            if times:
                out[name] = (min(times) / normalizer, max(times) / normalizer)
        return out

    def _min_max_string(
        self, names: Iterable[str] | None, reset: bool, barrier: bool, normalizer: float
    ) -> str | None:
        times = self._get_global_min_max_time(names, reset, barrier, normalizer)
        if not times:
            return None
        max_only = self._log_option == "max"
        lines = [
            "max time across ranks (ms):" if max_only else "(min, max) time across ranks (ms):"
        ]
        for name, (low, high) in times.items():
            label = (name + " ").ljust(48, ".")
            value = f"{high:.2f}" if max_only else f"({low:.2f}, {high:.2f})"
            lines.append(f"    {label}: {value}")
        return "\n".join(lines)

    def _all_ranks_string(
        self, names: Iterable[str] | None, reset: bool, barrier: bool, normalizer: float
    ) -> str | None:
        gathered = self._elapsed_across_ranks(names, reset, barrier)
        lines = ["times across ranks (ms):"]
        for j, name in enumerate(gathered.names):
            per_rank = gathered.present(j)
            if per_rank:
                lines.append(f"  {name}:")
                lines.extend(f"     rank {rank:2d}: {t / normalizer:.2f}" for rank, t in per_rank)
        return "\n".join(lines) if len(lines) > 1 else None

    # -- output ----------------------------------------------------------------------------

    def get_all_timers_string(
        self,
        names: Iterable[str] | None = None,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> str | None:
        """The log text for ``names`` (``None``: every timer of any rank), in ms divided by
        ``normalizer`` — or ``None`` when no timer ran. Collective (see the class note)."""
        scale = check_normalizer(normalizer) / 1000.0
        if self._log_option == "all":
            return self._all_ranks_string(names, reset, barrier, scale)
        return self._min_max_string(names, reset, barrier, scale)

    def log(
        self,
        names: Iterable[str] | None,
        rank: int | None = None,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> None:
        """Log :meth:`get_all_timers_string` on ``rank`` (default: the last rank), e.g.
        with ``normalizer`` set to the logging interval for per-step times: at INFO to the
        ``megatron.core.timers`` logger, or printed (flushed) with ``Timers(log_to="print")``."""
        own_rank, world = rank_and_world()
        if rank is None:
            rank = world - 1
        elif not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
            raise TimerArgumentError(f"rank must be an int in [0, {world - 1}], got {rank!r}")
        text = self.get_all_timers_string(names, normalizer, reset, barrier)
        if rank == own_rank and text is not None:
            if self._log_to == "print":
                print(text, flush=True)
            else:
                timers_logger.info(text)

    def write(
        self,
        names: Iterable[str] | None,
        writer: Any,
        iteration: int,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> None:
        """Write each timer's maximum over ranks, in seconds divided by ``normalizer``, as
        ``"<name>-time"`` at step ``iteration``: ``writer.add_scalar`` for a TensorBoard
        ``SummaryWriter``, ``writer.log`` for the ``wandb`` module or a wandb run. A ``None``
        writer writes nothing (ranks without a writer still take part in the gather)."""
        times = self._get_global_min_max_time(names, reset, barrier, check_normalizer(normalizer))
        if writer is None:
            return
        if callable(getattr(writer, "add_scalar", None)):
            for name, (_, high) in times.items():
                writer.add_scalar(f"{name}-time", high, iteration)
        elif callable(getattr(writer, "log", None)):
            _log_to_wandb(writer, times, iteration)
        else:
            raise TypeError(
                f"writer {writer!r} has neither add_scalar() (a TensorBoard SummaryWriter) "
                "nor log() (wandb or a wandb run)"
            )

    def write_to_wandb(
        self,
        names: Iterable[str] | None,
        writer: Any,
        iteration: int,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> None:
        """Like :meth:`write`, always through ``writer.log`` (wandb or a wandb run)."""
        times = self._get_global_min_max_time(names, reset, barrier, check_normalizer(normalizer))
        if writer is None:
            return
        if not callable(getattr(writer, "log", None)):
            raise TypeError(f"writer {writer!r} has no log(); pass wandb or a wandb run")
        _log_to_wandb(writer, times, iteration)


def _log_to_wandb(writer: Any, times: dict[str, tuple[float, float]], iteration: int) -> None:
    for name, (_, high) in times.items():
        writer.log({f"{name}-time": high}, iteration)  # the step positional, as upstream


def _check_level(level: object, what: str) -> int:
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise TimerArgumentError(f"{what} must be 0, 1 or 2, got {level!r}")
    if level > MAX_LOG_LEVEL:  # Megatron's own words first: code matches on them
        raise TimerArgumentError(
            f"log level {level} is larger than max supported log level {MAX_LOG_LEVEL}; "
            f"{what} must be 0, 1 or 2"
        )
    return level
