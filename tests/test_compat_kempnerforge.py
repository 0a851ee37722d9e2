"""instrument.compat.kempnerforge: KempnerForge's CUDATimer / CUDATimerCollection, ported."""

from __future__ import annotations

import inspect
import time
import warnings

import pytest
import torch
from compat_helpers import ClockThatMustNotBeRead, needs_cuda, no_cuda

import instrument
from instrument import compat
from instrument.compat import kempnerforge
from instrument.compat.kempnerforge import CUDATimer, CUDATimerCollection
from instrument.testing import FakeClock, use_clock

# -- CUDATimer ------------------------------------------------------------------------------


def test_timer_reports_the_last_interval_in_milliseconds(clock: FakeClock) -> None:
    timer = CUDATimer()
    timer.start()
    clock.advance(0.012)
    timer.stop()
    assert timer.elapsed_ms() == 12.0
    timer.start()
    clock.advance(0.003)
    timer.stop()
    assert timer.elapsed_ms() == 3.0  # the last interval, not a sum
    assert timer.elapsed_ms() == 3.0  # reading twice changes nothing


def test_timer_elapsed_before_any_interval_raises(clock: FakeClock) -> None:
    timer = CUDATimer()
    with pytest.raises(RuntimeError, match="before any start\\(\\)/stop\\(\\) interval completed"):
        timer.elapsed_ms()
    timer.start()
    with pytest.raises(RuntimeError, match="call start\\(\\) and stop\\(\\) first"):
        timer.elapsed_ms()


def test_timer_stop_without_start_warns_once_and_is_ignored(clock: FakeClock) -> None:
    timer = CUDATimer(name="fwd")
    with pytest.warns(RuntimeWarning, match="'fwd': stop\\(\\) called without start\\(\\)"):
        timer.stop()
    assert not timer.completed
    timer.start()
    clock.advance(0.002)
    timer.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timer.stop()  # warned once already; still ignored
    assert timer.elapsed_ms() == 2.0


def test_timer_restart_while_running_times_from_the_second_start(clock: FakeClock) -> None:
    timer = CUDATimer()
    timer.start()
    clock.advance(0.001)
    timer.stop()
    timer.start()
    clock.advance(0.5)
    timer.start()  # restart, as KempnerForge's start() re-records the start event
    assert timer.running
    assert timer.elapsed_ms() == 1.0  # still the previous completed interval
    clock.advance(0.004)
    timer.stop()
    assert timer.elapsed_ms() == 4.0


def test_timer_name_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="non-empty string, got ''"):
        CUDATimer(name="")


# -- CUDATimerCollection ------------------------------------------------------------------


def test_collection_times_each_region_in_milliseconds(clock: FakeClock) -> None:
    timers = CUDATimerCollection(regions=["forward", "backward", "comm"])
    assert timers.enabled
    timers.start("forward")
    clock.advance(0.0123)
    timers.stop("forward")
    timers.start("backward")
    clock.advance(0.0081)
    timers.stop("backward")
    assert timers.elapsed_ms("forward") == pytest.approx(12.3)
    assert timers.elapsed_all() == pytest.approx({"forward": 12.3, "backward": 8.1, "comm": 0.0})
    assert list(timers.elapsed_all()) == ["forward", "backward", "comm"]


def test_collection_regions_in_their_first_interval_report_zero(clock: FakeClock) -> None:
    timers = CUDATimerCollection(["a", "b"])
    timers.start("a")
    clock.advance(1.0)
    assert timers.elapsed_all() == {"a": 0.0, "b": 0.0}
    timers.stop("a")
    timers.start("a")  # running again: the completed interval is still reported
    clock.advance(2.0)
    assert timers.elapsed_all() == {"a": 1000.0, "b": 0.0}


def test_collection_elapsed_ms_of_a_never_timed_region_raises(clock: FakeClock) -> None:
    timers = CUDATimerCollection(["a"])
    with pytest.raises(RuntimeError, match="CUDATimer 'a'"):
        timers.elapsed_ms("a")


def test_collection_unknown_region_names_the_known_ones(clock: FakeClock) -> None:
    timers = CUDATimerCollection(["forward", "backward"])
    for call in (timers.start, timers.stop, timers.elapsed_ms):
        with pytest.raises(KeyError, match=r"unknown region 'fwd'.*\['forward', 'backward'\]"):
            call("fwd")


def test_disabled_collection_reads_no_clock_and_builds_no_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_timers(**kwargs: object) -> CUDATimer:
        raise AssertionError("a timer was built")

    monkeypatch.setattr(kempnerforge, "CUDATimer", no_timers)
    with use_clock(ClockThatMustNotBeRead()):
        timers = CUDATimerCollection(regions=["forward", "backward"], enabled=False)
        assert not timers.enabled
        timers.start("forward")
        timers.stop("forward")
        timers.start("not-a-region")  # a true no-op: nothing is even looked up
        assert timers.elapsed_ms("forward") == 0.0
        assert timers.elapsed_all() == {"forward": 0.0, "backward": 0.0}


