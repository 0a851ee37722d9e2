"""instrument.compat.deepspeed: DeepSpeed's deepspeed/utils/timer.py, ported."""

from __future__ import annotations

import inspect
import logging
import re
import sys
import time
import types
from typing import Any

import pytest
import torch
from compat_helpers import (
    ClockThatMustNotBeRead,
    needs_cuda,
    positional_signature,
    printed,
    stub_torch_distributed,
    timed_interval,
    timed_on_a_fresh_clock,
)
from distributed_helpers import run_ranks

import instrument
from instrument import clocks, compat
from instrument.compat import deepspeed
from instrument.compat.deepspeed import (
    NoopTimer,
    SynchronizedWallClockTimer,
    ThroughputTimer,
    ThroughputTimerConfig,
    TimerArgumentError,
    trim_mean,
)
from instrument.testing import FakeClock, use_clock

# -- SynchronizedWallClockTimer.Timer --------------------------------------------------------


def test_elapsed_records_keeps_each_interval_in_milliseconds_until_a_reset(
    clock: FakeClock,
) -> None:
    timer = SynchronizedWallClockTimer()("fwd")
    for seconds in (0.25, 0.5):
        timer.start()
        clock.advance(seconds)
        timer.stop()
    assert timer.elapsed_records is None  # filled in when read
    assert timer.elapsed(reset=False) == 750.0
    assert timer.elapsed_records == [250.0, 500.0]
    timer.elapsed()
    assert timer.elapsed_records is None


def test_mean_is_the_ten_percent_trimmed_mean_and_resets_nothing(clock: FakeClock) -> None:
    timers = SynchronizedWallClockTimer()
    for ms in (1, 2, 3, 4, 5, 6, 7, 8, 9, 1000):  # n=10: the smallest and the largest go
        timed_interval(timers, "fwd", ms / 1000, clock)
    assert timers("fwd").mean() == pytest.approx(5.5)
    assert timers("fwd").elapsed() == pytest.approx(1045.0)  # still all there


@pytest.mark.parametrize(
    ("data", "percent", "expected"),
    [
        ([], 0.1, 0.0),
        ([5.0, 1.0, 3.0], 0.1, 3.0),  # round(0.3) == 0: nothing trimmed
        ([1.0, 2.0, 3.0, 4.0, 100.0], 0.1, 22.0),  # round(0.5) == 0 (round half to even)
        ([1.0, 2.0, 3.0, 4.0, 100.0], 0.2, 3.0),  # round(1.0) == 1
        ([1.0, 2.0], 0.0, 1.5),
    ],
)
def test_trim_mean_matches_deepspeed(data: list[float], percent: float, expected: float) -> None:
    assert trim_mean(list(data), percent) == pytest.approx(expected)


def test_trim_mean_rejects_a_percent_outside_0_to_1() -> None:
    with pytest.raises(AssertionError, match=r"trim_percent must be in \[0, 1\], got 1\.5"):
        trim_mean([1.0], 1.5)


# -- SynchronizedWallClockTimer ---------------------------------------------------------------


def test_get_timers_lists_the_timers_by_name() -> None:
    timers = SynchronizedWallClockTimer()
    timers("fwd")
    timers("bwd")
    assert list(timers.get_timers()) == ["fwd", "bwd"]
    assert isinstance(timers("fwd"), SynchronizedWallClockTimer.Timer)


def test_log_prints_milliseconds_on_rank_0_in_deepspeeds_format(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "fwd", 0.25, clock)
    timed_interval(timers, "bwd", 0.5, clock)
    timers.log(["fwd", "not-a-timer", "bwd"], normalizer=2)  # unknown names are skipped
    # Without a process group DeepSpeed's print_dist prints on every process, as rank -1.
    assert capsys.readouterr().out == "[Rank -1] time (ms) | fwd: 125.00 | bwd: 250.00\n"
    timers.log(["fwd"])  # the first log reset the timers
    assert capsys.readouterr().out == "[Rank -1] time (ms) | fwd: 0.00\n"


def test_log_with_reset_false_keeps_the_times(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "fwd", 0.012345, clock)
    timers.log(["fwd"], reset=False)
    timers.log(["fwd"], reset=False)
    assert capsys.readouterr().out == "[Rank -1] time (ms) | fwd: 12.35\n" * 2


