"""instrument.compat.nanotron: nanotron's nanotron_timer / Timers / TimerRecord, ported."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch
from compat_helpers import ClockThatMustNotBeRead, needs_cuda, no_cuda, stub_torch_distributed

import instrument
from instrument import compat
from instrument.compat import nanotron
from instrument.compat.nanotron import TimerRecord, Timers, TimerType, nanotron_timer
from instrument.testing import FakeClock, use_clock


@pytest.fixture(autouse=True)
def _fresh_timers() -> Iterator[None]:
    """Timing on (nanotron's default is off unless ENABLE_TIMERS=1), no timers, no warnings."""
    was_enabled = Timers.is_enabled()
    Timers.enable()
    nanotron_timer._timers.clear()
    nanotron_timer._disabled.clear()
    yield
    nanotron_timer._timers.clear()
    nanotron_timer._disabled.clear()
    Timers._enabled = was_enabled


# -- one record per name, three ways to use it ---------------------------------------------


def test_the_same_name_returns_the_same_record(clock: FakeClock) -> None:
    first = nanotron_timer("forward")
    assert nanotron_timer("forward") is first
    assert nanotron_timer("backward") is not first
    assert Timers() is nanotron_timer


def test_context_manager_accumulates_seconds(clock: FakeClock) -> None:
    for seconds in (0.25, 0.5):
        with nanotron_timer("forward"):
            clock.advance(seconds)
    timer = nanotron_timer("forward")
    assert timer.elapsed == 0.5  # the last interval
    assert timer.total_time == 0.75
    assert timer.average_time == 0.375
    assert timer.call_count == 2
    assert not timer.running


def test_start_end_and_elapsed_while_running(clock: FakeClock) -> None:
    timer = nanotron_timer("opt")
    assert timer.start() is timer
    clock.advance(0.125)
    assert timer.running
    assert timer.elapsed == 0.125  # time so far
    assert timer.call_count == 0
    clock.advance(0.125)
    timer.end()
    assert (timer.elapsed, timer.total_time, timer.call_count) == (0.25, 0.25, 1)


def test_never_used_timer_reads_zero(clock: FakeClock) -> None:
    timer = nanotron_timer("idle")
    assert (timer.elapsed, timer.total_time, timer.average_time, timer.call_count) == (0, 0, 0, 0)


def test_decorator_forms(clock: FakeClock) -> None:
    @nanotron_timer("named")
    def named(x: int) -> int:
        clock.advance(0.25)
        return x + 1

    @nanotron_timer
    def bare() -> None:
        clock.advance(0.5)

    @nanotron_timer(timer_type=TimerType.CPU)
    def cpu_only() -> None:
        clock.advance(0.125)

    assert named(1) == 2
    named(2)
    bare()
    cpu_only()
    assert named.__name__ == "named"
    assert (nanotron_timer("named").total_time, nanotron_timer("named").call_count) == (0.5, 2)
    assert nanotron_timer("bare").total_time == 0.5
    assert nanotron_timer("cpu_only", timer_type="cpu").total_time == 0.125


def test_async_function_is_timed_until_it_returns(clock: FakeClock) -> None:
    @nanotron_timer("fetch")
    async def fetch() -> str:
        await asyncio.sleep(0)
        clock.advance(0.25)
        return "done"

    assert inspect.iscoroutinefunction(fetch)
    assert asyncio.run(fetch()) == "done"
    assert nanotron_timer("fetch").total_time == 0.25


def test_exception_inside_the_context_propagates_and_stops_the_timer(clock: FakeClock) -> None:
    def boom() -> None:
        with nanotron_timer("boom"):
            clock.advance(0.5)
            raise ZeroDivisionError("in the block")

    with pytest.raises(ZeroDivisionError, match="in the block"):
        boom()
    timer = nanotron_timer("boom")
    assert not timer.running
    assert (timer.call_count, timer.total_time) == (1, 0.5)


# -- misuse, as nanotron handles it -------------------------------------------------------


def test_end_without_start_is_logged_and_ignored(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    timer = nanotron_timer("x")
    with caplog.at_level(logging.WARNING, logger="nanotron.logging.timers"):
        timer.end()
    assert caplog.messages == ["Timer 'x' was not running. Ignoring end call."]
    assert timer.call_count == 0


def test_start_while_running_restarts(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    timer = nanotron_timer("x")
    timer.start()
    clock.advance(1.0)
    with caplog.at_level(logging.WARNING, logger="nanotron.logging.timers"):
        timer.start()
    assert caplog.messages == ["Timer 'x' already running. Restarting."]
    clock.advance(0.25)
    timer.end()
    assert (timer.total_time, timer.call_count) == (0.25, 1)


def test_other_settings_for_an_existing_name_raise(clock: FakeClock) -> None:
    nanotron_timer("x", timer_type="cpu")
    with pytest.raises(ValueError, match=r"'x' already exists with different settings.*'cpu'"):
        nanotron_timer("x", timer_type="cuda")
    with pytest.raises(ValueError, match=r"cuda_sync=False; requested .*cuda_sync=True"):
        nanotron_timer("x", timer_type="cpu", cuda_sync=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timer_type": "gpu"}, "unknown timer_type 'gpu'; expected 'cuda' or 'cpu'"),
        ({"cuda_sync": 1}, "cuda_sync must be True or False, got 1"),
        ({"enabled": "no"}, "enabled must be True or False, got 'no'"),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nanotron_timer("x", **kwargs)  # type: ignore[call-overload]


def test_bad_names_raise() -> None:
    with pytest.raises(ValueError, match="non-empty string or a function, got ''"):
        nanotron_timer("")
    with pytest.raises(ValueError, match="non-empty string, got 3"):
        TimerRecord(name=3)  # type: ignore[arg-type]


def test_signature_matches_nanotron() -> None:
    params = inspect.signature(Timers.__call__).parameters
    assert list(params) == ["self", "name", "timer_type", "cuda_sync", "enabled"]
    assert params["timer_type"].default is TimerType.CUDA
    assert params["cuda_sync"].default is False
    fields = inspect.signature(TimerRecord).parameters
    assert list(fields)[:8] == [
        "name",
        "timer_type",
        "start_time",
        "end_time",
        "running",
        "call_count",
        "cuda_sync",
        "enabled",
    ]


# -- disabled ----------------------------------------------------------------------------


def test_disabled_timers_do_nothing_and_store_nothing() -> None:
    Timers.disable()
    assert not Timers.is_enabled()
    with use_clock(ClockThatMustNotBeRead()):
        with nanotron_timer("x") as timer:
            pass
        timer.start()
        timer.end()
        assert (timer.elapsed, timer.total_time, timer.call_count) == (0.0, 0.0, 0)
    assert not timer.enabled
    assert nanotron_timer("x") is timer  # one placeholder per name and settings
    assert nanotron_timer._timers == {}
    assert list(nanotron_timer.items()) == []


def test_enabled_argument_overrides_the_global_switch(clock: FakeClock) -> None:
    Timers.disable()
    with nanotron_timer("forced", enabled=True):
        clock.advance(0.5)
    Timers.enable()
    assert nanotron_timer("forced").total_time == 0.5
    with nanotron_timer("off", enabled=False):
        clock.advance(0.5)
    assert "off" not in dict(nanotron_timer.items())


def test_decorated_functions_follow_enable_and_disable(clock: FakeClock) -> None:
    Timers.disable()

    @nanotron_timer("late")
    def late() -> None:
        clock.advance(0.25)

    late()
    Timers.enable()
    late()
    late()
    assert nanotron_timer("late").call_count == 2
    Timers.disable()
    late()
    Timers.enable()
    assert nanotron_timer("late").call_count == 2


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_timing_is_off_unless_enable_timers_is_1() -> None:
    code = (
        "import importlib, os; import instrument.compat.nanotron as m;"
        "a = m.Timers.is_enabled(); os.environ['ENABLE_TIMERS'] = '1'; importlib.reload(m);"
        "print(a, m.Timers.is_enabled())"
    )
    env = {k: v for k, v in os.environ.items() if k != "ENABLE_TIMERS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "True"], out.stderr


# -- reset and logging -------------------------------------------------------------------


def test_reset_and_reset_all(clock: FakeClock) -> None:
    for name in ("a", "b"):
        with nanotron_timer(name):
            clock.advance(0.5)
    nanotron_timer.reset("a")
    nanotron_timer.reset("unknown")  # nothing to do
    assert (nanotron_timer("a").call_count, nanotron_timer("a").total_time) == (0, 0.0)
    assert nanotron_timer("b").call_count == 1
    nanotron_timer.reset_all()
    assert nanotron_timer("b").total_time == 0.0
    assert nanotron_timer("b") is nanotron_timer("b")  # records survive a reset


def test_log_all_and_log_lines(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    for seconds in (0.25, 0.5):
        with nanotron_timer("forward"):
            clock.advance(seconds)
    with nanotron_timer("backward", timer_type="cpu"):
        clock.advance(0.125)
    nanotron_timer("never")  # no completed interval: not logged
    out = logging.getLogger("test.nanotron")
    with caplog.at_level(logging.INFO, logger="test.nanotron"):
        nanotron_timer.log_all(logger=out)
        nanotron_timer.log("forward", logger=out)
        nanotron_timer.log("unknown", logger=out)
        nanotron_timer.log_all(logger=out, rank=1)  # this process is rank 0: nothing
    assert caplog.messages == [
        "---- Timing Information ----",
        "Timer 'backward' (cpu): 125.00ms total, 125.00ms avg, 1 calls",
        "Timer 'forward' (cpu): 750.00ms total, 375.00ms avg, 2 calls",
        "----------------------------",
        "Timer 'forward' (cpu): 750.00ms total, 375.00ms avg, 2 calls",
    ]


def test_log_uses_nanotrons_module_logger_by_default(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with nanotron_timer("x", timer_type="cpu"):
        clock.advance(0.001)
    # huggingface/nanotron src/nanotron/logging/timers.py (commit 6a8dae4): Timers.log and
    # log_all use ``logging.get_logger(__name__)`` -- the logger "nanotron.logging.timers"
    with caplog.at_level(logging.INFO, logger="nanotron.logging.timers"):
        nanotron_timer.log("x", rank=None)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "nanotron.logging.timers",
            logging.INFO,
            "Timer 'x' (cpu): 1.00ms total, 1.00ms avg, 1 calls",
        )
    ]


def test_log_asks_a_stubbed_torch_distributed_for_the_rank(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # nanotron Timers.log_all: ``world_rank = dist.get_rank()``; ``if rank is not None and
    # world_rank != rank: return`` -- here the rank comes from a stub torch.distributed
    stub = stub_torch_distributed(monkeypatch, rank=1, world_size=2)
    with nanotron_timer("x", timer_type="cpu"):
        clock.advance(0.001)
    with caplog.at_level(logging.INFO, logger="nanotron.logging.timers"):
        nanotron_timer.log_all()  # rank=0 by default: rank 1 logs nothing
        assert caplog.messages == []
        nanotron_timer.log("x", rank=1)
        assert caplog.messages == ["Timer 'x' (cpu): 1.00ms total, 1.00ms avg, 1 calls"]
        stub.get_rank = lambda: 0
        nanotron_timer.log_all()
    assert caplog.messages[1:] == [
        "---- Timing Information ----",
        "Timer 'x' (cpu): 1.00ms total, 1.00ms avg, 1 calls",
        "----------------------------",
    ]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def nanotron_library_logger() -> Iterator[_Lines]:
    """nanotron's logging setup (src/nanotron/logging/base.py, commit a5f8fb1): the library
    root logger "nanotron" gets its own handler (_configure_library_root_logger), and
    set_verbosity / set_formatter configure every logger named "nanotron.*" that exists."""
    root = logging.getLogger("nanotron")
    saved = (root.level, root.propagate, list(root.handlers))
    handler = _Lines()
    root.handlers = [handler]
    root.propagate = False
    yield handler
    root.setLevel(saved[0])
    root.propagate = saved[1]
    root.handlers = saved[2]
    logging.getLogger("nanotron.logging.timers").setLevel(logging.NOTSET)


def test_log_all_follows_nanotrons_logging_configuration(
    clock: FakeClock, nanotron_library_logger: _Lines
) -> None:
    with nanotron_timer("forward", timer_type="cpu"):
        clock.advance(0.002)
    mine = logging.getLogger("nanotron.logging.timers")
    # set_verbosity(INFO) walks logging.root.manager.loggerDict for "nanotron.*" loggers:
    # the compat module's logger is one of them from import on
    assert logging.root.manager.loggerDict.get("nanotron.logging.timers") is mine
    logging.getLogger("nanotron").setLevel(logging.INFO)
    at_the_root = _Lines()
    logging.getLogger().addHandler(at_the_root)
    try:
        nanotron_timer.log_all()
    finally:
        logging.getLogger().removeHandler(at_the_root)
    assert nanotron_library_logger.lines == [
        "INFO ---- Timing Information ----",
        "INFO Timer 'forward' (cpu): 2.00ms total, 2.00ms avg, 1 calls",
        "INFO ----------------------------",
    ]
    assert at_the_root.lines == []  # nanotron's library root logger does not propagate
    nanotron_library_logger.lines.clear()
    mine.setLevel(logging.WARNING)  # set_verbosity(WARNING): nanotron's default
    nanotron_timer.log_all()
    assert nanotron_library_logger.lines == []


# -- feeding the instrument registry -------------------------------------------------------


def test_records_feed_the_registry_after_compat_to_registry(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    before = nanotron_timer("early")  # created before: not fed (checked at creation)
    compat.to_registry()
    with instrument.timed("step"):
        for seconds in (0.25, 0.5):
            with nanotron_timer("forward"):
                clock.advance(seconds)
        with before:
            clock.advance(1.0)
    report = reporter.flush()
    assert report.paths() == ("step", "step/forward")
    assert report["step/forward"].count == nanotron_timer("forward").call_count == 2
    assert report["step/forward"].total == nanotron_timer("forward").total_time == 0.75


def test_an_exception_closes_the_registry_region_too(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    compat.to_registry()

    def fails() -> None:
        with nanotron_timer("outer"):
            clock.advance(0.5)
            raise KeyError("in the block")

    with pytest.raises(KeyError, match="in the block"):
        fails()
    with instrument.timed("after"):  # not nested under a region left open
        clock.advance(0.25)
    assert set(reporter.flush().paths()) == {"after", "outer"}


def test_disabled_records_feed_nothing(reporter: instrument.Reporter, clock: FakeClock) -> None:
    compat.to_registry()
    Timers.disable()
    with nanotron_timer("x"):
        clock.advance(0.5)
    assert reporter.flush().paths() == ()


# -- no CUDA: CPU fallback ------------------------------------------------------------


@no_cuda
def test_cuda_timer_falls_back_to_cpu_and_warns_once() -> None:
    with pytest.warns(RuntimeWarning, match="CUDA is not available; falling back to the CPU"):
        timer = nanotron_timer("gpu_work")  # timer_type="cuda" by default
    assert timer.timer_type is TimerType.CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nanotron_timer("gpu_work") is timer  # asked for "cuda" again: no conflict
        nanotron_timer("other", timer_type="cuda", cuda_sync=True)
    with timer:
        pass
    assert timer.call_count == 1
    assert timer.total_time == timer.elapsed > 0.0  # the one CPU interval, really timed


# -- CUDA events ------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_cuda_timer_times_device_work_in_seconds() -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timer = nanotron_timer("sleep")
    assert timer.timer_type is TimerType.CUDA
    for _ in range(3):
        with timer:
            torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
    assert timer.call_count == 3
    assert 0.0 < timer.elapsed < 1.0
    assert timer.total_time > timer.elapsed


@pytest.mark.cuda
@needs_cuda
def test_cuda_sync_synchronizes_at_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    calls: list[str] = []
    real = torch.cuda.synchronize

    def counting_synchronize(device: object = None) -> None:
        calls.append("sync")
        real()

    monkeypatch.setattr(torch.cuda, "synchronize", counting_synchronize)
    with nanotron_timer("plain"):
        pass
    assert calls == []
    with nanotron_timer("synced", cuda_sync=True):
        pass
    assert calls == ["sync", "sync"]


@pytest.mark.cuda
@needs_cuda
def test_cuda_event_pairs_stay_bounded_over_many_calls() -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timer = nanotron_timer("many")
    for _ in range(5 * nanotron.FOLD_AT):
        with timer:
            pass
        torch.cuda.synchronize()
    assert len(timer._cuda_events) < nanotron.FOLD_AT
    assert timer.call_count == 5 * nanotron.FOLD_AT
    assert timer.total_time > 0.0
    assert timer._cuda_events == []
