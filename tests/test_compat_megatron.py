"""instrument.compat.megatron: Megatron-LM core / NeMo Automodel timers, ported behaviour."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from compat_helpers import needs_cuda, positional_signature, printed
from distributed_helpers import run_ranks

import instrument
from instrument import compat
from instrument.compat.megatron import (
    DummyTimer,
    Timer,
    TimerArgumentError,
    TimerBase,
    Timers,
    TimerStateError,
)
from instrument.testing import FakeClock, use_clock


def label(name: str) -> str:
    """Megatron's name column: the name, a space, dots up to 48 characters."""
    return name + " " + "." * (47 - len(name))


# -- Timer ---------------------------------------------------------------------------------


def test_start_stop_elapsed_in_seconds_then_reset(clock: FakeClock) -> None:
    timer = Timer("forward")
    timer.start()
    clock.advance(0.25)
    timer.stop()
    assert timer.elapsed() == 0.25
    assert timer.elapsed() == 0.0  # reset=True by default


def test_elapsed_without_reset_keeps_counting(clock: FakeClock) -> None:
    timer = Timer("forward")
    for seconds in (0.1, 0.2):
        timer.start()
        clock.advance(seconds)
        timer.stop()
        clock.advance(1.0)  # stopped: not counted
    assert timer.elapsed(reset=False) == pytest.approx(0.3)
    timer.start()
    clock.advance(0.5)
    timer.stop()
    assert timer.elapsed(reset=False) == pytest.approx(0.8)


def test_elapsed_of_a_running_timer_counts_up_to_now_and_keeps_running(
    clock: FakeClock,
) -> None:
    timer = Timer("interval-time")
    timer.start()
    clock.advance(0.5)
    assert timer.elapsed() == 0.5
    clock.advance(0.25)
    timer.stop()  # still running: no "not started" error
    assert timer.elapsed() == 0.25
    assert timer.active_time() == 0.75


def test_active_time_accumulates_across_resets(clock: FakeClock) -> None:
    timer = Timer("step")
    for seconds in (0.5, 0.25):
        timer.start()
        clock.advance(seconds)
        timer.stop()
        timer.reset()
    assert timer.elapsed() == 0.0
    assert timer.active_time() == 0.75


def test_set_elapsed_injects_a_time() -> None:
    timer = Timer("startup")
    timer.set_elapsed(3.5)
    assert timer.elapsed() == 3.5


def test_reset_stops_a_running_timer_without_counting(clock: FakeClock) -> None:
    timer = Timer("x")
    timer.start()
    clock.advance(1.0)
    timer.reset()
    timer.start()  # not "already started"
    clock.advance(0.5)
    timer.stop()
    assert timer.elapsed() == 0.5


def test_host_clock_agrees_with_an_independent_measurement() -> None:
    timer = Timer("sleep")
    before = time.perf_counter()
    timer.start()
    inner_start = time.perf_counter()
    time.sleep(0.01)
    inner = time.perf_counter() - inner_start
    timer.stop()
    outer = time.perf_counter() - before
    assert inner <= timer.elapsed(reset=False) <= outer


def test_double_start_and_stop_without_start_raise_assertion_compatible_errors() -> None:
    # Megatron megatron/core/timers.py (NVIDIA/Megatron-LM commit 00caa53), Timer.start:
    # ``assert not self._started, 'timer has already been started'``; Timer.stop:
    # ``assert self._started, 'timer is not started'`` -- a match on either still works.
    timer = Timer("forward")
    with pytest.raises(TimerStateError, match=r"timer is not started \('forward'\)"):
        timer.stop()
    timer.start()
    with pytest.raises(AssertionError, match=r"timer has already been started \('forward'\)"):
        timer.start()
    timer.stop()
    with pytest.raises(RuntimeError, match="is not started"):
        timer.stop()


def test_context_manager_and_with_barrier_without_a_process_group(clock: FakeClock) -> None:
    timer = Timer("optimizer")
    assert timer.with_barrier() is timer
    with timer as entered:  # the barrier is a no-op in one process
        assert entered is timer
        assert timer._context_barrier
        clock.advance(0.5)
    assert not timer._context_barrier  # back to the default after the block
    assert timer.elapsed() == 0.5
    timer.set_barrier_group(None)
    timer.start(barrier=True)
    clock.advance(0.25)
    timer.stop(barrier=True)
    assert timer.elapsed() == 0.25


