"""Real use of the public API, type-checked with ``mypy --strict tests/typing/api.py``.

Nothing runs at import: every use sits in a function. ``python tests/typing/api.py`` runs
them all (on the host clock or a fake one, in well under a second), so the file is also a
smoke test that the annotated usage really works.

``assert_type`` pins the exact type mypy infers; a ``# type: ignore[code]`` marks a misuse
that mypy must reject (``--strict`` turns on ``warn_unused_ignores``, so if the error
disappears, the ignore itself is reported).
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any

import instrument
import instrument.sinks
import instrument.testing
from instrument.testing import FakeClock, capture_reports, reset, use_clock

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # pragma: no cover - mypy checks this file as 3.11
    from typing_extensions import assert_type


# -- regions ------------------------------------------------------------------------------


def check_context_manager() -> None:
    with instrument.timed("step") as region:
        assert_type(region, instrument.Region)
        assert region is instrument.timed("step")  # one cached object per name and options
        with instrument.timed("forward", clock="cpu", level=1):
            path: str = instrument.current_path()
            assert path == "step/forward"
    reused: instrument.Region = instrument.timed("step")
    with reused, reused:  # the same region object nests: "step/step"
        pass
    name: str = reused.name
    level: int = reused.level
    clock: object = reused.clock
    assert (name, level, clock) == ("step", 0, None)


def check_named_decorator() -> None:
    @instrument.timed("f")
    def f(x: int, *, suffix: str = "!") -> str:
        return f"{x}{suffix}"

    s: str = f(1)
    assert_type(f(1, suffix="?"), str)
    g: Callable[[int], str] = f
    assert g(2) == "2!"
    assert s == "1!"


def check_bare_and_optioned_decorators() -> None:
    @instrument.timed
    def load(path: str) -> bytes:
        return path.encode()

    @instrument.timed()
    def save(data: bytes) -> int:
        return len(data)

    @instrument.timed(clock="cpu", level=2)
    def parse(data: bytes) -> list[int]:
        return list(data)

    n: int = save(load("ab"))
    assert_type(parse(b"x"), list[int])
    assert n == 2


class Model:
    scale = 3

    @instrument.timed("Model.forward")
    def forward(self, x: int) -> int:
        return x * self.scale

    @instrument.timed
    def backward(self, grad: float) -> float:
        return grad

    @instrument.timed("Model.build")
    @classmethod
    def build(cls) -> Model:
        return cls()

    @classmethod
    @instrument.timed
    def build_inner(cls, scale: int) -> Model:
        model = cls()
        model.scale = scale
        return model

    @instrument.timed("Model.helper")
    @staticmethod
    def helper(x: int) -> str:
        return str(x)

    @staticmethod
    @instrument.timed
    def helper_inner(x: int) -> str:
        return str(x)

    @instrument.timed
    @classmethod
    def bare_outer(cls) -> type[Model]:
        return cls


def check_methods() -> None:
    model = Model.build()
    assert_type(model, Model)
    assert_type(Model.build_inner(2), Model)
    assert_type(model.forward(2), int)
    assert_type(model.backward(0.5), float)
    assert_type(Model.helper(1), str)
    assert_type(model.helper_inner(1), str)
    assert_type(Model.bare_outer(), type[Model])


def check_async_and_generators() -> None:
    @instrument.timed("fetch")
    async def fetch(i: int) -> int:
        await asyncio.sleep(0)
        return i

    @instrument.timed("batches")
    def batches(n: int) -> Iterator[int]:
        yield from range(n)

    @instrument.timed
    async def stream(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    coro: Coroutine[Any, Any, int] = fetch(1)

    async def main() -> int:
        got: int = await coro
        async for item in stream(2):
            assert_type(item, int)
        return got

    result: int = asyncio.run(main())
    total: int = sum(batches(3))
    assert (result, total) == (1, 3)


def check_manual_timer() -> None:
    timer: instrument.Timer = instrument.Timer("checkpoint", clock="cpu", level=0)
    started: instrument.Timer = timer.start()
    running: bool = timer.running
    name: str = timer.name
    region: instrument.Region = timer.region
    assert_type(timer.stop(), None)
    instrument.Timer("save").start().stop()
    assert started is timer
    assert running
    assert name == "checkpoint"
    assert region.name == name


# -- configuration ------------------------------------------------------------------------


class MonotonicNs:
    """A user clock: anything with ``now_ns() -> int`` is an ``instrument.Clock``."""

    def __init__(self) -> None:
        self.ns = 0

    def now_ns(self) -> int:
        self.ns += 1_000
        return self.ns


def check_configuration() -> None:
    user_clock: instrument.Clock = MonotonicNs()
    fake: instrument.Clock = FakeClock()
    instrument.configure(clock=user_clock)
    instrument.configure(clock=fake, level=1)
    instrument.configure(clock="auto", level=None)
    instrument.configure()
    instrument.disable()
    off: bool = instrument.is_enabled()
    instrument.enable()
    assert_type(instrument.enable(), None)
    assert not off
    assert instrument.is_enabled()
    version: str = instrument.__version__
    assert version


# -- reporter, report, nodes, stats ------------------------------------------------------


class Collect:
    """A duck-typed sink: an object with ``write(report)``."""

    def __init__(self) -> None:
        self.paths: list[tuple[str, ...]] = []

    def write(self, report: instrument.Report) -> None:
        self.paths.append(report.paths())


class CountingSink(instrument.sinks.Sink):
    def __init__(self) -> None:
        self.count = 0

    def write(self, report: instrument.Report) -> None:
        self.count += len(report)

    def close(self) -> None:
        self.count = -self.count


def on_report(report: instrument.Report) -> None:
    assert isinstance(report.index, int)


def check_auto() -> None:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(
        model, optimizer, every=None, depth=1, exclude=[nn.ReLU, "*.dropout"], sinks=[]
    )
    assert_type(handle, instrument.AutoHandle)
    assert_type(handle.reporter, instrument.Reporter)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    assert handle.reporter.flush()["forward"].count == 1
    handle.remove()
    with instrument.auto(model, [optimizer], backward="modules", collectives=False) as scoped:
        assert_type(scoped.skipped_steps, int)
    batches: Iterable[int] = instrument.data([1, 2, 3], name="batches")
    assert list(batches) == [1, 2, 3]


def check_throughput_and_ranks() -> None:
    reporter = instrument.Reporter(
        every=None, warmup=0, flops_per_step=1e9, peak_flops=1e12, ranks="minmax"
    )
    instrument.count(samples=4, tokens=128)
    instrument.step(samples=4)
    report = reporter.flush()
    rates = report.throughput
    assert rates is not None
    assert_type(rates, instrument.Throughput)
    assert_type(rates.samples_per_sec, float | None)
    memory: Mapping[str, int] = report.memory
    assert "host_rss" in memory
    with instrument.timed("sync", barrier=True, barrier_timeout=5.0):
        pass


def check_reporter() -> None:
    memory = instrument.sinks.InMemory()
    stream = io.StringIO()
    reporter = instrument.Reporter(
        every=2,
        sinks=[
            instrument.sinks.Console(stream, unicode=False),
            instrument.sinks.Logging("instrument.typing", level=logging.DEBUG),
            instrument.sinks.Logging(logging.getLogger("x")),
            memory,
            Collect(),
            CountingSink(),
            on_report,
        ],
        normalizer="steps",
        level=3,
        ranks="minmax",
    )
    reporter.add_sink(instrument.sinks.CallableSink(on_report))
    sinks: tuple[instrument.sinks.Sink, ...] = reporter.sinks
    adapted: instrument.sinks.Sink = instrument.sinks.as_sink(on_report)
    assert len(sinks) == 8
    assert adapted is not None

    for _ in range(2):
        with instrument.timed("data"):
            pass
        instrument.step(samples=32, tokens=8192)
    assert_type(instrument.step(), None)
    maybe: instrument.Report | None = reporter.step()
    steps: int = reporter.steps
    report: instrument.Report = reporter.flush()
    last: instrument.Report | None = reporter.close()
    closed: bool = reporter.closed
    assert maybe is not None
    assert steps == 0
    assert closed
    assert last is None
    assert memory.last is report
    assert memory.reports[-1] is report
    memory.clear()

    with instrument.Reporter(every=None, normalizer=4.0) as scoped:
        assert_type(scoped, instrument.Reporter)
        with instrument.timed("x"):
            pass
        scaled = scoped.flush()
    assert scaled.normalizer == 4.0

    instrument.Reporter(every=None, sinks=[print], normalizer="steps").close()


def check_report_and_node() -> None:
    reporter = instrument.Reporter(every=None)
    with instrument.timed("outer"), instrument.timed("inner"):
        pass
    report = reporter.flush()

    node: instrument.Node = report["outer/inner"]
    count: int = node.count
    # exactly float (an int attribute would also be assignable to a float variable)
    assert_type(node.total, float)
    assert_type(node.mean, float)
    assert_type(node.min, float)
    assert_type(node.max, float)
    assert_type(node.std, float)
    assert_type(node.p50, float)
    assert_type(node.p90, float)
    assert_type(node.p99, float)
    assert_type(node.self, float)
    assert_type(node.self_time, float)
    assert_type(node.count, int)
    times = [node.total, node.mean, node.min, node.max, node.std, node.p50, node.p99, node.self]
    path: str = node.path
    name: str = node.name
    parent: str = node.parent
    clock: str = node.clock
    level: int = node.level
    host: instrument.Stats = node.host
    device: instrument.Stats | None = node.device
    primary: instrument.Stats = node.stats
    assert (count, clock, level) == (1, "cpu", 0)
    assert (path, name, parent) == ("outer/inner", "inner", "outer")
    assert all(t >= 0.0 for t in times)
    assert device is None
    assert primary is host

    found: instrument.Node | None = report.get("nope")
    paths: tuple[str, ...] = report.paths()
    children: tuple[instrument.Node, ...] = report.children("outer")
    nodes: tuple[instrument.Node, ...] = report.nodes
    other: float | None = report.other
    assert_type(report.other, float | None)
    step_time: instrument.Stats | None = report.step_time
    normalizer: float | str = report.normalizer
    ints: list[int] = [report.steps, report.index, report.rank, report.world_size, len(report)]
    floats: list[float] = [report.start_time, report.end_time, report.flush_time]
    has: bool = "outer" in report
    text: str = report.render(unicode=False, width=30)
    data: dict[str, Any] = report.to_dict()
    again: instrument.Report = instrument.Report.from_dict(data)
    node_again: instrument.Node = instrument.Node.from_dict(node.to_dict())
    assert found is None
    assert paths == ("outer", "outer/inner")
    assert len(children) == 1
    assert nodes
    assert other is None
    assert step_time is None
    assert normalizer == 1.0
    assert ints[0] == 0
    assert floats
    assert has
    assert text
    assert again == report
    assert node_again == node


def check_stats() -> None:
    stats: instrument.Stats = instrument.Stats.empty()
    count: int = stats.count
    fields: list[float] = [
        stats.total,
        stats.mean,
        stats.min,
        stats.max,
        stats.std,
        stats.p50,
        stats.p90,
        stats.p99,
    ]
    half: instrument.Stats = stats.scaled(0.5)
    data: dict[str, Any] = stats.to_dict()
    assert instrument.Stats.from_dict(data) == stats == half
    assert count == 0
    assert not any(fields)
    made = instrument.Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    assert made.total == 0.5


# -- misuse mypy must reject (never called: most of these raise at run time) --------------


def misuse_rejected_by_mypy(report: instrument.Report, node: instrument.Node) -> None:
    @instrument.timed("f")
    def f(x: int) -> str:
        return str(x)

    wrong: int = f(1)  # type: ignore[assignment]
    f("1")  # type: ignore[arg-type]
    Model().forward("2")  # type: ignore[arg-type]
    instrument.Timer(3)  # type: ignore[arg-type]
    instrument.Reporter(every="50")  # type: ignore[arg-type]
    instrument.configure(level="debug")  # type: ignore[arg-type]
    instrument.auto(Model(), "adam")  # type: ignore[arg-type]
    count: str = node.count  # type: ignore[assignment]
    node.total = 1.0  # type: ignore[misc]
    report[0]  # type: ignore[index]
    del wrong, count


# -- testing helpers ----------------------------------------------------------------------


def check_testing_helpers() -> None:
    clock = FakeClock(start=10.0)
    clock.advance(0.25)
    seconds: float = clock.seconds
    now: int = clock.now_ns()
    assert seconds == 10.25
    assert now == 10_250_000_000

    with use_clock(clock) as used, capture_reports(normalizer="steps") as reports:
        assert_type(reports, list[instrument.Report])
        assert used is clock
        with instrument.timed("step"):
            clock.advance(0.5)
    report: instrument.Report = reports[-1]
    assert report["step"].total == 0.5

    with use_clock("cpu"):
        pass
    instrument.testing.reset()
    reset()


def check_sinks_and_compat() -> None:
    """The file sinks, NVTX switch and compat timers, as a user types them."""
    import tempfile
    from pathlib import Path

    from instrument.compat.megatron import Timers
    from instrument.compat.nanotron import nanotron_timer
    from instrument.sinks import JSONL, ChromeTrace

    with tempfile.TemporaryDirectory() as tmp:
        sinks: list[instrument.sinks.Sink] = [
            JSONL(Path(tmp) / "run.jsonl"),
            ChromeTrace(Path(tmp) / "trace.json", max_events=1000),
        ]
        reporter = instrument.Reporter(every=None, sinks=sinks)
        with instrument.timed("step"):
            pass
        report: instrument.Report = reporter.flush()
        step: int = report.step
        assert step == 0
        reporter.close()
    instrument.configure(nvtx=False)
    timers = Timers(log_level=2, log_option="minmax")
    timers("forward").start()
    timers("forward").stop()
    seconds: float = timers("forward").elapsed()
    assert seconds >= 0.0
    record = nanotron_timer("x", timer_type="cpu")
    assert record.name == "x"


def main() -> None:
    """Run every check once, from a clean state."""
    reset()
    for check in (
        check_auto,
        check_throughput_and_ranks,
        check_context_manager,
        check_named_decorator,
        check_bare_and_optioned_decorators,
        check_methods,
        check_async_and_generators,
        check_manual_timer,
        check_configuration,
        check_reporter,
        check_report_and_node,
        check_stats,
        check_testing_helpers,
        check_sinks_and_compat,
    ):
        reset()
        check()
    reset()


if __name__ == "__main__":
    main()
