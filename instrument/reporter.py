"""The Reporter: when to flush, and the flush pipeline.

``flush()`` = collect every path's statistics (resetting them) → resolve device events →
build the tree with self times → normalize → filter by level → one frozen
:class:`~instrument.report.Report` → each sink in turn.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import torch

from instrument import (
    _state,
    checks,
    clocks,
    config,
    lifecycle,
    observe,
    registry,
    selfcost,
    throughput,
)
from instrument import peak_flops as peaks
from instrument._frozen import replaced, unchecked
from instrument._warn import deprecated, warn_once
from instrument.diagnosis import Diagnosis, RunSummary, Thresholds
from instrument.distributed import agree
from instrument.distributed.across import CrossRank
from instrument.distributed.barrier import barrier_with_timeout
from instrument.interval import build_report
from instrument.lifecycle import live_reporters as live_reporters
from instrument.memory import MemorySampler
from instrument.regions import frames
from instrument.regions.region import check_level
from instrument.report import FLUSH_ROW, Report, SelfCost
from instrument.sinks.adapt import as_sink, as_sinks
from instrument.sinks.base import Sink
from instrument.sinks.console import Console
from instrument.stepcounter import StepCounter, check_every
from instrument.throughput import Throughput

T = TypeVar("T")

logger = logging.getLogger("instrument")
#: The flush's own event in a trace (``ChromeTrace``).
FLUSH_SPAN = observe.TraceLabel(FLUSH_ROW, FLUSH_ROW)

#: The modes of ``Reporter(ranks=...)``; "max" is a deprecated spelling of "minmax".
RANKS = ("local", "minmax", "all")
INF = float("inf")
PEAK_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def step(samples: int | None = None, tokens: int | None = None) -> None:
    """Mark the end of one training iteration on every live reporter.

    Counts are optional: the samples and tokens this step consumed, for throughput.
    """
    for reporter in live_reporters():
        step_from_user(reporter, samples, tokens)


def count(samples: int | None = None, tokens: int | None = None) -> None:
    """Add samples and tokens to the current step of every live reporter, without ending it
    (for loops whose steps are ended elsewhere, e.g. by ``instrument.auto``'s optimizer
    hook). May be called several times per step (gradient accumulation)."""
    for reporter in live_reporters():
        reporter.count_into_step(samples, tokens)


def check_normalizer(normalizer: object) -> float | str:
    if normalizer == "steps":
        return "steps"
    if isinstance(normalizer, bool) or not isinstance(normalizer, numbers.Real):
        raise ValueError(f"unknown normalizer {normalizer!r}; expected a number > 0 or 'steps'")
    if not 0.0 < float(normalizer) < float("inf"):
        raise ValueError(f"normalizer must be a finite number > 0, got {normalizer!r}")
    return float(normalizer)


def _check_count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    return int(value)


def check_flops(flops: object) -> float | str | None:
    if flops is None or flops == "auto":
        return "auto" if flops == "auto" else None
    if isinstance(flops, bool) or not isinstance(flops, numbers.Real) or not 0 < float(flops) < INF:
        raise ValueError(f"flops_per_step must be a number > 0, 'auto' or None, got {flops!r}")
    return float(flops)


def check_peak_flops(peak: object) -> None:
    if peak is not None and (
        isinstance(peak, bool) or not isinstance(peak, numbers.Real) or not 0 < float(peak) < INF
    ):
        raise ValueError(f"peak_flops must be a number > 0 or None, got {peak!r}")


def _check_rank_timeout(timeout: object) -> float:
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        seconds = float("nan")
    if not 0 < float(seconds) < INF:
        raise ValueError(
            f"rank_timeout must be a positive number of seconds or a timedelta, got {timeout!r}"
        )
    return float(seconds)


def _check_threshold(threshold: object) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise ValueError(f"straggler_threshold must be a number in (0, 1], got {threshold!r}")
    if not 0.0 < float(threshold) <= 1.0:
        raise ValueError(f"straggler_threshold must be a number in (0, 1], got {threshold!r}")
    return float(threshold)


def _check_intervals(intervals: object) -> int:
    if isinstance(intervals, bool) or not isinstance(intervals, int) or intervals < 1:
        raise ValueError(f"straggler_intervals must be an int >= 1, got {intervals!r}")
    return intervals


def check_ranks(ranks: object) -> str:
    """A reporter's ``ranks`` mode: "local", "minmax" or "all" ("max" warns and is "minmax")."""
    if ranks == "max":
        deprecated('ranks="max"', 'ranks="minmax" (the same report)')
        return "minmax"
    if ranks not in RANKS:
        raise ValueError(f"unknown ranks {ranks!r}; expected one of 'local', 'minmax', 'all'")
    return str(ranks)