def test_a_raising_block_still_stops_the_timer(clock: FakeClock) -> None:
    timer = Timer("forward")

    def fails() -> None:
        with timer:
            clock.advance(0.5)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        fails()
    assert timer.elapsed() == 0.5


def test_timer_name_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="timer name must be a non-empty string, got 3"):
        Timer(3)  # type: ignore[arg-type]


# -- Timers: levels ------------------------------------------------------------------------


def test_timers_above_the_log_level_are_the_dummy_timer(clock: FakeClock) -> None:
    timers = Timers(log_level=1, log_option="minmax")
    real = timers("forward", log_level=1)
    assert isinstance(real, Timer)
    assert timers("forward") is real  # later calls: the same timer, any level omitted
    dummy = timers("details", log_level=2)
    assert isinstance(dummy, DummyTimer)
    assert timers("unlevelled") is dummy  # no level: 2, above 1
    with dummy:
        clock.advance(1.0)
    dummy.reset()
    with pytest.raises(RuntimeError, match="dummy timer should not be used"):
        dummy.elapsed()
    with pytest.raises(RuntimeError, match="active timer should not be used"):
        dummy.active_time()
    assert "details" not in timers._timers
    assert timers("details", log_level=0) is not dummy  # never registered at level 2


def test_a_name_asked_for_at_another_level_raises() -> None:
    timers = Timers(2, "max")
    timers("forward", log_level=1)
    with pytest.raises(
        AssertionError, match="input log level 2 does not match already existing log level 1"
    ):
        timers("forward", log_level=2)
    assert timers("forward", log_level=1) is timers("forward")


def test_a_level_above_2_keeps_megatrons_words() -> None:
    # Megatron megatron/core/timers.py, Timers.__call__: ``assert log_level <=
    # self._max_log_level, 'log level {} is larger than max supported log level {}'``
    with pytest.raises(
        AssertionError, match="log level 3 is larger than max supported log level 2"
    ):
        Timers(2, "max")("x", log_level=3)


@pytest.mark.parametrize("level", [3, -1, 1.0, True, None])
def test_log_levels_outside_0_to_2_raise(level: Any) -> None:
    with pytest.raises(TimerArgumentError, match="log_level must be 0, 1 or 2"):
        Timers(level, "max")
    if level is not None:
        with pytest.raises(ValueError, match="log_level must be 0, 1 or 2"):
            Timers(2, "max")("x", log_level=level)


def test_unknown_log_option_names_the_choices() -> None:
    # Megatron Timers.__init__: ``assert log_option in allowed_log_options, 'input log option
    # {} is invalid. It must be one of {}'``
    with pytest.raises(AssertionError, match="input log option 'foo' is invalid"):
        Timers(2, "foo")
    with pytest.raises(ValueError, match=r"expected one of 'max', 'minmax', 'all'"):
        Timers(2, "foo")
    with pytest.raises(TimerArgumentError, match="log_to must be 'logger' or 'print', got 'x'"):
        Timers(2, "max", log_to="x")


def test_call_with_barrier_sets_the_context_barrier() -> None:
    timers = Timers(1, "max")
    assert timers("a", 0, barrier=True)._context_barrier
    assert timers("b", 2, barrier=True)._context_barrier  # the dummy too
    with timers("a", barrier=True):
        pass
    assert not timers("a")._context_barrier


# -- Timers: strings, log, write (one rank) ------------------------------------------------