def test_log_ignores_memory_breakdown_as_deepspeed_main_does(clock: FakeClock) -> None:
    # deepspeedai/DeepSpeed deepspeed/utils/timer.py (commit 038beb6), SynchronizedWallClockTimer
    # .log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None): the
    # line is "time (ms)" plus " | {name}: {:.2f}" per timer, then print_dist(string, ranks=
    # ranks or [0]); memory_breakdown is never read.
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "fwd", 0.001, clock)
    assert (
        printed(timers.log, ["fwd"], memory_breakdown=True) == "[Rank -1] time (ms) | fwd: 1.00\n"
    )


def test_log_memory_restores_the_memory_fields_of_older_deepspeed(clock: FakeClock) -> None:
    timers = SynchronizedWallClockTimer(log_memory=True)
    timed_interval(timers, "fwd", 0.001, clock)
    assert printed(timers.log, ["fwd"], reset=False) == "[Rank -1] time (ms) | fwd: 1.00\n"
    out = printed(timers.log, ["fwd"], memory_breakdown=True)
    gb = r"\d+\.\d{4} GB"
    pattern = (
        rf"\[Rank -1\] time \(ms\) \| fwd: 1\.00 \| mem_allocated: {gb} \| max_mem_allocated: "
        rf"{gb} \| cache_allocated: {gb} \| max_cache_allocated: {gb}\n"
    )
    assert re.fullmatch(pattern, out), out
    assert SynchronizedWallClockTimer.memory_usage().startswith(" | mem_allocated: ")
    with pytest.raises(TypeError, match="log_memory must be True or False"):
        SynchronizedWallClockTimer(log_memory="yes")  # type: ignore[arg-type]


def test_log_asks_a_stubbed_torch_distributed_for_the_rank(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    # DeepSpeed's print_dist -> get_dist_msg (deepspeed/utils/logging.py): "[Rank {my_rank}]"
    # on ranks (default [0]), every rank for [-1]; the rank comes from the process group,
    # here a stub module in place of torch.distributed (as NeMo's unit tests install)
    stub = stub_torch_distributed(monkeypatch, rank=1, world_size=2)
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "fwd", 0.002, clock)
    assert printed(timers.log, ["fwd"], reset=False) == ""  # ranks=None: rank 0 only
    assert (
        printed(timers.log, ["fwd"], reset=False, ranks=[-1]) == "[Rank 1] time (ms) | fwd: 2.00\n"
    )
    stub.get_rank = lambda: 0
    assert printed(timers.log, ["fwd"]) == "[Rank 0] time (ms) | fwd: 2.00\n"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"normalizer": 0.0}, AssertionError, "normalizer must be a number > 0, got 0.0"),
        ({"normalizer": "2"}, TimerArgumentError, "normalizer must be a number > 0, got '2'"),
        ({"names": "fwd"}, TypeError, "got the string 'fwd'"),
        ({"ranks": [0, "1"]}, TimerArgumentError, "ranks must be a list of ints or None"),
        ({"ranks": 0}, TimerArgumentError, "ranks must be a list of ints or None, got 0"),
    ],
)
def test_log_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    timers = SynchronizedWallClockTimer()
    with pytest.raises(error, match=match):
        timers.log(**{"names": ["fwd"], **kwargs})


def test_get_mean_is_deepspeeds_number_and_resets_nothing(clock: FakeClock) -> None:
    timers = SynchronizedWallClockTimer()
    for seconds in (0.002, 0.004):
        timed_interval(timers, "fwd", seconds, clock)
    timed_interval(timers, "bwd", 0.010, clock)
    # Timer.mean() is in ms and DeepSpeed multiplies it by 1000 again: kept as is.
    means = timers.get_mean(["fwd", "bwd", "missing"], normalizer=2.0, reset=True)
    assert means == pytest.approx({"fwd": 1500.0, "bwd": 5000.0})
    assert timers("fwd").elapsed() == pytest.approx(6.0)  # reset=True is ignored, as in DeepSpeed
    with pytest.raises(AssertionError, match="normalizer must be a number > 0"):
        timers.get_mean(["fwd"], normalizer=-1)


def test_without_a_test_clock_the_host_clock_times_real_work() -> None:
    with use_clock("cpu"):
        timers = SynchronizedWallClockTimer()
        assert timers("sleep").use_host_timer
        timers("sleep").start()
        time.sleep(0.02)
        timers("sleep").stop()
    assert 20.0 <= timers("sleep").elapsed() < 2000.0