def test_disabled_collection_feeds_nothing_to_the_registry(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    timers = CUDATimerCollection(["forward"], enabled=False, to_registry=True)
    timers.start("forward")
    clock.advance(1.0)
    timers.stop("forward")
    assert reporter.flush().paths() == ()


@pytest.mark.parametrize(
    ("regions", "enabled", "error", "match"),
    [
        ("forward", True, TypeError, "got the string 'forward'; did you mean \\['forward'\\]"),
        (3, True, TypeError, "regions must be a list of region names, got 3"),
        (["ok", ""], True, ValueError, "non-empty string, got ''"),
        (["ok"], "yes", TypeError, "enabled must be True or False, got 'yes'"),
    ],
)
def test_collection_rejects_bad_arguments(
    regions: object, enabled: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        CUDATimerCollection(regions, enabled)  # type: ignore[arg-type]


def test_collection_signature_matches_kempnerforge() -> None:
    params = inspect.signature(CUDATimerCollection).parameters
    assert list(params)[:2] == ["regions", "enabled"]
    assert params["enabled"].default is True
    assert params["regions"].default is inspect.Parameter.empty
    assert params["to_registry"].kind is inspect.Parameter.KEYWORD_ONLY


# -- feeding the instrument registry -------------------------------------------------------


def test_collection_feeds_the_same_timings_to_the_registry(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    timers = CUDATimerCollection(["forward", "backward"], to_registry=True)
    with instrument.timed("step"):
        for seconds in (0.25, 0.5):
            timers.start("forward")
            clock.advance(seconds)
            timers.stop("forward")
        timers.start("backward")
        clock.advance(0.125)
        timers.stop("backward")
    report = reporter.flush()
    assert report["step/forward"].count == 2
    assert report["step/forward"].total == 0.75
    assert report["step/forward"].max * 1000 == timers.elapsed_ms("forward")
    assert report["step/backward"].total * 1000 == timers.elapsed_ms("backward")


def test_the_compat_default_decides_when_the_collection_is_built(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    before = CUDATimerCollection(["a"])
    compat.to_registry()
    after = CUDATimerCollection(["b"])
    opted_out = CUDATimerCollection(["c"], to_registry=False)
    for timers, region in ((before, "a"), (after, "b"), (opted_out, "c")):
        timers.start(region)
        clock.advance(0.001)
        timers.stop(region)
    assert reporter.flush().paths() == ("b",)


# -- no CUDA: host clock -----------------------------------------------------------------


@no_cuda
def test_without_cuda_the_host_clock_is_used_and_warned_about_once() -> None:
    with pytest.warns(RuntimeWarning, match="CUDA is not available; CUDATimer measures host"):
        timer = CUDATimer()
    assert not timer.uses_cuda_events
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CUDATimerCollection(["a", "b"])  # no second warning
    timer.start()
    time.sleep(0.01)
    timer.stop()
    assert timer.elapsed_ms() >= 10.0


def test_an_injected_test_clock_takes_the_host_path_without_a_warning(clock: FakeClock) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timer = CUDATimer()
    assert not timer.uses_cuda_events


# -- CUDA events -------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_cuda_timer_records_events_and_times_device_work() -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timer = CUDATimer()
    assert timer.uses_cuda_events
    timer.start()
    torch.cuda._sleep(2_000_000)  # type: ignore[no-untyped-call]
    timer.stop()
    first = timer.elapsed_ms()
    assert first > 0.0
    timer.start()
    timer.stop()
    assert timer.elapsed_ms() < first  # the last interval, an empty one


@pytest.mark.cuda
@needs_cuda
def test_cuda_collection_start_and_stop_never_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timers = CUDATimerCollection(["forward", "backward", "comm"])
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    timers.start("forward")
    x = torch.randn(256, 256, device="cuda")
    _ = x @ x
    timers.stop("forward")
    assert calls == []
    report = timers.elapsed_all()
    assert report["forward"] > 0.0
    assert report["backward"] == report["comm"] == 0.0


@pytest.mark.cuda
@needs_cuda
def test_cuda_collection_feeds_the_registry(reporter: instrument.Reporter) -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timers = CUDATimerCollection(["forward"], to_registry=True)
    timers.start("forward")
    torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
    timers.stop("forward")
    report = reporter.flush()
    assert report["forward"].count == 1
    assert timers.elapsed_ms("forward") > 0.0
