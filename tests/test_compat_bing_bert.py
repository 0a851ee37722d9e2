"""instrument.compat.bing_bert: DeepSpeedExamples' bing_bert/timer.py, ported."""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from typing import Any

import pytest
import torch
from compat_helpers import (
    positional_signature,
    printed,
    stub_torch_distributed,
    timed_interval,
    timed_on_a_fresh_clock,
)
from distributed_helpers import run_ranks

import instrument
from instrument import clocks, compat
from instrument.compat import bing_bert
from instrument.compat.bing_bert import (
    SynchronizedWallClockTimer,
    ThroughputTimer,
    TimerArgumentError,
    print_rank_0,
)
from instrument.testing import FakeClock, use_clock


def _steps(tput: ThroughputTimer, clock: FakeClock, seconds: list[float]) -> None:
    for step_seconds in seconds:
        tput.start()
        clock.advance(step_seconds)
        tput.stop()


def test_print_rank_0_without_a_process_group_prints(capsys: pytest.CaptureFixture[str]) -> None:
    print_rank_0("hello")
    print_rank_0(3)
    assert capsys.readouterr().out == "hello\n3\n"


def test_print_rank_0_and_log_ask_a_stubbed_torch_distributed(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    # bing_bert/timer.py print_rank_0 looks up torch.distributed when called
    # (``torch.distributed.get_rank() == 0``); a stub module (as NeMo's tests install) answers
    stub = stub_torch_distributed(monkeypatch, rank=1, world_size=2)
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "forward", 0.5, clock)
    print_rank_0("hello")
    timers.log(["forward"], reset=False)
    assert capsys.readouterr().out == ""  # rank 1
    stub.get_rank = lambda: 0
    print_rank_0("hello")
    timers.log(["forward"])
    assert capsys.readouterr().out == "hello\ntime (ms) | forward: 500.00\n"


# -- SynchronizedWallClockTimer -------------------------------------------------------------


def test_timers_wait_for_the_device_at_both_ends(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(bing_bert, "_sync_device", lambda: calls.append("sync"))
    timer = SynchronizedWallClockTimer()("forward")
    timer.start()
    timer.stop()
    assert calls == ["sync", "sync"]
    timer.start()
    timer.elapsed()  # a running timer is stopped and restarted: two more
    assert len(calls) == 5


def test_the_device_is_synchronized_only_when_cuda_is_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    synced: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append("sync"))
    monkeypatch.setattr(clocks, "cuda_ready", lambda: False)
    bing_bert._sync_device()
    assert synced == []  # the original calls torch.cuda.synchronize() and fails without CUDA
    monkeypatch.setattr(clocks, "cuda_ready", lambda: True)
    bing_bert._sync_device()
    assert synced == ["sync"]


def test_log_prints_milliseconds_in_the_original_format(clock: FakeClock) -> None:
    timers = SynchronizedWallClockTimer()
    timed_interval(timers, "forward", 0.25, clock)
    timed_interval(timers, "backward", 0.5, clock)
    out = printed(timers.log, ["forward", "backward"], normalizer=2)
    assert out == "time (ms) | forward: 125.00 | backward: 250.00\n"
    out = printed(timers.log, ["forward"], reset=False)
    assert out == "time (ms) | forward: 0.00\n"  # the first log reset the timers


@pytest.mark.parametrize(
    ("names", "normalizer", "error", "match"),
    [
        (["forward", "nope"], 1.0, KeyError, "unknown timers \\['nope'\\]; this group holds"),
        ("forward", 1.0, TypeError, "got the string 'forward'"),
        (["forward"], 0, AssertionError, "normalizer must be a number > 0, got 0"),
        (["forward"], None, TimerArgumentError, "normalizer must be a number > 0, got None"),
    ],
)
def test_log_rejects_bad_arguments(
    names: Any, normalizer: Any, error: type[Exception], match: str
) -> None:
    timers = SynchronizedWallClockTimer()
    timers("forward")
    with pytest.raises(error, match=match):
        timers.log(names, normalizer=normalizer)


# -- ThroughputTimer ------------------------------------------------------------------------


# Upstream: microsoft/DeepSpeedExamples bing_bert/timer.py (commit d02b867), ThroughputTimer:
# stop() does ``self.count += 1; if self.count >= self.start_step: self.total_elapsed_time +=
# ...``, and avg_samples_per_sec / avg_steps_per_sec / print_elapsed_time divide by
# ``(self.count - 2.0)`` once ``self.count > 2`` (else -999).


