"""What a timed region costs, next to a hand-written timer and the peers' host paths.

Run with ``pytest tests/benchmarks --benchmark-only --benchmark-json=out.json`` and turn
the JSON into ratio tables with ``python tests/benchmarks/report_ratios.py out.json``.

Every benchmarked function performs ``inner`` operations (a ``for`` loop with an empty
body); the report divides by ``inner``. The hot-path groups use ``inner = CHUNK`` records
per region and drain the registry before each round, so on the pure-Python path every
timed round contains exactly one fold of a full buffer: the min over rounds is then the
amortized cost, fold included, not the cost of the append-only rounds. (The C accelerator
has no buffer; it updates the statistics on every record.) The rows note which path ran;
``INSTRUMENT_NO_EXTENSIONS=1`` forces the pure-Python one.

The peers (DeepSpeed, torchtnt, codetiming, Lightning) are imported with
``pytest.importorskip``, so this file also runs where they are not installed. Each is
timed on its host path (no CUDA synchronization, no CUDA events) and its accumulated
lists are cleared before each round, like instrument's registry.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import pytest
import wrapt

import instrument
import instrument.testing
from instrument import registry

if TYPE_CHECKING:
    from conftest import Measure

#: Records per region per round: one buffer's worth, so each round folds exactly once.
CHUNK: int = getattr(registry, "CHUNK", 4096)


def _backend() -> str:
    """Which hot path instrument runs on ("C" accelerator or pure "Python")."""
    try:
        from instrument import _native
    except ImportError:
        return "Python"
    return "C" if getattr(_native, "speedups", None) is not None else "Python"


BACKEND = _backend()


def _cpu() -> None:
    """Drain everything recorded and go back to an enabled, host-clock configuration."""
    instrument.testing.reset()
    instrument.configure(clock="cpu")


def _disabled() -> None:
    _cpu()
    instrument.disable()


#: Path trees taken off the registry by :func:`_forget_paths`, kept alive: instrument never
#: frees a path node in normal use, and this benchmark is not the place to start.
_parked: list[object] = []


def _forget_paths() -> None:
    """Take the known paths off the tree (``reset()`` keeps them, and a flush walks them
    all), so a flush benchmark sees only the paths it recorded."""
    instrument.testing.reset()
    _parked.append(dict(registry.ROOT.children))
    registry.ROOT.children.clear()


# -- hand-written baselines ----------------------------------------------------------------

_hand: dict[str, list[int]] = {}


class Hand:
    """The baseline context manager: two clock reads and a list append per use."""

    __slots__ = ("name", "t0")

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = 0

    def __enter__(self) -> Hand:
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        dt = perf_counter_ns() - self.t0
        _hand.setdefault(self.name, []).append(dt)


class Empty:
    """The baseline for a disabled region: a context manager that does nothing."""

    __slots__ = ()

    def __enter__(self) -> Empty:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@wrapt.decorator
def hand_timed(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """The baseline decorator: wrapt, two clock reads and a list append per call."""
    t0 = perf_counter_ns()
    try:
        return wrapped(*args, **kwargs)
    finally:
        _hand.setdefault("f", []).append(perf_counter_ns() - t0)


def trivial() -> None:
    """The function every decorator row wraps."""


# -- 1. context managers -------------------------------------------------------------------


@pytest.mark.benchmark(group="context-manager")
class TestContextManager:
    def test_hand(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                with Hand("x"):
                    pass

        measure(run, label="hand-written class", setup=_hand.clear, inner=CHUNK, baseline=True)
        assert len(_hand["x"]) == CHUNK

    def test_timed(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                with instrument.timed("x"):
                    pass

        measure(run, label="instrument timed", setup=_cpu, inner=CHUNK, note=BACKEND)
        report = instrument.Reporter(every=None, sinks=[]).flush()
        assert report["x"].count == CHUNK

    def test_timed_nested(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                with instrument.timed("a"), instrument.timed("b"):
                    pass

        # two regions per iteration: the report's per-operation figure is per region
        measure(
            run,
            label="instrument timed, nested a/b (per region)",
            setup=_cpu,
            inner=2 * CHUNK,
            note=BACKEND,
        )
        report = instrument.Reporter(every=None, sinks=[]).flush()
        assert report["a"].count == report["a/b"].count == CHUNK

    def test_deepspeed(self, measure: Measure) -> None:
        ds_timer = pytest.importorskip("deepspeed.utils.timer")
        timers = ds_timer.SynchronizedWallClockTimer()
        timers("x").use_host_timer = True  # what it does without CUDA: time.time() pairs

        def run() -> None:
            for _ in range(CHUNK):
                timers("x").start()
                timers("x").stop()

        measure(
            run,
            label="DeepSpeed SynchronizedWallClockTimer",
            setup=timers("x").reset,
            inner=CHUNK,
            note="host timer: time.time()",
        )
        assert len(timers("x").event_timers) == CHUNK

    def test_torchtnt(self, measure: Measure) -> None:
        tnt_timer = pytest.importorskip("torchtnt.utils.timer")
        timer = tnt_timer.Timer(cuda_sync=False)

        def run() -> None:
            for _ in range(CHUNK):
                with timer.time("x"):
                    pass

        measure(
            run,
            label="torchtnt Timer.time",
            setup=timer.reset,
            inner=CHUNK,
            note="cuda_sync=False",
        )
        assert len(timer.recorded_durations["x"]) == CHUNK

    def test_codetiming(self, measure: Measure) -> None:
        codetiming = pytest.importorskip("codetiming")
        timer_class = codetiming.Timer

        def run() -> None:
            for _ in range(CHUNK):
                with timer_class(name="x", logger=None):
                    pass

        measure(
            run,
            label="codetiming Timer",
            setup=timer_class.timers.clear,
            inner=CHUNK,
            note="new Timer per use",
        )
        assert timer_class.timers.count("x") == CHUNK

    def test_lightning(self, measure: Measure) -> None:
        profilers = pytest.importorskip("pytorch_lightning.profilers")
        profiler = profilers.SimpleProfiler()

        def run() -> None:
            for _ in range(CHUNK):
                with profiler.profile("x"):
                    pass

        measure(
            run,
            label="Lightning SimpleProfiler.profile",
            setup=profiler.recorded_durations.clear,
            inner=CHUNK,
        )
        assert len(profiler.recorded_durations["x"]) == CHUNK


# -- 2. decorators -------------------------------------------------------------------------


@pytest.mark.benchmark(group="decorator")
class TestDecorator:
    def test_wrapt_hand(self, measure: Measure) -> None:
        f = hand_timed(trivial)

        def run() -> None:
            for _ in range(CHUNK):
                f()

        measure(
            run,
            label="hand-written wrapt.decorator",
            setup=_hand.clear,
            inner=CHUNK,
            baseline=True,
        )
        assert len(_hand["f"]) == CHUNK

    def test_timed(self, measure: Measure) -> None:
        f = instrument.timed("f")(trivial)

        def run() -> None:
            for _ in range(CHUNK):
                f()

        measure(run, label="@instrument.timed", setup=_cpu, inner=CHUNK, note=BACKEND)
        report = instrument.Reporter(every=None, sinks=[]).flush()
        assert report["f"].count == CHUNK

    def test_plain(self, measure: Measure) -> None:
        f = trivial

        def run() -> None:
            for _ in range(CHUNK):
                f()

        measure(run, label="plain call (reference)", inner=CHUNK)


# -- 3. disabled ---------------------------------------------------------------------------


@pytest.mark.benchmark(group="disabled")
class TestDisabled:
    def test_empty(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                with Empty():
                    pass

        measure(run, label="empty context-manager class", inner=CHUNK, baseline=True)

    def test_timed(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                with instrument.timed("x"):
                    pass

        measure(run, label="instrument timed, disabled", setup=_disabled, inner=CHUNK)
        assert not instrument.is_enabled()

    def test_decorated(self, measure: Measure) -> None:
        f = instrument.timed("f")(trivial)

        def run() -> None:
            for _ in range(CHUNK):
                f()

        measure(run, label="@instrument.timed call, disabled", setup=_disabled, inner=CHUNK)

    def test_plain(self, measure: Measure) -> None:
        f = trivial

        def run() -> None:
            for _ in range(CHUNK):
                f()

        measure(run, label="plain call (reference)", inner=CHUNK)

    def test_loop(self, measure: Measure) -> None:
        def run() -> None:
            for _ in range(CHUNK):
                pass

        measure(run, label="empty loop (reference)", inner=CHUNK)


# -- 4. flush ------------------------------------------------------------------------------

FLUSH_CASES = [
    # (paths, calls per path): the first three record the same 10,000 calls in all
    (10, 1000),
    (100, 100),
    (1000, 10),
    (100, 1000),  # 10x the calls of (100, 100)
]


@pytest.mark.benchmark(group="flush")
@pytest.mark.parametrize(("paths", "calls"), FLUSH_CASES, ids=[f"{p}x{c}" for p, c in FLUSH_CASES])
def test_flush(measure: Measure, paths: int, calls: int) -> None:
    """One flush (collect, build, no sinks) after ``paths`` x ``calls`` untimed records."""
    _forget_paths()
    instrument.configure(clock="cpu")
    regions = [instrument.timed(f"p{i}") for i in range(paths)]
    reporter = instrument.Reporter(every=10**9, sinks=[])

    def record() -> None:
        for region in regions:
            for _ in range(calls):
                with region:
                    pass

    measure(
        reporter.flush,
        label=f"flush: {paths} paths x {calls} calls",
        setup=record,
        inner=1,
        baseline=(paths, calls) == FLUSH_CASES[0],
        rounds=40,
        warmup_rounds=3,
        note=f"{paths * calls} calls, {BACKEND}",
    )
    record()
    report = reporter.flush()
    assert len(report) == paths
    assert report["p0"].count == calls


# -- 5. memory -----------------------------------------------------------------------------

MEMORY_CALLS = 1_000_000
MEMORY_LIMIT = 1_000_000  # bytes; unbounded storage would keep >= 36 MB (list slot + int)


@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used")
def test_memory_bounded_by_paths(benchmark: Any) -> None:
    """1e6 records into one path retain (and peak at) well under 1 MB: memory is bounded
    by the number of paths, not of calls.

    Not a speed benchmark: ``benchmark`` is requested only so that it runs with
    ``--benchmark-only`` (about 20 s under tracemalloc). It measures what tracemalloc
    sees, i.e. allocations made through Python's allocators (a C accelerator that used
    plain ``malloc`` would be invisible to it).
    """
    instrument.configure(clock="cpu")
    region = instrument.timed("mem")
    with region:  # create the path (a one-off allocation) before measuring
        pass
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(MEMORY_CALLS):
            with region:
                pass
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    report = instrument.Reporter(every=None, sinks=[]).flush()
    assert report["mem"].count == MEMORY_CALLS + 1
    assert after - before < MEMORY_LIMIT, f"retained {after - before} bytes"
    assert peak - before < MEMORY_LIMIT, f"peaked at {peak - before} bytes"