# -- NoopTimer --------------------------------------------------------------------------------


def test_noop_timer_has_the_same_api_and_does_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with use_clock(ClockThatMustNotBeRead()):
        timers = NoopTimer()
        timer = timers("fwd")
        assert timers("bwd") is timer  # one shared timer
        timer.start()
        timer.start()  # no state, so no misuse either
        timer.stop(reset=True, record=True)
        timer.reset()
        assert timer.elapsed(reset=False) == 0
        assert timer.mean() == 0
        assert timers.get_timers() == {}
        timers.log(["fwd"], normalizer=2.0, reset=True, memory_breakdown=True, ranks=[-1])
        # DeepSpeed deepspeed/utils/timer.py (commit 038beb6): NoopTimer.get_mean's body is
        # ``...``, so it returns None
        assert timers.get_mean(["fwd"]) is None
    assert capsys.readouterr().out == ""


def test_noop_timer_feeds_nothing_to_the_registry(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    compat.to_registry()
    timers = NoopTimer()
    timers("fwd").start()
    clock.advance(1.0)
    timers("fwd").stop()
    assert reporter.flush().paths() == ()


# -- ThroughputTimer ------------------------------------------------------------------------


def _steps(tput: ThroughputTimer, clock: FakeClock, seconds: list[float], micro: int = 1) -> None:
    """Run one global step per entry of ``seconds``, in ``micro`` equal micro steps."""
    for step_seconds in seconds:
        for i in range(micro):
            tput.start()
            clock.advance(step_seconds / micro)
            tput.stop(global_step=i == micro - 1)


def test_throughput_skips_warm_up_and_gives_batch_size_over_step_time(clock: FakeClock) -> None:
    tput = ThroughputTimer(None, batch_size=32)
    assert tput.avg_samples_per_sec() == float("-inf")
    _steps(tput, clock, [5.0, 5.0])  # start_step=2: two slow warm-up steps, not counted
    assert tput.total_elapsed_time == 0.0
    assert tput.avg_samples_per_sec() == float("-inf")  # DeepSpeed: ZeroDivisionError
    _steps(tput, clock, [0.5, 0.25, 0.75])
    assert tput.global_step_count == 5
    assert tput.total_elapsed_time == pytest.approx(1.5)
    assert tput.avg_samples_per_sec() == pytest.approx(32 / 0.5)


def test_throughput_after_one_warm_up_step_is_minus_inf_not_an_error(clock: FakeClock) -> None:
    tput = ThroughputTimer(None, batch_size=8, start_step=2)
    _steps(tput, clock, [1.0])
    assert tput.avg_samples_per_sec() == float("-inf")


def test_throughput_counts_micro_steps_and_global_steps(clock: FakeClock) -> None:
    tput = ThroughputTimer(ThroughputTimerConfig(), batch_size=64, start_step=1)
    _steps(tput, clock, [1.0, 0.4, 0.4], micro=4)
    assert tput.micro_step_count == 12
    assert tput.global_step_count == 3
    assert tput.total_elapsed_time == pytest.approx(0.8)  # micro steps of global steps 2 and 3
    assert tput.avg_samples_per_sec() == pytest.approx(64 / 0.4)
    tput.update_epoch_count()
    assert (tput.epoch_count, tput.micro_step_count, tput.global_step_count) == (1, 0, 3)


def test_throughput_with_start_step_0_counts_from_the_first_step(clock: FakeClock) -> None:
    tput = ThroughputTimer(None, batch_size=None, start_step=0)  # None: batch_size 1
    _steps(tput, clock, [0.5])
    assert tput.batch_size == 1
    assert tput.avg_samples_per_sec() == pytest.approx(2.0)


def test_throughput_reports_every_steps_per_output_global_steps(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clocks, "cuda_ready", lambda: False)  # memory reads 0 without CUDA
    lines: list[str] = []
    tput = ThroughputTimer(None, batch_size=10, steps_per_output=2, logging_fn=lines.append)
    _steps(tput, clock, [1.0, 1.0, 0.5, 0.5, 0.25], micro=2)
    tput.start()
    clock.advance(0.25)
    tput.stop(global_step=True, report_speed=False)  # global step 6: a boundary, not reported
    assert lines == [
        "epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec=20.0, "
        f"CurrSamplesPerSec={10 / (0.5 + 1e-6)}, MemAllocated=0.0GB, MaxMemAllocated=0.0GB"
    ]


def test_throughput_default_logging_goes_to_the_info_log(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    tput = ThroughputTimer(None, batch_size=4, start_step=0, steps_per_output=1)
    with caplog.at_level(logging.INFO, logger="instrument.compat.deepspeed"):
        _steps(tput, clock, [0.5])
    assert [r.getMessage().split(", ")[:2] for r in caplog.records] == [
        ["epoch=0/micro_step=1/global_step=1", "RunningAvgSamplesPerSec=8.0"]
    ]


def test_throughput_monitor_memory_adds_a_psutil_line(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("psutil")
    fake.virtual_memory = lambda: types.SimpleNamespace(percent=12.5)  # type: ignore[attr-defined]
    fake.swap_memory = lambda: types.SimpleNamespace(percent=3.0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "psutil", fake)
    lines: list[str] = []
    tput = ThroughputTimer(
        None, 1, start_step=0, steps_per_output=1, monitor_memory=True, logging_fn=lines.append
    )
    _steps(tput, clock, [1.0])
    assert lines[1] == "epoch=0/micro_step=1/global_step=1, vm %: 12.5, swap %: 3.0"


def test_throughput_monitor_memory_without_psutil_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # makes `import psutil` fail
    # DeepSpeed's own words (deepspeed/utils/timer.py, ThroughputTimer.__init__) come first
    with pytest.raises(ImportError, match="Unable to import 'psutils', please install package"):
        ThroughputTimer(None, 1, monitor_memory=True)
    with pytest.raises(ImportError, match="needs psutil \\(pip install psutil\\)"):
        ThroughputTimer(None, 1, monitor_memory=True)


def test_throughput_disabled_config_counts_nothing(clock: FakeClock) -> None:
    config = types.SimpleNamespace(enabled=False, synchronized=False)
    tput = ThroughputTimer(config, batch_size=8, start_step=0)
    _steps(tput, clock, [1.0, 1.0])
    assert (tput.micro_step_count, tput.global_step_count, tput.initialized) == (0, 0, False)
    config.enabled = True  # read on every call, as in DeepSpeed
    _steps(tput, clock, [0.5])
    assert tput.avg_samples_per_sec() == pytest.approx(16.0)


def test_throughput_stop_without_start_does_nothing(clock: FakeClock) -> None:
    tput = ThroughputTimer({"synchronized": False}, batch_size=8)
    tput.stop(global_step=True)
    assert (tput.micro_step_count, tput.global_step_count) == (0, 0)


def test_throughput_synchronizes_only_timed_steps_and_only_when_asked(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(deepspeed, "_sync_device", lambda: syncs.append(1))
    _steps(ThroughputTimer({"synchronized": False}, 8, start_step=0), clock, [1.0])
    assert syncs == []
    _steps(ThroughputTimer(None, 8, start_step=1), clock, [1.0, 1.0])  # synchronized=True
    assert syncs == [1, 1]  # start and stop of the one step after warm-up


def test_steps_per_output_rejects_zero() -> None:
    # Both wordings DeepSpeed has used: deepspeedai/DeepSpeed tests/unit/utils/test_timer.py
    # (commit b7b23dd) matches "steps_per_output must be greater than 0"; DeepSpeed main's
    # ThroughputTimer.__init__ (deepspeed/utils/timer.py, commit 038beb6) raises
    # "steps_per_output must be a positive integer or None, got 0".
    config = types.SimpleNamespace(enabled=True, synchronized=False)
    with pytest.raises(ValueError, match="steps_per_output must be greater than 0"):
        ThroughputTimer(config=config, batch_size=1, steps_per_output=0)
    with pytest.raises(
        ValueError, match="steps_per_output must be a positive integer or None, got 0"
    ):
        ThroughputTimer(config=config, batch_size=1, steps_per_output=0)


def test_steps_per_output_changed_to_zero_after_construction_raises_at_the_boundary(
    clock: FakeClock,
) -> None:
    # DeepSpeed main, ThroughputTimer._is_report_boundary: "steps_per_output must be a
    # positive integer, got {self.steps_per_output}" (a guard against mutation,
    # deepspeedai/DeepSpeed#7838)
    tput = ThroughputTimer(None, 1, start_step=0, steps_per_output=2, logging_fn=print)
    tput.steps_per_output = 0
    tput.start()
    clock.advance(1.0)
    with pytest.raises(ValueError, match="steps_per_output must be a positive integer, got 0"):
        tput.stop(global_step=True)


def test_steps_per_output_rejects_non_integral() -> None:
    with pytest.raises(ValueError, match="steps_per_output must be a positive integer or None"):
        ThroughputTimer(config=None, batch_size=1, steps_per_output=1.5)  # type: ignore[arg-type]


def test_report_boundary_for_valid_steps_per_output() -> None:
    timer = ThroughputTimer(config=None, batch_size=1, steps_per_output=3)
    timer.global_step_count = 6
    assert timer._is_report_boundary()
    timer.global_step_count = 7
    assert not timer._is_report_boundary()
    assert not ThroughputTimer(None, 1)._is_report_boundary()  # None: never


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((object(), 1), TypeError, "has no enabled, synchronized; pass DeepSpeed's timers_config"),
        (({"enabled": True, "sync": 1}, 1), ValueError, "unknown ThroughputTimer config keys"),
        ((None, 0), ValueError, "batch_size must be a number > 0 or None, got 0"),
        ((None, 1, -1), ValueError, "start_step must be an int >= 0, got -1"),
        ((None, 1, 2, None, False, "log"), TypeError, "logging_fn must be callable"),
    ],
)
def test_throughput_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ThroughputTimer(*args)


# -- feeding the instrument registry -------------------------------------------------------


def test_throughput_timer_feeds_its_steps_to_the_registry(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    tput = ThroughputTimer(None, batch_size=8, name="train_step", to_registry=True)
    _steps(tput, clock, [1.0, 1.0, 0.5])
    node = reporter.flush()["train_step"]
    assert node.count == 3  # the registry sees warm-up steps too; its reporter skips its own
    assert node.total == pytest.approx(2.5)


# -- signatures ----------------------------------------------------------------------------

Timer = SynchronizedWallClockTimer.Timer
DEEPSPEED_SIGNATURES: list[tuple[Any, list[tuple[str, Any]]]] = [
    (Timer.__init__, [("self", None), ("name", None)]),
    (Timer.start, [("self", None)]),
    (Timer.stop, [("self", None), ("reset", False), ("record", False)]),
    (Timer.reset, [("self", None)]),
    (Timer.elapsed, [("self", None), ("reset", True)]),
    (Timer.mean, [("self", None)]),
    (SynchronizedWallClockTimer.__init__, [("self", None)]),
    (SynchronizedWallClockTimer.__call__, [("self", None), ("name", None)]),
    (SynchronizedWallClockTimer.get_timers, [("self", None)]),
    (SynchronizedWallClockTimer.memory_usage, []),
    *[
        (
            cls.log,
            [
                ("self", None),
                ("names", None),
                ("normalizer", 1.0),
                ("reset", True),
                ("memory_breakdown", False),
                ("ranks", None),
            ],
        )
        for cls in (SynchronizedWallClockTimer, NoopTimer)
    ],
    *[
        (cls.get_mean, [("self", None), ("names", None), ("normalizer", 1.0), ("reset", True)])
        for cls in (SynchronizedWallClockTimer, NoopTimer)
    ],
    (NoopTimer.__init__, [("self", None)]),
    (NoopTimer.__call__, [("self", None), ("name", None)]),
    (
        ThroughputTimer.__init__,
        [
            ("self", None),
            ("config", None),
            ("batch_size", None),
            ("start_step", 2),
            ("steps_per_output", None),
            ("monitor_memory", False),
            ("logging_fn", None),
        ],
    ),
    (ThroughputTimer.start, [("self", None)]),
    (ThroughputTimer.stop, [("self", None), ("global_step", False), ("report_speed", True)]),
    (ThroughputTimer.avg_samples_per_sec, [("self", None)]),
    (ThroughputTimer.update_epoch_count, [("self", None)]),
    (trim_mean, [("data", None), ("trim_percent", None)]),
]


@pytest.mark.parametrize(("func", "expected"), DEEPSPEED_SIGNATURES)
def test_positional_signature_matches_deepspeed(func: Any, expected: list[tuple[str, Any]]) -> None:
    assert positional_signature(func) == expected


def test_extensions_are_keyword_only() -> None:
    for func in (SynchronizedWallClockTimer.__init__, Timer.__init__, ThroughputTimer.__init__):
        params = inspect.signature(func).parameters
        assert params["to_registry"].kind is inspect.Parameter.KEYWORD_ONLY


# -- across ranks (real gloo processes) ----------------------------------------------------


def log_ranks_worker(rank: int, world_size: int) -> dict[str, str]:
    """Each rank times "fwd" for 0.1 * (rank + 1) s and logs it with each ranks filter."""
    timers = SynchronizedWallClockTimer()
    timed_on_a_fresh_clock(timers, "fwd", 0.1 * (rank + 1))
    filters: dict[str, list[int] | None] = {
        "default": None,
        "empty": [],
        "rank1": [1],
        "all": [-1],
        "both": [0, 1],
    }
    return {
        key: printed(timers.log, ["fwd"], reset=False, ranks=ranks)
        for key, ranks in filters.items()
    }


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(60)
def test_log_prints_on_the_ranks_asked_for() -> None:
    first, second = run_ranks(log_ranks_worker, 2, timeout=50)
    line = "[Rank {}] time (ms) | fwd: {:.2f}\n"
    assert first["default"] == first["empty"] == line.format(0, 100.0)
    assert second["default"] == second["empty"] == ""  # default: rank 0 only
    assert first["rank1"] == ""
    assert second["rank1"] == line.format(1, 200.0)  # each rank prints its own time
    for key in ("all", "both"):
        assert first[key] == line.format(0, 100.0)
        assert second[key] == line.format(1, 200.0)


# -- CUDA events -------------------------------------------------------------------------


class StandInEvent:
    """Records a time from a FakeClock; counts how often something waited for it."""

    def __init__(self, clock: FakeClock, log: list[str]) -> None:
        self.clock, self.log, self.at = clock, log, 0.0

    def record(self) -> None:
        self.at = self.clock.seconds
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("wait")

    def elapsed_time(self, end: StandInEvent) -> float:
        return (end.at - self.at) * 1000.0


def test_the_event_path_waits_only_when_read_and_gives_events_back(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    released: list[int] = []

    def record_event() -> StandInEvent:
        event = StandInEvent(clock, log)
        event.record()
        return event

    monkeypatch.setattr(deepspeed, "_records_events", lambda: True)
    monkeypatch.setattr(clocks, "record_event", record_event)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        clocks.events, "release", lambda device, ev: released.extend([device] * len(ev))
    )
    timer = SynchronizedWallClockTimer()("fwd")
    assert not timer.use_host_timer
    for seconds in (0.25, 0.5):
        timer.start()
        clock.advance(seconds)
        timer.stop()
    assert log == ["record"] * 4  # start/stop never wait
    assert timer.elapsed(reset=False) == 750.0
    assert log.count("wait") == 2  # each pair resolved once ...
    assert len(released) == 4  # ... and its events returned to the pool
    assert timer.mean() == 375.0  # resolved times are kept: no second wait
    assert log.count("wait") == 2
    timer.start()
    timer.reset()  # the unpaired start event goes back too
    assert len(released) == 5
    assert timer.elapsed() == 0.0


@pytest.mark.cuda
@needs_cuda
def test_cuda_timer_records_events_without_waiting_for_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timers = SynchronizedWallClockTimer()
    timer = timers("kernel")
    assert not timer.use_host_timer
    syncs: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append("sync"))
    timer.start()
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # a long kernel
    timer.stop()
    assert not torch.cuda.current_stream().query()  # stop() did not wait for it
    assert syncs == []
    kernel_ms = timer.elapsed(reset=False)  # waits for the end event
    assert torch.cuda.current_stream().query()
    assert kernel_ms > 1.0
    timer.start()
    torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
    timer.stop()
    assert timer.elapsed() > kernel_ms  # the sum of both intervals
    assert timer.elapsed() == 0.0


@pytest.mark.cuda
@needs_cuda
def test_cuda_timers_feed_the_registry(reporter: instrument.Reporter) -> None:
    torch.cuda.init()  # type: ignore[no-untyped-call]
    timers = SynchronizedWallClockTimer(to_registry=True)
    timers("kernel").start()
    torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]
    timers("kernel").stop()
    assert timers("kernel").mean() > 0.0
    assert reporter.flush()["kernel"].count == 1
