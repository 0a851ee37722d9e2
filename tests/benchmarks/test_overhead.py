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

The context-manager, decorator and disabled groups are *paired* (see ``conftest.py``): the
baseline, instrument and the peers run interleaved in the same rounds, and each ratio is
the median of per-round ratios. The hand-written baselines record into lists made once
(a ``defaultdict(list)``), so they do only the work they stand for. The peers (DeepSpeed,
torchtnt, codetiming, Lightning) are left out where they are not installed; each is timed
on its host path (no CUDA synchronization, no CUDA events) and its accumulated lists are
cleared before each round, like instrument's registry.
"""

from __future__ import annotations

import functools
import gc
import importlib
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import pytest
import wrapt
from paired import Contender

import instrument
import instrument.testing
from instrument import registry

if TYPE_CHECKING:
    from conftest import Measure, Paired

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


def _forget_paths() -> None:
    """Let the known paths go as a long run would (``reset()`` keeps them, and a flush
    walks them all): idle for ``registry.idle_flushes`` flushes, they are released, so a
    flush benchmark sees only the paths it recorded."""
    instrument.testing.reset()
    reporter = instrument.Reporter(every=None, sinks=[], memory=False)
    for _ in range(registry.idle_flushes):
        reporter.flush()
    reporter.close(flush=False)


# -- hand-written baselines ----------------------------------------------------------------

#: Where the hand-written baselines record: lists made once, so a record is one lookup and
#: one append (no list built per call).
_hand: defaultdict[str, list[int]] = defaultdict(list)


def _clear_hand() -> None:
    for durations in _hand.values():
        durations.clear()


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
        _hand[self.name].append(perf_counter_ns() - self.t0)


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
        _hand["f"].append(perf_counter_ns() - t0)


def trivial() -> None:
    """The function every decorator row wraps."""


def _optional(module: str) -> Any:
    """A peer's module, or ``None`` where it is not installed (its row is left out)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _loop(enter: Callable[[], Any]) -> Callable[[], None]:
    """``CHUNK`` uses of the context manager ``enter()`` returns."""

    def run() -> None:
        for _ in range(CHUNK):
            with enter():
                pass

    return run


def _calls(f: Callable[[], object]) -> Callable[[], None]:
    """``CHUNK`` calls of ``f``."""

    def run() -> None:
        for _ in range(CHUNK):
            f()

    return run


# -- 1. context managers -------------------------------------------------------------------


def _peers() -> list[Contender]:
    """The peers' host-clock timers that are installed, each cleared before its rounds."""
    out: list[Contender] = []
    ds_timer = _optional("deepspeed.utils.timer")
    if ds_timer is not None:
        timers = ds_timer.SynchronizedWallClockTimer()
        timers("x").use_host_timer = True  # what it does without CUDA: time.time() pairs

        def deepspeed() -> None:
            for _ in range(CHUNK):
                timers("x").start()
                timers("x").stop()

        out.append(
            Contender(
                "DeepSpeed SynchronizedWallClockTimer",
                deepspeed,
                setup=timers("x").reset,
                inner=CHUNK,
                peer=True,
                note="host timer: time.time()",
            )
        )
    tnt_timer = _optional("torchtnt.utils.timer")
    if tnt_timer is not None:
        timer = tnt_timer.Timer(cuda_sync=False)
        out.append(
            Contender(
                "torchtnt Timer.time",
                _loop(lambda: timer.time("x")),
                setup=timer.reset,
                inner=CHUNK,
                peer=True,
                note="cuda_sync=False",
            )
        )
    codetiming = _optional("codetiming")
    if codetiming is not None:
        timer_class = codetiming.Timer
        out.append(
            Contender(
                "codetiming Timer",
                _loop(lambda: timer_class(name="x", logger=None)),
                setup=timer_class.timers.clear,
                inner=CHUNK,
                peer=True,
                note="new Timer per use",
            )
        )
    profilers = _optional("pytorch_lightning.profilers")
    if profilers is not None:
        profiler = profilers.SimpleProfiler()
        out.append(
            Contender(
                "Lightning SimpleProfiler.profile",
                _loop(lambda: profiler.profile("x")),
                setup=profiler.recorded_durations.clear,
                inner=CHUNK,
                peer=True,
            )
        )
    return out


