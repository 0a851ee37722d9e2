"""instrument.compat.startstop: the start/stop timer and timer group that DeepSpeed's and
bing_bert's ``SynchronizedWallClockTimer`` share, checked through both."""

from __future__ import annotations

from typing import Any

import pytest
from compat_helpers import timed_interval

import instrument
from instrument import compat
from instrument.compat import bing_bert, deepspeed
from instrument.compat.errors import TimerArgumentError, TimerStateError
from instrument.compat.startstop import TimerGroup
from instrument.testing import FakeClock

GROUP_CLASSES = [bing_bert.SynchronizedWallClockTimer, deepspeed.SynchronizedWallClockTimer]
#: Each group, and how many of its units make a second.
GROUPS = [
    pytest.param(bing_bert.SynchronizedWallClockTimer, 1.0, id="bing_bert-seconds"),
    pytest.param(deepspeed.SynchronizedWallClockTimer, 1000.0, id="deepspeed-milliseconds"),
]
Group = type[TimerGroup[Any]]


@pytest.mark.parametrize(("group", "unit"), GROUPS)
def test_elapsed_sums_the_intervals_and_resets_by_default(
    group: Group, unit: float, clock: FakeClock
) -> None:
    timers = group()
    timed_interval(timers, "fwd", 0.25, clock)
    clock.advance(3.0)  # between intervals: not counted
    timed_interval(timers, "fwd", 0.5, clock)
    assert timers("fwd").elapsed(reset=False) == 0.75 * unit
    assert timers("fwd").elapsed() == 0.75 * unit
    assert timers("fwd").elapsed() == 0.0


@pytest.mark.parametrize(("group", "unit"), GROUPS)
def test_elapsed_of_a_running_timer_counts_up_to_now_and_keeps_running(
    group: Group, unit: float, clock: FakeClock
) -> None:
    timer = group()("step")
    timer.start()
    clock.advance(0.125)
    assert timer.elapsed() == 0.125 * unit
    assert timer.started_
    clock.advance(0.25)
    timer.stop()
    assert timer.elapsed() == 0.25 * unit  # the first read reset what came before it


# The sources' assertion texts, kept inside the messages: bing_bert/timer.py (DeepSpeedExamples
# commit d02b867) Timer.start ``'timer has already been started'``, Timer.stop ``'timer is not
# started'``; deepspeed/utils/timer.py (DeepSpeed commit 038beb6) Timer.start
# ``f"{self.name_} timer has already been started"``, Timer.stop ``"timer is not started"``.
@pytest.mark.parametrize(
    ("group", "already_started"),
    [
        (bing_bert.SynchronizedWallClockTimer, "timer has already been started: 'fwd'"),
        (deepspeed.SynchronizedWallClockTimer, "fwd timer has already been started"),
    ],
)
def test_start_twice_and_stop_unstarted_raise_the_sources_assertions(
    group: Group, already_started: str, clock: FakeClock
) -> None:
    timer = group()("fwd")
    with pytest.raises(TimerStateError, match="timer is not started: 'fwd'; start\\(\\) it"):
        timer.stop()
    timer.start()
    with pytest.raises(AssertionError, match=already_started):  # as the sources assert it
        timer.start()
    clock.advance(0.5)
    timer.stop()
    assert not timer.started_
    with pytest.raises(TimerStateError, match="is not started"):
        timer.stop()


@pytest.mark.parametrize(("group", "unit"), GROUPS)
def test_reset_drops_every_interval_and_stops_a_running_timer(
    group: Group, unit: float, clock: FakeClock
) -> None:
    timer = group()("fwd")
    timer.start()
    clock.advance(0.5)
    timer.stop()
    timer.start()
    clock.advance(0.5)
    timer.reset()
    assert not timer.started_
    assert timer.elapsed() == 0.0
    timer.start()  # startable again after the reset
    clock.advance(0.25)
    timer.stop()
    assert timer.elapsed() == 0.25 * unit


@pytest.mark.parametrize("group", GROUP_CLASSES)
def test_call_creates_a_timer_once_and_refuses_an_empty_name(group: Group) -> None:
    timers = group()
    assert timers("fwd") is timers("fwd")
    timers("bwd")
    assert list(timers.timers) == ["fwd", "bwd"]
    with pytest.raises(TimerArgumentError, match="non-empty string, got ''"):
        timers("")


@pytest.mark.parametrize(("group", "unit"), GROUPS)
def test_timers_feed_the_same_timings_to_the_registry(
    group: Group, unit: float, reporter: instrument.Reporter, clock: FakeClock
) -> None:
    timers = group(to_registry=True)
    with instrument.timed("step"):
        timed_interval(timers, "fwd", 0.25, clock)
        timed_interval(timers, "fwd", 0.5, clock)
        timers("bwd").start()
        clock.advance(0.125)
        assert timers("bwd").elapsed(reset=False) == 0.125 * unit  # the region is not split
        clock.advance(0.125)
        timers("bwd").stop()
    report = reporter.flush()
    assert report["step/fwd"].count == 2
    assert report["step/fwd"].total * unit == timers("fwd").elapsed() == 0.75 * unit
    assert report["step/bwd"].count == 1
    assert report["step/bwd"].total * unit == timers("bwd").elapsed() == 0.25 * unit


@pytest.mark.parametrize("group", GROUP_CLASSES)
def test_the_compat_default_decides_when_the_group_is_built(
    group: Group, reporter: instrument.Reporter, clock: FakeClock
) -> None:
    before = group()
    compat.to_registry()
    after = group()
    opted_out = group(to_registry=False)
    for timers, name in ((before, "a"), (after, "b"), (opted_out, "c")):
        timed_interval(timers, name, 0.001, clock)
    assert reporter.flush().paths() == ("b",)
