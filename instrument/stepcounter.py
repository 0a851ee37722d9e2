"""A reporter's steps: when each ended, which were warm-up, and when a report is due.

Calling a :class:`StepCounter` ends one step: the time since the last one goes into
:attr:`~StepCounter.times`; a step of the run's first ``warmup`` is counted as warm-up
(its samples and tokens dropped), any other adds its time to :attr:`~StepCounter.counted_ns`
and its counts (``on_counts()``, when :attr:`~StepCounter.pending` holds some); at every
multiple of ``every`` steps of the run it returns ``on_due()`` (the reporter's flush).
:meth:`~StepCounter.end_interval` starts the next interval.

It is the reporter's only part on a training step's path: ``Reporter.step()`` calls it, and
``auto``'s optimizer step calls it directly. So the C accelerator has it too
(``speedups.StepCounter``: the same state machine, fields and messages; no Python frame per
step); :func:`instrument.regions.native.step_counter` picks the class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from instrument import _state, registry
from instrument.regions import native
from instrument.registry import NodeBase

#: The largest ``every`` or ``warmup`` (the C counter keeps them in 64 bits).
LARGEST = 2**63 - 1


def check_every(every: object) -> int | None:
    if every is None:
        return None
    if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
        raise ValueError(
            f"every must be a positive int (steps between flushes) or None, got {every!r}"
        )
    if every > LARGEST:
        raise OverflowError(f"every must be at most 2**63 - 1, got {every!r}")
    return every


def _check_warmup(warmup: object) -> int:
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if warmup > LARGEST:
        raise OverflowError(f"warmup must be at most 2**63 - 1, got {warmup!r}")
    return warmup


class _PyStepCounter:
    """Ends steps (call it) and intervals (:meth:`end_interval`); see the module doc."""

    __slots__ = (
        "_counted_ns",
        "_every",
        "_last_tick",
        "_on_counts",
        "_on_due",
        "_pending",
        "_run_steps",
        "_steps",
        "_times",
        "_warm_steps",
        "_warmup",
    )

    def __init__(
        self,
        every: int | None,
        warmup: int,
        on_counts: Callable[[], object],
        on_due: Callable[[], Any],
    ) -> None:
        if not callable(on_counts) or not callable(on_due):
            raise TypeError("StepCounter(every, warmup, on_counts, on_due) needs two callables")
        self._every = check_every(every)
        self._warmup = _check_warmup(warmup)
        self._run_steps = self._steps = self._warm_steps = self._counted_ns = 0
        self._last_tick = _state.now()
        self._times = NodeBase()
        self._pending: Any = None
        self._on_counts = on_counts
        self._on_due = on_due

    @property
    def every(self) -> int | None:
        """Steps between reports (None: only on demand)."""
        return self._every

    @every.setter
    def every(self, every: int | None) -> None:
        self._every = check_every(every)

    @property
    def warmup(self) -> int:
        """Steps at the start of the run counted as warm-up."""
        return self._warmup

    @warmup.setter
    def warmup(self, warmup: int) -> None:
        self._warmup = _check_warmup(warmup)

    @property
    def steps(self) -> int:
        """Steps ended in this interval."""
        return self._steps

    @property
    def warm_steps(self) -> int:
        """Of those, the warm-up ones."""
        return self._warm_steps

    @property
    def counted_ns(self) -> int:
        """The time of the others."""
        return self._counted_ns

    @property
    def run_steps(self) -> int:
        """Steps of the earlier intervals."""
        return self._run_steps

    @property
    def pending(self) -> Any:
        """The open step's counts (the reporter's; None when there are none)."""
        return self._pending

    @pending.setter
    def pending(self, pending: Any) -> None:
        self._pending = pending

    @pending.deleter
    def pending(self) -> None:
        raise AttributeError("instrument: StepCounter.pending cannot be deleted")

    @property
    def times(self) -> NodeBase:
        """This interval's step times (its ``take()`` resets them)."""
        return self._times

    def __call__(self) -> Any:
        """End one step now: ``on_due()``'s result when a report is due, else None."""
        now = _state.now()
        thread = threading.get_ident()
        if registry.stepping_thread != thread:
            registry.stepping_thread = thread
        spent = now - self._last_tick
        self._last_tick = now
        self._times.add(spent)
        if self._run_steps + self._steps < self._warmup:
            self._warm_steps += 1
            self._pending = None
        else:
            self._counted_ns += spent
            if self._pending is not None:
                self._on_counts()
        self._steps += 1
        every = self._every
        if every is not None and (self._run_steps + self._steps) % every == 0:
            return self._on_due()
        return None

    def end_interval(self) -> int:
        """Start the next interval (the last step's time carries over): the steps of the
        ended one join the run's; returns them."""
        steps = self._steps
        self._run_steps += steps
        self._steps = self._warm_steps = self._counted_ns = 0
        return steps


StepCounter = native.step_counter(_PyStepCounter, _state, registry)