def _nested() -> None:
    for _ in range(CHUNK):
        with instrument.timed("a"), instrument.timed("b"):
            pass


@pytest.mark.benchmark(group="context-manager")
def test_context_manager(paired: Paired) -> None:
    """``with timed("x")`` against the hand-written class and the peers, interleaved."""
    timed = instrument.timed
    paired(
        [
            Contender(
                "hand-written class", _loop(lambda: Hand("x")), _clear_hand, CHUNK, baseline=True
            ),
            Contender("instrument timed", _loop(lambda: timed("x")), _cpu, CHUNK, note=BACKEND),
            # two regions per iteration: the per-operation figure is per region
            Contender(
                "instrument timed, nested a/b (per region)", _nested, _cpu, 2 * CHUNK, note=BACKEND
            ),
            *_peers(),
        ]
    )
    assert len(_hand["x"]) == CHUNK
    _cpu()
    _loop(lambda: timed("x"))()
    assert instrument.Reporter(every=None, sinks=[]).flush()["x"].count == CHUNK


# -- 2. decorators -------------------------------------------------------------------------


def wraps_timed(func: Callable[..., Any]) -> Callable[..., Any]:
    """The leanest decorator: a ``functools.wraps`` closure, two clock reads and an append."""
    durations = _hand["f"]

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = perf_counter_ns()
        try:
            return func(*args, **kwargs)
        finally:
            durations.append(perf_counter_ns() - t0)

    return call


#: Operations per round of the decorator and clock-pair groups: short rounds on the C path
#: (a round of 4096 regions lasts long enough to be preempted in most rounds on a loaded
#: 2-core machine, which spoils the median), ``CHUNK`` on the pure-Python path (one fold
#: per round, as above).
SHORT = CHUNK if BACKEND == "Python" else 512


def _short(body: Callable[[], object]) -> Callable[[], None]:
    """``SHORT`` runs of ``body``."""

    def run() -> None:
        for _ in range(SHORT):
            body()

    return run


def _with(timed: Callable[[str], Any]) -> Callable[[], None]:
    """``SHORT`` uses of ``with timed("x")``, written out (no call per use but the region's)."""

    def run() -> None:
        for _ in range(SHORT):
            with timed("x"):
                pass

    return run


def _clock_pairs() -> None:
    """``SHORT`` pairs of clock reads (the floor of any host-clock region)."""
    for _ in range(SHORT):
        perf_counter_ns()
        perf_counter_ns()


def _short_empty_loop() -> None:
    for _ in range(SHORT):
        pass


class Model:
    """A class with a decorated method and a plain one."""

    @instrument.timed("forward")
    def forward(self) -> None:
        """The decorated method."""

    def plain(self) -> None:
        """The plain method."""


@pytest.mark.benchmark(group="decorator")
def test_decorator(paired: Paired) -> None:
    """``@timed`` against ``with timed()``, both above what they wrap (a plain call, an empty
    loop), interleaved; the hand-written decorators are references."""
    timed = instrument.timed
    decorated = timed("f")(trivial)
    model = Model()
    paired(
        [
            Contender(
                "with instrument.timed",
                _with(timed),
                _cpu,
                SHORT,
                baseline=True,
                note=BACKEND,
                above="empty loop",
            ),
            Contender(
                "@instrument.timed",
                _short(decorated),
                _cpu,
                SHORT,
                note=BACKEND,
                above="plain call",
            ),
            Contender(
                "hand-written wrapt.decorator (reference)",
                _short(hand_timed(trivial)),
                _clear_hand,
                SHORT,
                above="plain call",
            ),
            Contender(
                "hand-written functools.wraps closure (reference)",
                _short(wraps_timed(trivial)),
                _clear_hand,
                SHORT,
                above="plain call",
            ),
            Contender(
                "@instrument.timed method call",
                _short(lambda: model.forward()),
                _cpu,
                SHORT,
                note=BACKEND,
                above="plain method call",
            ),
            Contender("plain call", _short(trivial), None, SHORT),
            Contender("plain method call", _short(lambda: model.plain()), None, SHORT),
            Contender("empty loop", _short_empty_loop, None, SHORT),
        ]
    )
    _cpu()
    _short(decorated)()
    assert instrument.Reporter(every=None, sinks=[]).flush()["f"].count == SHORT


