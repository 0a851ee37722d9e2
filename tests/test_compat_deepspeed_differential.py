"""instrument.compat.deepspeed against the real ``deepspeed.utils.timer``, call for call.

Hypothesis writes random sequences of timer calls — ``start``, ``stop`` (with ``reset`` /
``record``), ``elapsed``, ``mean``, ``reset``, the group's ``log`` and ``get_mean``, and
clock advances — and runs each on DeepSpeed's ``SynchronizedWallClockTimer`` (host timers,
as on a CPU accelerator: ``time.time()``, here read from the test's fake clock) and on
instrument's port (the same fake clock). Every return value, every raised assertion and
every printed line must be the same. The same for ``ThroughputTimer``'s steps, speeds and
printed reports.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import types
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instrument.compat import deepspeed as ours
from instrument.testing import FakeClock, use_clock

ds_timer = pytest.importorskip("deepspeed.utils.timer")
logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # "Setting accelerator to CPU"

NAMES = ("a", "b")

name = st.sampled_from(NAMES)
timer_ops = st.one_of(
    st.tuples(st.just("start"), name),
    st.tuples(st.just("stop"), name, st.booleans(), st.booleans()),
    st.tuples(st.just("elapsed"), name, st.booleans()),
    st.tuples(st.just("mean"), name),
    st.tuples(st.just("reset"), name),
    st.tuples(st.just("advance"), st.integers(0, 2000)),
    st.tuples(
        st.just("log"),
        st.lists(st.sampled_from((*NAMES, "unknown")), max_size=3),
        st.sampled_from((1.0, 2.0, 3.0)),
        st.booleans(),
    ),
    st.tuples(st.just("get_mean"), st.lists(name, max_size=2), st.sampled_from((1.0, 4.0))),
)


@contextlib.contextmanager
def deepspeed_reads(clock: FakeClock) -> Iterator[None]:
    """DeepSpeed's timer module reads ``time.time()`` from the fake clock."""
    real = ds_timer.time
    ds_timer.time = types.SimpleNamespace(time=lambda: clock.seconds)
    try:
        yield
    finally:
        ds_timer.time = real


def run(group: Any, ops: list[tuple[Any, ...]], clock: FakeClock) -> list[Any]:
    """Apply ``ops`` to ``group``; what each returned, raised or printed."""
    out: list[Any] = []
    for op in ops:
        kind = op[0]
        if kind == "advance":
            clock.advance(op[1] / 1000)  # whole milliseconds
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                if kind == "log":
                    result: Any = group.log(list(op[1]), normalizer=op[2], reset=op[3])
                elif kind == "get_mean":
                    result = group.get_mean(list(op[1]), normalizer=op[2])
                else:
                    timer = group(op[1])
                    if kind == "stop":
                        result = timer.stop(reset=op[2], record=op[3])
                    elif kind == "elapsed":
                        result = timer.elapsed(reset=op[2])
                    else:
                        result = getattr(timer, kind)()
        except AssertionError:  # DeepSpeed asserts; the port raises an AssertionError kind
            result = "AssertionError"
        out.append((op, _rounded(result), printed.getvalue()))
    return out