class Reporter:
    """Flushes the timing registry every ``every`` steps into a :class:`Report` for its sinks.

    Args:
        every: Flush at each multiple of this many ``step()`` ticks of the run (also after a
            flush of your own); ``None`` flushes only on demand.
        sinks: Objects with ``write(report)`` or plain callables taking a report; default:
            the console (``[instrument.sinks.Console()]``); ``[]`` for none.
        normalizer: A number divides every time (Megatron semantics); ``"steps"`` gives
            per-step totals (``total`` and ``self`` divided by the steps in the interval;
            per-call statistics stay per call). Counts are never divided.
        level: Leave regions above this level (and what is below them) out of reports.
        ranks: "local" (this process). "minmax" adds each region's min, max, mean and
            slowest rank across the process group; "all" also keeps each rank's value. Both
            combine ranks once a process group is running; in one process they equal "local".
        warmup: Steps at the start of the run left out of throughput (not of the timers);
            default ``min(2, every - 1)``, so the first report still has rates.
        flops_per_step: FLOPs one step runs on this device, for TFLOP/s and MFU; ``"auto"``
            measures them once (``instrument.auto`` does it on the second step, or wrap one
            step in :meth:`measure_flops`).
        peak_flops: The device's peak FLOP/s for MFU; default: looked up for the current CUDA
            device in ``instrument.peak_flops`` for ``peak_dtype`` (``None`` if unknown).
        peak_dtype: "bf16" (default), "fp16", "tf32", "fp32" or "fp8", for that lookup.
        memory: Sample host and device memory (current and interval peaks) at each flush.
        group: The process group ``ranks`` combines over (default: the world). With
            ``ranks`` other than "local" and a group of several ranks, ``flush()`` is
            collective: every rank of the group must call it (as with Megatron's ``log``).
        barrier: Wait at a barrier of ``barrier_group`` (default: the world) before each
            flush, for at most ``barrier_timeout``; a timeout is logged with the missing
            ranks and the flush goes on.
        rank_timeout: How long a cross-rank flush waits for every rank of ``group`` to
            reach the same interval before it reports this rank alone (naming the missing
            or out-of-step ranks); never raises, the next flush tries again.
        straggler_threshold: A rank whose relative score in a region (fastest rank's time
            / its time) stays below this for ``straggler_intervals`` consecutive
            intervals is named on the report's ``stragglers:`` line (default 0.8 and 3).
        diagnose: Give each report its findings (``report.findings``: the verdict first,
            see docs/diagnosis.md) and the sinks a summary of the run at :meth:`close`;
            a :class:`~instrument.diagnosis.Thresholds` sets the rules' thresholds, and
            ``False`` turns it off.

    Example:
        >>> reporter = instrument.Reporter(every=50, sinks=[instrument.sinks.Console()])
        >>> for batch in loader:
        ...     train_step(batch)
        ...     instrument.step()          # every 50 steps: a tree on stdout
        >>> reporter.close()
    """

    def __init__(
        self,
        every: int | None = 50,
        sinks: Iterable[Any] | None = None,
        normalizer: float | str = 1.0,
        level: int | None = None,
        ranks: str = "local",
        *,
        warmup: int | None = None,
        flops_per_step: float | str | None = None,
        peak_flops: float | None = None,
        peak_dtype: str = "bf16",
        memory: bool = True,
        group: Any = None,
        barrier: bool = False,
        barrier_group: Any = None,
        barrier_timeout: timedelta | float = timedelta(seconds=60),
        rank_timeout: timedelta | float = timedelta(seconds=60),
        straggler_threshold: float = 0.8,
        straggler_intervals: int = 3,
        diagnose: bool | Thresholds = True,
    ) -> None:
        every = check_every(every)
        #: Set by ``instrument.auto``: its optimizer hook ends the steps, so
        #: ``instrument.step()`` only adds counts (see :func:`step_from_user`).
        self.ticked_by_optimizer = False
        self.rank_timeout = _check_rank_timeout(rank_timeout)
        self.straggler_threshold = _check_threshold(straggler_threshold)
        self.straggler_intervals = _check_intervals(straggler_intervals)
        self._cross: CrossRank | None = None
        self.group = checks.check_process_group("group", group)
        self.barrier = checks.check_bool("barrier", barrier)
        self.barrier_group = checks.check_process_group("barrier_group", barrier_group)
        self.barrier_timeout = checks.check_timeout("barrier_timeout", barrier_timeout)
        if warmup is None:
            warmup = 2 if every is None else min(2, every - 1)
        # the steps: when each ended, which were warm-up, when a flush is due
        self._counter = StepCounter(
            every,
            _check_count("warmup", warmup) or 0,
            _weakly(self._add_counts),
            _weakly(self._due),
        )
        self.flops_per_step = check_flops(flops_per_step)
        check_peak_flops(peak_flops)
        if peak_dtype not in PEAK_DTYPES:
            raise ValueError(
                f"unknown peak_dtype {peak_dtype!r}; expected one of 'fp32', 'tf32', 'bf16', "
                "'fp16', 'fp8'"
            )
        self.peak_flops = None if peak_flops is None else float(peak_flops)
        self.peak_dtype = peak_dtype
        self._memory = MemorySampler() if checks.check_bool("memory", memory) else None
        self.normalizer = check_normalizer(normalizer)
        if level is not None:
            check_level(level)
        self.level = level
        self.ranks = check_ranks(ranks)
        # the n-th reporter of this process that combines ranks meets the n-th of the others
        self._channel = "" if self.ranks == "local" else lifecycle.cross_rank_channel()
        self._sinks: tuple[Sink, ...] = as_sinks([Console()] if sinks is None else sinks)
        self._diagnosis = _check_diagnose(diagnose)
        self._failed: set[int] = set()
        self._lock = lifecycle.ForkSafeLock()
        self._index = 0
        self._closed = False
        self._local_close = False  # a close that waits for no other rank (at exit, on an error)
        self._last_flush_ns = 0  # the previous flush's own time, for the next self-cost
        self._flush_in_steps_ns = 0  # the previous flush with its barrier, if in the steps
        # its own interval of every record, beside any other reporter (its first: from now)
        self._reader = registry.add_reader(registry.open_calls(frames.get_top()))
        self._start_interval()
        config.refresh_auto_clock()
        lifecycle.track(self)

    def _start_interval(self) -> None:
        """Begin a new interval: no counts yet (the steps' counter starts its own; the open
        step's counts and the last tick carry over: a step spans the flush)."""
        self._samples: int | None = None  # what they counted (None: nothing)
        self._tokens: int | None = None
        self._start_wall = clocks.wall_time()
        self._start_ns = _state.now()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks, in the order they receive each report."""
        return self._sinks

    def add_sink(self, sink: Any) -> None:
        """Append a sink."""
        adapted = as_sink(sink)
        with self._lock:
            self._sinks = (*self._sinks, adapted)

    @property
    def every(self) -> int | None:
        """Flush at each multiple of this many steps of the run (None: only on demand)."""
        return self._counter.every  # type: ignore[no-any-return]

    @every.setter
    def every(self, every: int | None) -> None:
        self._counter.every = every

    @property
    def warmup(self) -> int:
        """Steps at the start of the run left out of throughput."""
        return self._counter.warmup  # type: ignore[no-any-return]

    @warmup.setter
    def warmup(self, warmup: int) -> None:
        self._counter.warmup = warmup

    @property
    def steps(self) -> int:
        """Steps marked in the current interval."""
        return self._counter.steps  # type: ignore[no-any-return]

    @property
    def end_step(self) -> Any:
        """``step()`` without counts, as one callable: what ``instrument.auto``'s optimizer
        step calls. The step counter itself (C where built: no Python frame per step) while
        ``step`` is this class's; a ``step`` of a subclass or set on the instance (an
        integration's, e.g. Lightning's, which holds ticks inside ``training_step``) is
        called instead."""
        step = self.step
        return self._counter if getattr(step, "__func__", None) is Reporter.step else step

    def count(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Deprecated: ``instrument.count(samples=, tokens=)`` (every live reporter) does
        this; ``step(samples=, tokens=)`` counts and ends the step."""
        deprecated("Reporter.count()", "instrument.count(samples=, tokens=)")
        self.count_into_step(samples, tokens)

    def count_into_step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Add samples and tokens to the current step without ending it (what
        ``instrument.count`` does for each live reporter)."""
        pending = self._counter.pending
        if pending is None:
            pending = self._counter.pending = [None, None]
        for i, (name, value) in enumerate((("samples", samples), ("tokens", tokens))):
            if value is not None:
                pending[i] = (pending[i] or 0) + (_check_count(name, value) or 0)

    def step(self, samples: int | None = None, tokens: int | None = None) -> Report | None:
        """Mark the end of one iteration (with the samples and tokens it consumed, if given);
        flush (and return the report) at every multiple of ``every`` steps of the run
        (``every`` steps apart, unless you flushed in between)."""
        if samples is not None or tokens is not None:
            self.count_into_step(samples, tokens)
        return self._counter()  # type: ignore[no-any-return]

    def _due(self) -> Report:
        """A flush is due (the step counter's ``on_due``)."""
        return self.flush()

    def _add_counts(self) -> None:
        """Add the ended step's samples and tokens to the interval's."""
        samples, tokens = self._counter.pending or (None, None)
        self._counter.pending = None
        if samples is not None:
            self._samples = (self._samples or 0) + samples
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens

    @contextlib.contextmanager
    def measure_flops(self) -> Iterator[None]:
        """Count the FLOPs of the training step run inside the block and use them as
        ``flops_per_step`` from now on (the step runs slower while counted)."""
        with throughput.count_flops() as flops:
            yield
        self.flops_per_step = flops[0]

    def _throughput(self) -> Throughput | None:
        flops = self.flops_per_step if isinstance(self.flops_per_step, float) else None
        peak = self.peak_flops
        if peak is None and flops is not None and clocks.cuda_ready():
            peak = peaks.device_peak_flops(self.peak_dtype)
        counter = self._counter
        _warn_unmeasured(self, flops, peak, counter.run_steps + counter.steps)
        return throughput.compute(
            counter.steps - counter.warm_steps,
            counter.counted_ns,
            samples=self._samples,
            tokens=self._tokens,
            warmup_steps=counter.warm_steps,
            flops_per_step=flops,
            peak_flops=peak,
        )

    def flush(self) -> Report:
        """Snapshot and reset the registry, build the report, hand it to every sink."""
        began = _state.now()
        lifecycle.install_signal_handlers()  # again, in case the default was put back
        if (
            self.barrier
            and not self._local_close
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            barrier_with_timeout(self.barrier_timeout, self.barrier_group)
        config.refresh_auto_clock()
        # intervals meet here, so that each holds the whole of the flush before it (which
        # its report counts as the timing's own cost): a flush's time outside the interval
        # charged with it (the first one's calibrations, ~4 ms) made shares above 100 %
        entered = _state.now()
        # the previous flush's time in this interval's steps, taken once (not again after a
        # flush that raised before recording its own)
        flush_ns, self._flush_in_steps_ns = self._flush_in_steps_ns, 0
        region_ns = selfcost.region_ns()  # calibrated at the first flush: its time counted
        hooked_ns = selfcost.hook_ns()  # likewise, at the first flush after auto()
        open_now = registry.open_calls(frames.get_top())
        collected = registry.collect(open_now, self._reader)
        step_time = self._counter.times.take()
        rates = self._throughput()
        memory = self._memory.sample() if self._memory is not None else {}
        regions, hooked = selfcost.count(collected)
        cost = unchecked(
            SelfCost,
            regions=regions,
            region_ns=region_ns,
            flush_seconds=self._last_flush_ns / 1e9,
            interval_seconds=max(entered - self._start_ns, 0) / 1e9,
            hooked=hooked,
            hooked_ns=hooked_ns,
        )
        steps = self._counter.end_interval()
        start_wall = self._start_wall
        self._start_interval()
        self._start_ns = entered
        self._index += 1
        report = build_report(
            collected,
            steps=steps,
            step_time=step_time,
            normalizer=self.normalizer,
            level=self.level,
            index=self._index,
            step=self._counter.run_steps,
            start_time=start_wall,
            end_time=self._start_wall,
            throughput=rates,
            memory=memory,
            self_cost=cost,
            flush_ns=flush_ns,
        )
        report = self._across_ranks(report)
        report = self._diagnose(report)
        interrupted = self._emit(report)
        ended = _state.now()
        self._last_flush_ns = ended - entered
        # in no region of the thread that ends the steps, this flush (and its barrier's wait)
        # falls in the next step and would read as (other): the next report names it
        in_steps = not open_now and threading.get_ident() == registry.stepping_ident()
        self._flush_in_steps_ns = ended - began if in_steps else 0
        observe.record_span(FLUSH_SPAN, began, ended)  # the trace's next write shows it
        if interrupted is not None:
            raise interrupted
        return report

    def _across_ranks(self, report: Report) -> Report:
        """Add each path's (and each rate's and memory field's) values across the ranks
        (:mod:`instrument.distributed.across`: agree with a deadline, then reduce)."""
        if self.ranks == "local" or self._local_close:
            return report
        if self._cross is None:
            self._cross = CrossRank(
                self.ranks,
                self.group,
                timeout=self.rank_timeout,
                threshold=self.straggler_threshold,
                intervals=self.straggler_intervals,
                channel=self._channel,
            )
        return self._cross.combine(report)

    def _diagnose(self, report: Report) -> Report:
        """``report`` with its findings (:mod:`instrument.diagnosis`); never raises."""
        if self._diagnosis is None:
            return report
        try:
            findings = self._diagnosis.add(report)
            return replaced(report, findings=findings)
        except Exception:
            logger.exception("instrument: the diagnosis failed; the report goes out without it")
            self._diagnosis = None
            return report

    def summary(self) -> RunSummary | None:
        """The run's diagnosis so far (its verdict, findings and step-time trend), or
        ``None`` when the reporter does not diagnose."""
        return None if self._diagnosis is None else self._diagnosis.summary()

    def _emit(self, report: Report) -> BaseException | None:
        """Hand ``report`` to every sink that wants it. A sink that fails (in ``wants`` or
        ``write``) is reported and skipped; a ``KeyboardInterrupt`` or ``SystemExit`` in one
        is returned, to be raised once every other sink has the report."""
        interrupted: BaseException | None = None
        for sink in self._sinks:
            try:
                if sink.wants(report.rank):
                    sink.write(report)
            except Exception:
                self._sink_failed(sink)
            except BaseException as stop:  # Ctrl-C: the interval still reaches every sink
                interrupted = interrupted or stop
        return interrupted

    def _sink_failed(self, sink: Sink) -> None:
        if id(sink) not in self._failed:
            self._failed.add(id(sink))
            logger.exception(
                "instrument: sink %r failed and was skipped; training goes on "
                "(reported once per sink)",
                sink,
            )

    def _emit_summary(self, report: Report | None) -> None:
        """Hand the run's summary to the sinks (at close), when the run made reports."""
        summary = None
        if self._diagnosis is not None and self._index:
            try:
                summary = self._diagnosis.summary()
            except Exception:
                logger.exception("instrument: the run's summary failed")
        if summary is None:
            return
        rank = report.rank if report is not None else summary.rank
        for sink in self._sinks:
            if id(sink) in self._failed:
                continue
            try:
                if sink.wants(rank):
                    sink.write_summary(summary)
            except Exception:
                self._sink_failed(sink)

    def close(self, *, flush: bool = True, local: bool = False) -> Report | None:
        """Flush what is left (if anything, and unless ``flush=False``), close the sinks, and
        stop receiving steps. ``local=True`` flushes this rank's own report only, with no
        barrier and no gather (after an error, or at exit, the other ranks may be gone: the
        error leaves at once instead of after ``rank_timeout``); leaving a ``with`` block
        on an exception closes this way."""
        if self._closed:
            return None
        self._closed = True
        self._local_close = local
        lifecycle.forget(self)
        report = None
        if flush and (self._counter.steps or registry.unread(self._reader)):
            report = self.flush()
        registry.remove_reader(self._reader)
        if self.ranks != "local":  # none waits for this one (also at interpreter exit)
            agree.closed(self._counter.run_steps + self._counter.steps, self.group, self._channel)
        self._emit_summary(report)
        for sink in self._sinks:
            try:
                sink.close()
            except Exception:
                logger.exception("instrument: closing sink %r failed", sink)
        return report

    def _close_at_exit(self) -> None:
        """The last flush, at interpreter exit: a local close (the ranks still running hear
        that this one closed, on the rendezvous store if it is still there, so their next
        flush does not wait ``rank_timeout`` for it)."""
        self.close(local=True)

    def _detach(self) -> None:
        """Stop receiving steps without flushing or closing sinks (``testing.reset``)."""
        self._closed = True
        lifecycle.forget(self)
        registry.remove_reader(self._reader)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __enter__(self) -> Reporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(local=exc_type is not None)

    def __repr__(self) -> str:
        return (
            f"Reporter(every={self.every!r}, normalizer={self.normalizer!r}, "
            f"level={self.level!r}, ranks={self.ranks!r}, sinks={len(self._sinks)})"
        )


def _weakly(method: Callable[[], T]) -> Callable[[], T | None]:
    """``method``, holding its object weakly (a call once it is gone does nothing): the
    step counter holds its reporter's methods this way, so no reference cycle keeps a
    dropped reporter alive, taking records, until the garbage collector runs."""
    ref = weakref.WeakMethod(method)

    def call() -> T | None:
        bound = ref()
        return None if bound is None else bound()

    return call


def _warn_unmeasured(
    reporter: Reporter, flops: float | None, peak: float | None, steps: int
) -> None:
    """Say once why a report has no TFLOP/s or no MFU on a GPU, and how to get them."""
    if reporter.flops_per_step == "auto" and steps > 2:
        warn_once(
            "reporter:flops-unmeasured",
            f"instrument: flops_per_step='auto' but no FLOPs were measured in {steps} steps, "
            "so reports have no TFLOP/s or MFU; wrap one training step in "
            "`with reporter.measure_flops():`, use instrument.auto(model, optimizer, "
            "flops_per_step='auto') (it counts the second optimizer step), or pass the number",
            stacklevel=4,
        )
    if flops is not None and peak is None and clocks.cuda_ready():  # a CPU has no MFU: quiet
        device = torch.cuda.get_device_name()
        warn_once(
            "reporter:no-peak",
            f"instrument: no MFU, because the peak FLOP/s of {device} (dtype "
            f"{reporter.peak_dtype!r}) is not known; pass it as Reporter(peak_flops=...) "
            "(or instrument.auto(..., peak_flops=...)), in FLOP/s",
            stacklevel=4,
        )


def _check_diagnose(diagnose: object) -> Diagnosis | None:
    if isinstance(diagnose, Thresholds):
        return Diagnosis(diagnose)
    if diagnose is True:
        return Diagnosis()
    if diagnose is False:
        return None
    raise ValueError(f"diagnose must be True, False or a Thresholds, got {diagnose!r}")


def step_from_user(reporter: Reporter, samples: int | None, tokens: int | None) -> None:
    """``instrument.step()`` on ``reporter``: a reporter whose steps ``instrument.auto``
    ends at each optimizer step only takes the counts (warned once), never a second tick."""
    if not reporter.ticked_by_optimizer:
        reporter.step(samples=samples, tokens=tokens)
        return
    warn_once(
        "reporter:double-step",
        "instrument.step() while instrument.auto ends each step at the optimizer step: the "
        "samples/tokens were added to the current step, which is not ended twice; call "
        "instrument.count(samples=..., tokens=...) instead to say just that",
        stacklevel=4,
    )
    reporter.count_into_step(samples, tokens)