@pytest.mark.benchmark(group="clock-pair")
def test_with_against_the_clock_pair(paired: Paired) -> None:
    """``with timed("x")`` against two ``perf_counter_ns`` reads, both above an empty loop."""
    timed = instrument.timed
    paired(
        [
            Contender(
                "two perf_counter_ns reads",
                _clock_pairs,
                None,
                SHORT,
                baseline=True,
                above="empty loop",
            ),
            Contender(
                "with instrument.timed",
                _with(timed),
                _cpu,
                SHORT,
                note=BACKEND,
                above="empty loop",
            ),
            Contender("empty loop", _short_empty_loop, None, SHORT),
        ]
    )


# -- 3. disabled ---------------------------------------------------------------------------


def _empty_loop() -> None:
    for _ in range(CHUNK):
        pass


@pytest.mark.benchmark(group="disabled")
def test_disabled(paired: Paired) -> None:
    """Disabled regions against an empty context-manager class, interleaved."""
    decorated = instrument.timed("f")(trivial)
    timed = instrument.timed
    paired(
        [
            Contender("empty context-manager class", _loop(Empty), None, CHUNK, baseline=True),
            Contender("instrument timed, disabled", _loop(lambda: timed("x")), _disabled, CHUNK),
            Contender("@instrument.timed call, disabled", _calls(decorated), _disabled, CHUNK),
            Contender("plain call (reference)", _calls(trivial), None, CHUNK),
            Contender("empty loop (reference)", _empty_loop, None, CHUNK),
        ]
    )
    _disabled()
    _loop(lambda: timed("x"))()
    assert instrument.Reporter(every=None, sinks=[]).flush().get("x") is None


class HandStep:
    """The baseline step tick: one clock read, the step's duration appended, a counter."""

    __slots__ = ("last", "steps")

    def __init__(self) -> None:
        self.last = perf_counter_ns()
        self.steps = 0

    def step(self) -> None:
        now = perf_counter_ns()
        _hand["step"].append(now - self.last)
        self.last = now
        self.steps += 1


@pytest.mark.benchmark(group="step")
def test_step(paired: Paired) -> None:
    """``instrument.step()`` with one live reporter (no flush due in the run) against a
    hand-written step tick, interleaved."""
    instrument.configure(clock="cpu")
    reporter = instrument.Reporter(every=10**9, sinks=[], diagnose=False)
    paired(
        [
            Contender(
                "hand-written step tick", _calls(HandStep().step), _clear_hand, CHUNK, baseline=True
            ),
            Contender("instrument.step()", _calls(instrument.step), None, CHUNK),
        ]
    )
    assert reporter.flush().steps > 0
    reporter.close(flush=False)


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
def test_flush(measure: Measure, benchmark: Any, paths: int, calls: int) -> None:
    """One whole ``Reporter.flush()`` (collect, report, memory sample, no sinks, no diagnosis:
    its cost is ``test_diagnosis_cost.py``'s) after ``paths`` x ``calls`` untimed records;
    ``extra_info["value_ns"]`` is its least time per path (the flush target of
    docs/performance.md is on it)."""
    _forget_paths()
    instrument.configure(clock="cpu")
    regions = [instrument.timed(f"p{i}") for i in range(paths)]
    reporter = instrument.Reporter(every=10**9, sinks=[], diagnose=False)

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
    benchmark.extra_info["value_ns"] = benchmark.stats.stats.min * 1e9 / paths
    benchmark.extra_info["value_median_ns"] = benchmark.stats.stats.median * 1e9 / paths
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