def _timed(timers: Timers, name: str, seconds: float, clock: FakeClock, level: int = 0) -> None:
    with timers(name, log_level=level):
        clock.advance(seconds)


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            "minmax",
            "(min, max) time across ranks (ms):\n"
            f"    {label('forward-backward')}: (250.00, 250.00)\n"
            f"    {label('optimizer')}: (12.50, 12.50)",
        ),
        (
            "max",
            "max time across ranks (ms):\n"
            f"    {label('forward-backward')}: 250.00\n"
            f"    {label('optimizer')}: 12.50",
        ),
        (
            "all",
            "times across ranks (ms):\n"
            "  forward-backward:\n     rank  0: 250.00\n"
            "  optimizer:\n     rank  0: 12.50",
        ),
    ],
)
def test_get_all_timers_string_formats(option: str, expected: str, clock: FakeClock) -> None:
    timers = Timers(2, option)
    _timed(timers, "forward-backward", 0.25, clock)
    _timed(timers, "optimizer", 0.0125, clock)
    timers("never-run", log_level=0)  # held but not run: left out, as Megatron's > 0 filter
    assert timers.get_all_timers_string() == expected
    assert timers.get_all_timers_string() is None  # reset: nothing ran since


def test_normalizer_divides_and_reset_false_keeps(clock: FakeClock) -> None:
    timers = Timers(2, "max")
    _timed(timers, "forward", 0.5, clock)
    assert timers.get_all_timers_string(["forward"], normalizer=10, reset=False) == (
        f"max time across ranks (ms):\n    {label('forward')}: 50.00"
    )
    assert timers("forward").elapsed() == 0.5  # reset=False left it


def test_names_pick_timers_and_unknown_names_are_left_out(clock: FakeClock) -> None:
    timers = Timers(2, "minmax")
    _timed(timers, "a", 0.001, clock)
    _timed(timers, "b", 0.002, clock)
    text = timers.get_all_timers_string(["b", "nope"], barrier=True)
    assert text == f"(min, max) time across ranks (ms):\n    {label('b')}: (2.00, 2.00)"
    assert timers("a").elapsed() == 0.001  # not asked for: not reset


@pytest.mark.parametrize("normalizer", [0, -1.0, float("nan"), "10", True])
def test_normalizer_must_be_positive(normalizer: Any) -> None:
    timers = Timers(2, "max")
    with pytest.raises(AssertionError, match="normalizer must be a number > 0"):
        timers.get_all_timers_string(normalizer=normalizer)
    with pytest.raises(ValueError, match="normalizer must be a number > 0"):
        timers.write(["x"], None, 1, normalizer=normalizer)


def test_names_as_one_string_is_refused() -> None:
    with pytest.raises(TypeError, match="names must be a list of timer names"):
        Timers(2, "max").log("forward")  # type: ignore[arg-type]


def test_log_goes_to_the_megatron_core_timers_logger_at_info(
    clock: FakeClock, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Megatron core >= 0.16, megatron/core/timers.py (NVIDIA/Megatron-LM commit 00caa53):
    # ``logger = logging.getLogger(__name__)`` and Timers.log ends ``if rank ==
    # torch.distributed.get_rank() and output_string is not None: logger.info(output_string)``
    # (rank None -> get_world_size() - 1).
    timers = Timers(2, "minmax")
    _timed(timers, "forward", 0.25, clock)
    with caplog.at_level(logging.INFO, logger="megatron.core.timers"):
        timers.log(["forward"], normalizer=2)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "megatron.core.timers",
            logging.INFO,
            f"(min, max) time across ranks (ms):\n    {label('forward')}: (125.00, 125.00)",
        )
    ]
    assert capsys.readouterr().out == ""  # nothing on raw stdout
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="megatron.core.timers"):
        timers.log(["forward"])  # nothing ran since the reset: nothing logged
    assert caplog.records == []