def _rounded(value: Any) -> Any:
    """Floats to 9 significant digits (DeepSpeed subtracts float seconds, the port ints)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_rounded(v) for v in value)
    return value


def check_wall_clock_timer(ops: list[tuple[Any, ...]]) -> None:
    theirs_clock, ours_clock = FakeClock(1000.0), FakeClock(1000.0)
    with deepspeed_reads(theirs_clock):
        theirs = run(ds_timer.SynchronizedWallClockTimer(), ops, theirs_clock)
    with use_clock(ours_clock):
        mine = run(ours.SynchronizedWallClockTimer(to_registry=False), ops, ours_clock)
    assert mine == theirs


timer_programs = given(ops=st.lists(timer_ops, max_size=30))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@timer_programs
def test_synchronized_wall_clock_timer_behaves_like_deepspeeds(ops: list[tuple[Any, ...]]) -> None:
    check_wall_clock_timer(ops)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@timer_programs
def test_synchronized_wall_clock_timer_behaves_like_deepspeeds_in_many_programs(
    ops: list[tuple[Any, ...]],
) -> None:
    check_wall_clock_timer(ops)


throughput_ops = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.integers(1, 500), st.booleans()),  # (never 0 s long)
        st.tuples(st.just("idle"), st.integers(0, 500)),
        st.tuples(st.just("read")),
    ),
    max_size=30,
)

_NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?|-?inf")
_MEMORY = re.compile(r"MemAllocated=[\d.]+GB, MaxMemAllocated=[\d.]+GB")


def _line(text: str) -> str:
    """A printed report with its numbers to 6 digits (DeepSpeed subtracts float epoch
    seconds) and the memory fields left out (the port reads CUDA memory only: 0.0 without
    CUDA, where DeepSpeed's CPU accelerator reports host memory — a documented difference)."""
    text = _MEMORY.sub("MemAllocated=…", text)
    return _NUMBER.sub(lambda m: f"{float(m.group()):.6g}", text)


def check_throughput_timer(
    ops: list[tuple[Any, ...]], batch_size: int, start_step: int, steps_per_output: int | None
) -> None:
    """A micro step is ``start()``, ``ms`` of work, ``stop(global_step=...)``; ``idle`` is
    time between steps; ``read`` takes ``avg_samples_per_sec()``. Where DeepSpeed divides
    by zero or gives a negative rate (no global step after warm-up yet) the port gives
    ``-inf`` (documented); DeepSpeed's ``stop()`` raising ends the comparison."""

    def drive(timer: Any, clock: FakeClock) -> list[Any]:
        out: list[Any] = []
        for op in ops:
            if op[0] == "idle":
                clock.advance(op[1] / 1000)
                continue
            try:
                if op[0] == "read":
                    out.append(("read", _rounded(timer.avg_samples_per_sec())))
                    continue
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    timer.start()
                    clock.advance(op[1] / 1000)
                    timer.stop(global_step=op[2])
            except ZeroDivisionError:
                out.append((op[0], "ZeroDivisionError"))
                if op[0] == "step":
                    break
                continue
            state = (timer.micro_step_count, timer.global_step_count, timer.total_elapsed_time)
            out.append(("step", _rounded(state), _line(printed.getvalue())))
        return out

    config = types.SimpleNamespace(enabled=True, synchronized=False)
    options = {"start_step": start_step, "steps_per_output": steps_per_output}
    theirs_clock, ours_clock = FakeClock(1000.0), FakeClock(1000.0)
    with deepspeed_reads(theirs_clock):
        theirs = drive(
            ds_timer.ThroughputTimer(config, batch_size, logging_fn=print, **options),
            theirs_clock,
        )
    with use_clock(ours_clock):
        mine = drive(
            ours.ThroughputTimer(config, batch_size, logging_fn=print, **options), ours_clock
        )
    for their, my in zip(theirs, mine, strict=False):
        if their == ("step", "ZeroDivisionError"):  # DeepSpeed's report divided by zero
            assert "RunningAvgSamplesPerSec=-inf" in my[2]
            return
        if their[0] == "read" and (their[1] == "ZeroDivisionError" or their[1] < 0):
            assert my == ("read", float("-inf"))
            continue
        assert my == their
    assert len(mine) == len(theirs)


throughput_programs = given(
    ops=throughput_ops,
    batch_size=st.sampled_from((1, 8, 32)),
    start_step=st.integers(0, 3),
    steps_per_output=st.sampled_from((None, 1, 2, 3)),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@throughput_programs
def test_throughput_timer_behaves_like_deepspeeds(
    ops: list[tuple[Any, ...]], batch_size: int, start_step: int, steps_per_output: int | None
) -> None:
    check_throughput_timer(ops, batch_size, start_step, steps_per_output)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@throughput_programs
def test_throughput_timer_behaves_like_deepspeeds_in_many_programs(
    ops: list[tuple[Any, ...]], batch_size: int, start_step: int, steps_per_output: int | None
) -> None:
    check_throughput_timer(ops, batch_size, start_step, steps_per_output)