def test_throughput_is_minus_999_until_a_third_step(clock: FakeClock) -> None:
    tput = ThroughputTimer(name="bert", batch_size=4, num_workers=2)
    assert tput.avg_samples_per_sec() == tput.avg_steps_per_sec() == -999
    _steps(tput, clock, [5.0, 5.0])
    assert tput.count == 2
    assert tput.total_elapsed_time == 5.0  # upstream: count >= start_step adds step 2
    assert tput.avg_samples_per_sec() == tput.avg_steps_per_sec() == -999


def test_throughput_reproduces_the_original_figures_by_default(clock: FakeClock) -> None:
    """The issue's example: 3 steps of 1 s, 80 samples per step -> 40.0 samples/s upstream."""
    tput = ThroughputTimer(name="bert", batch_size=40, num_workers=2)
    _steps(tput, clock, [1.0, 1.0, 1.0])
    assert tput.total_elapsed_time == 2.0  # steps 2 and 3
    assert tput.avg_samples_per_sec() == 40.0  # 80 / (2.0 / (3 - 2))
    assert tput.avg_steps_per_sec() == 0.5
    _steps(tput, clock, [5.0, 5.0])  # count 5: (2 + 10) s over 3 steps
    assert tput.avg_steps_per_sec() == pytest.approx(3 / 12.0)
    assert tput.avg_samples_per_sec() == pytest.approx(80 * 3 / 12.0)


def test_corrected_leaves_out_exactly_start_step_steps(clock: FakeClock) -> None:
    tput = ThroughputTimer(name="bert", batch_size=40, num_workers=2, corrected=True)
    _steps(tput, clock, [1.0, 1.0, 1.0])
    assert tput.avg_samples_per_sec() == 80.0  # the corrected figure
    _steps(tput, clock, [0.5, 0.75])
    assert tput.total_elapsed_time == 2.25
    assert tput.avg_steps_per_sec() == pytest.approx(3 / 2.25)
    assert tput.avg_samples_per_sec() == pytest.approx(80 * 3 / 2.25)


def test_the_original_ignores_start_step_in_the_divisor(clock: FakeClock) -> None:
    tput = ThroughputTimer(batch_size=10, start_step=0)
    _steps(tput, clock, [0.5])
    assert tput.avg_samples_per_sec() == -999  # upstream: nothing before count > 2
    tput = ThroughputTimer(batch_size=10, start_step=3)
    _steps(tput, clock, [9.0, 9.0, 9.0])
    assert tput.avg_samples_per_sec() == pytest.approx(10 / 9.0)  # step 3 over 3 - 2
    _steps(tput, clock, [0.25])
    assert tput.avg_samples_per_sec() == pytest.approx(10 / (9.25 / 2))


def test_corrected_honours_a_different_start_step(clock: FakeClock) -> None:
    tput = ThroughputTimer(batch_size=10, start_step=0, corrected=True)
    _steps(tput, clock, [0.5])
    assert tput.avg_samples_per_sec() == pytest.approx(20.0)
    tput = ThroughputTimer(batch_size=10, start_step=3, corrected=True)
    _steps(tput, clock, [9.0, 9.0, 9.0])
    assert tput.avg_samples_per_sec() == -999
    _steps(tput, clock, [0.25])
    assert tput.avg_samples_per_sec() == pytest.approx(40.0)


def test_corrected_must_be_a_bool() -> None:
    with pytest.raises(TimerArgumentError, match="corrected must be True or False"):
        ThroughputTimer(corrected=1)  # type: ignore[arg-type]


def test_throughput_cond_false_does_nothing_and_start_restarts(clock: FakeClock) -> None:
    tput = ThroughputTimer(start_step=0)
    tput.start(cond=False)
    assert not tput.started
    tput.start()
    clock.advance(7.0)
    tput.stop(cond=False)
    assert tput.started
    tput.start()  # restarts: the 7 s before are not counted
    clock.advance(0.5)
    tput.stop()
    assert (tput.count, tput.total_elapsed_time) == (1, 0.5)


def test_throughput_stop_without_start_warns_once_instead_of_exiting(clock: FakeClock) -> None:
    tput = ThroughputTimer(name="bert")
    with pytest.warns(RuntimeWarning, match="'bert': Cannot stop timer without starting"):
        tput.stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tput.stop()  # warned once already; still ignored
    assert tput.count == 0