def test_log_to_print_prints_on_the_last_rank_with_flush(
    clock: FakeClock, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Megatron core <= 0.15 and NeMo Automodel (nemo_automodel/components/training/timers.py,
    # rkalaniNV/Automodel commit 1a5b183): Timers.log ends ``print(output_string, flush=True)``
    timers = Timers(2, "max", log_to="print")
    _timed(timers, "forward", 0.25, clock)
    timers.log(["forward"], normalizer=2)
    assert capsys.readouterr().out == (
        f"max time across ranks (ms):\n    {label('forward')}: 125.00\n"
    )
    timers.log(["forward"])  # nothing ran since the reset: nothing printed
    assert capsys.readouterr().out == ""
    assert caplog.records == []
    with pytest.raises(TimerArgumentError, match=r"rank must be an int in \[0, 0\], got 1"):
        timers.log(["forward"], rank=1)


def test_the_training_log_pattern(clock: FakeClock) -> None:
    """Megatron's training loop: an "interval-time" timer, read with barrier=True, gives
    the "elapsed time per iteration (ms)" figure."""
    timers = Timers(0, "minmax")
    timers("interval-time", log_level=0).start(barrier=True)
    for _ in range(4):
        clock.advance(0.125)
    elapsed = timers("interval-time").elapsed(barrier=True)
    line = f" elapsed time per iteration (ms): {elapsed * 1000.0 / 4:.1f} |"
    assert line == " elapsed time per iteration (ms): 125.0 |"
    clock.advance(0.5)  # still running
    assert timers("interval-time").elapsed() == 0.5


def test_write_to_a_tensorboard_summary_writer(clock: FakeClock, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="needs the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    timers = Timers(2, "minmax")
    _timed(timers, "forward", 0.5, clock)
    _timed(timers, "optimizer", 0.25, clock)
    writer = SummaryWriter(log_dir=str(tmp_path))
    timers.write(["forward", "optimizer", "missing"], writer, iteration=7, normalizer=2)
    _timed(timers, "forward", 1.0, clock)
    timers.write(["forward"], writer, iteration=8)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["forward-time", "optimizer-time"]
    forward = [(e.step, e.value) for e in events.Scalars("forward-time")]
    assert forward == [(7, pytest.approx(0.25)), (8, pytest.approx(1.0))]  # seconds
    assert [(e.step, e.value) for e in events.Scalars("optimizer-time")] == [
        (7, pytest.approx(0.125))
    ]


class FakeWandbRun:
    """What wandb and a wandb run offer the timers: ``log(data, step=...)``."""

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int | None]] = []

    def log(self, data: dict[str, float], step: int | None = None) -> None:
        self.logged.append((data, step))


def test_write_to_a_wandb_like_writer_and_write_to_wandb(clock: FakeClock) -> None:
    timers = Timers(2, "max")
    run = FakeWandbRun()
    _timed(timers, "forward", 0.5, clock)
    timers.write(["forward"], run, iteration=3)
    _timed(timers, "forward", 0.25, clock)
    timers.write_to_wandb(["forward"], run, 4, normalizer=0.5)
    assert run.logged == [({"forward-time": 0.5}, 3), ({"forward-time": 0.5}, 4)]


class PositionalStepWriter:
    """A writer wrapper whose second ``log`` parameter is not called ``step``."""

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []

    def log(self, metrics: dict[str, float], global_iteration: int, /) -> None:
        self.logged.append((metrics, global_iteration))


def test_wandb_writes_pass_the_step_positionally(clock: FakeClock) -> None:
    # NeMo Automodel Timers.write_to_wandb (nemo_automodel/components/training/timers.py,
    # rkalaniNV/Automodel commit 1a5b183) and Megatron core Timers.write's wandb branch
    # (megatron/core/timers.py, commit 00caa53) both call
    # ``writer.log({name + '-time': max_time}, iteration)`` -- the step positional.
    timers = Timers(2, "max")
    writer = PositionalStepWriter()
    _timed(timers, "forward", 0.5, clock)
    timers.write_to_wandb(["forward"], writer, 7)
    _timed(timers, "forward", 0.25, clock)
    timers.write(["forward"], writer, 8)
    assert writer.logged == [({"forward-time": 0.5}, 7), ({"forward-time": 0.25}, 8)]


def test_write_without_a_writer_still_resets_and_a_bad_writer_is_named(clock: FakeClock) -> None:
    timers = Timers(2, "max")
    _timed(timers, "forward", 0.5, clock)
    timers.write(["forward"], None, 1)
    assert timers("forward").elapsed() == 0.0
    with pytest.raises(TypeError, match="neither add_scalar"):
        timers.write(["forward"], object(), 1)
    with pytest.raises(TypeError, match="has no log"):
        timers.write_to_wandb(["forward"], object(), 1)


# -- feeding the instrument registry -------------------------------------------------------


def test_to_registry_sends_the_same_timings_to_a_reporter(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, memory=False)
    timers = Timers(2, "max", to_registry=True)
    with instrument.timed("step"):
        _timed(timers, "forward", 0.25, clock)
        timer = timers("optimizer", log_level=0)
        timer.start()
        clock.advance(0.5)
        assert timer.elapsed() == 0.5  # reading a running timer does not split its region
        clock.advance(0.25)
        timer.stop()
    report = reporter.flush()
    assert report["step/forward"].total == timers("forward").elapsed() == 0.25
    assert report["step/optimizer"].total == 0.75
    assert report["step/optimizer"].count == 1
    reporter.close()


def test_registry_feed_follows_the_global_default(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, memory=False)
    _timed(Timers(2, "max"), "off", 0.25, clock)  # default: not fed
    compat.to_registry()
    _timed(Timers(2, "max"), "on", 0.25, clock)
    _timed(Timers(2, "max", to_registry=False), "refused", 0.25, clock)
    assert reporter.flush().paths() == ("on",)
    reporter.close()


def test_reset_of_a_running_fed_timer_closes_its_region(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, memory=False)
    timer = Timer("load", to_registry=True)
    timer.start()
    clock.advance(0.5)
    timer.reset()
    with instrument.timed("after_reset"):  # not nested under a region left open
        pass
    assert sorted(reporter.flush().paths()) == ["after_reset", "load"]
    reporter.close()


# -- signatures ----------------------------------------------------------------------------

MEGATRON_SIGNATURES: list[tuple[Any, list[tuple[str, Any]]]] = [
    (TimerBase.__init__, [("self", None), ("name", None)]),
    (TimerBase.with_barrier, [("self", None), ("barrier", True)]),
    (Timer.start, [("self", None), ("barrier", False)]),
    (Timer.stop, [("self", None), ("barrier", False)]),
    (Timer.elapsed, [("self", None), ("reset", True), ("barrier", False)]),
    (Timer.set_barrier_group, [("self", None), ("barrier_group", None)]),
    (Timers.__init__, [("self", None), ("log_level", None), ("log_option", None)]),
    (Timers.__call__, [("self", None), ("name", None), ("log_level", None), ("barrier", False)]),
    (
        Timers.get_all_timers_string,
        [("self", None), ("names", None), ("normalizer", 1.0), ("reset", True), ("barrier", False)],
    ),
    (
        Timers.log,
        [
            ("self", None),
            ("names", None),
            ("rank", None),
            ("normalizer", 1.0),
            ("reset", True),
            ("barrier", False),
        ],
    ),
    *[
        (
            method,
            [
                ("self", None),
                ("names", None),
                ("writer", None),
                ("iteration", None),
                ("normalizer", 1.0),
                ("reset", True),
                ("barrier", False),
            ],
        )
        for method in (Timers.write, Timers.write_to_wandb)
    ],
]


@pytest.mark.parametrize(("func", "expected"), MEGATRON_SIGNATURES)
def test_positional_signature_matches_megatron(func: Any, expected: list[tuple[str, Any]]) -> None:
    assert positional_signature(func) == expected


# -- CUDA ----------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_with_cuda_start_and_stop_wait_for_the_device() -> None:
    torch.cuda.init()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timer = Timer("kernel")
    timer.start()
    start.record()
    torch.cuda._sleep(100_000_000)  # a long GPU kernel; launching it returns at once
    end.record()
    timer.stop()
    assert torch.cuda.current_stream().query()  # stop() waited for the kernel
    gpu_seconds = start.elapsed_time(end) / 1000.0
    assert timer.elapsed() >= 0.95 * gpu_seconds


# -- across ranks (real gloo processes) ----------------------------------------------------


def uneven_timers_worker(rank: int, world_size: int) -> dict[str, Any]:
    """Rank r: "forward" takes 0.1 * (r + 1) s; "only_on_1" runs on rank 1 only, and each
    rank also holds a timer of its own, so the ranks' name lists differ."""
    out: dict[str, Any] = {}
    with use_clock(FakeClock()) as clock:
        assert isinstance(clock, FakeClock)
        for option in ("max", "minmax", "all"):
            timers = Timers(2, option, log_to="print")
            _timed(timers, "forward", 0.1 * (rank + 1), clock)
            if rank == 1:
                _timed(timers, "only_on_1", 0.5, clock)
            _timed(timers, f"own_{rank}", 0.01 * (rank + 1), clock)
            out[option] = timers.get_all_timers_string(normalizer=1.0, reset=False)
            out[f"log_last_{option}"] = printed(timers.log, ["forward", "only_on_1"], reset=False)
            asked = [["forward"], ["forward", "only_on_1"], ["only_on_1"]][rank]
            out[f"log_first_{option}"] = printed(timers.log, asked, rank=0, reset=False)
            run = FakeWandbRun()
            timers.write(["forward", "only_on_1"], run, 5)
            out[f"write_{option}"] = run.logged
    return out


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_ranks_with_different_timers_neither_hang_nor_read_zero() -> None:
    results = run_ranks(uneven_timers_worker, 3, timeout=90)
    minmax = (
        "(min, max) time across ranks (ms):\n"
        f"    {label('forward')}: (100.00, 300.00)\n"
        f"    {label('own_0')}: (10.00, 10.00)\n"
        f"    {label('only_on_1')}: (500.00, 500.00)\n"  # rank 1 only: min is not 0
        f"    {label('own_1')}: (20.00, 20.00)\n"
        f"    {label('own_2')}: (30.00, 30.00)"
    )
    every_rank = (
        "times across ranks (ms):\n"
        "  forward:\n     rank  0: 100.00\n     rank  1: 200.00\n     rank  2: 300.00\n"
        "  own_0:\n     rank  0: 10.00\n"
        "  only_on_1:\n     rank  1: 500.00\n"  # no "rank  0: 0.00"
        "  own_1:\n     rank  1: 20.00\n"
        "  own_2:\n     rank  2: 30.00"
    )
    for result in results:  # every rank gets the same, whole picture
        assert result["minmax"] == minmax
        assert result["all"] == every_rank
        assert result["max"].splitlines()[:4] == [
            "max time across ranks (ms):",
            f"    {label('forward')}: 300.00",
            f"    {label('own_0')}: 10.00",
            f"    {label('only_on_1')}: 500.00",
        ]
    first, middle, last = results
    assert last["log_last_minmax"] == (  # rank=None: the last rank prints
        "(min, max) time across ranks (ms):\n"
        f"    {label('forward')}: (100.00, 300.00)\n"
        f"    {label('only_on_1')}: (500.00, 500.00)\n"
    )
    assert first["log_last_minmax"] == middle["log_last_minmax"] == ""
    assert last["log_last_all"].count("rank  0") == 1  # only for forward, not for only_on_1
    # Each rank names different timers: no hang, and each rank gives what it was asked for
    # (rank 2 was not asked for "forward", rank 0 does not hold "only_on_1").
    assert first["log_first_minmax"] == (
        "(min, max) time across ranks (ms):\n"
        f"    {label('forward')}: (100.00, 200.00)\n"
        f"    {label('only_on_1')}: (500.00, 500.00)\n"
    )
    assert middle["log_first_minmax"] == last["log_first_minmax"] == ""
    for result in results:
        assert result["write_max"] == [({"forward-time": 0.3}, 5), ({"only_on_1-time": 0.5}, 5)]


def absent_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 never calls log(): rank 0's barrier times out and it logs its own times."""
    timers = Timers(2, "all", log_to="print", barrier_timeout=timedelta(seconds=1))
    with use_clock(FakeClock()) as clock:
        assert isinstance(clock, FakeClock)
        _timed(timers, "forward", 0.1 * (rank + 1), clock)
    start = time.monotonic()
    printed = io.StringIO()
    if rank == 0:
        with contextlib.redirect_stdout(printed):
            timers.log(["forward"], rank=0, barrier=True)
    else:
        time.sleep(2)
    return {"printed": printed.getvalue(), "seconds": time.monotonic() - start}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_never_logs_makes_a_barrier_time_out_not_hang() -> None:
    first, _ = run_ranks(absent_rank_worker, 2, timeout=60)
    assert first["printed"] == "times across ranks (ms):\n  forward:\n     rank  0: 100.00\n"
    assert first["seconds"] < 10