def test_print_elapsed_time_prints_every_1000_steps_with_tflops(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    tput = ThroughputTimer(name="bert", batch_size=8)
    _steps(tput, clock, [0.5] * 999)
    tput.print_elapsed_time(num_ops=1e12)
    assert capsys.readouterr().out == ""  # step 999: not a multiple of 1000
    _steps(tput, clock, [0.5])
    tput.print_elapsed_time()
    tput.print_elapsed_time(num_ops=2e12)
    seconds = 999 * 0.5 / 998  # upstream: steps 2..1000 over count - 2
    assert capsys.readouterr().out == (
        f"bert  forward pass execution time:  {seconds}\n"
        f"bert  forward pass execution time:  {seconds}  TFlops :  {2e12 / (seconds * 1e12)}\n"
    )
    corrected = ThroughputTimer(name="bert", batch_size=8, corrected=True)
    _steps(corrected, clock, [0.5] * 1000)
    corrected.print_elapsed_time(num_ops=2e12)
    assert capsys.readouterr().out == "bert  forward pass execution time:  0.5  TFlops :  4.0\n"


def test_print_elapsed_time_prints_nothing_before_warm_up_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tput = ThroughputTimer(start_step=1000)
    tput.count = 1000
    tput.print_elapsed_time(num_ops=1.0)
    assert capsys.readouterr().out == ""


def test_throughput_on_the_host_clock_tracks_real_step_time() -> None:
    with use_clock("cpu"):
        tput = ThroughputTimer(batch_size=10, start_step=1)
        for _ in range(3):
            tput.start()
            time.sleep(0.01)
            tput.stop()
    assert 10 < tput.avg_samples_per_sec() <= 10 / 0.01


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"num_workers": 1.5}, "num_workers must be an int >= 1, got 1.5"),
        ({"start_step": -1}, "start_step must be an int >= 0, got -1"),
        ({"name": 3}, "name must be a string or None, got 3"),
    ],
)
def test_throughput_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThroughputTimer(**kwargs)


# -- feeding the instrument registry -------------------------------------------------------


def test_the_compat_default_decides_when_a_throughput_timer_is_built(
    reporter: instrument.Reporter, clock: FakeClock
) -> None:
    before = ThroughputTimer(name="before")
    compat.to_registry()
    tput = ThroughputTimer(name="bert")
    opted_out = ThroughputTimer(name="opted_out", to_registry=False)
    for unfed in (before, opted_out):
        _steps(unfed, clock, [0.5])
    _steps(tput, clock, [0.5, 0.5, 0.5])
    report = reporter.flush()
    assert report.paths() == ("bert",)
    assert report["bert"].count == 3
    assert report["bert"].total == pytest.approx(1.5)


# -- signatures ----------------------------------------------------------------------------

Timer = SynchronizedWallClockTimer.Timer
BING_BERT_SIGNATURES: list[tuple[Any, list[tuple[str, Any]]]] = [
    (print_rank_0, [("message", None)]),
    (Timer.__init__, [("self", None), ("name", None)]),
    (Timer.start, [("self", None)]),
    (Timer.stop, [("self", None)]),
    (Timer.reset, [("self", None)]),
    (Timer.elapsed, [("self", None), ("reset", True)]),
    (SynchronizedWallClockTimer.__init__, [("self", None)]),
    (SynchronizedWallClockTimer.__call__, [("self", None), ("name", None)]),
    (
        SynchronizedWallClockTimer.log,
        [("self", None), ("names", None), ("normalizer", 1.0), ("reset", True)],
    ),
    (
        ThroughputTimer.__init__,
        [
            ("self", None),
            ("name", None),
            ("batch_size", 1),
            ("num_workers", 1),
            ("start_step", 2),
        ],
    ),
    (ThroughputTimer.start, [("self", None), ("cond", True)]),
    (ThroughputTimer.stop, [("self", None), ("cond", True)]),
    (ThroughputTimer.avg_samples_per_sec, [("self", None)]),
    (ThroughputTimer.avg_steps_per_sec, [("self", None)]),
    (ThroughputTimer.print_elapsed_time, [("self", None), ("num_ops", None)]),
]


@pytest.mark.parametrize(("func", "expected"), BING_BERT_SIGNATURES)
def test_positional_signature_matches_bing_bert(func: Any, expected: list[tuple[str, Any]]) -> None:
    assert positional_signature(func) == expected


# -- across ranks (real gloo processes) ----------------------------------------------------


def rank_0_worker(rank: int, world_size: int) -> str:
    """Each rank prints a message and logs its own "forward" of 0.1 * (rank + 1) s."""
    timers = SynchronizedWallClockTimer()
    timed_on_a_fresh_clock(timers, "forward", 0.1 * (rank + 1))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_rank_0(f"hello from {rank}")
        timers.log(["forward"])
    return out.getvalue()


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(60)
def test_only_rank_0_prints() -> None:
    first, second = run_ranks(rank_0_worker, 2, timeout=50)
    assert first == "hello from 0\ntime (ms) | forward: 100.00\n"
    assert second == ""
