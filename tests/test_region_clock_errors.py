"""A clock that raises: the same for ``with``, decorators and ``Timer``, on both paths.

On enter the clock's error propagates and nothing runs or opens. On exit the frame is
closed anyway (the stack stays consistent) and nothing is recorded; the clock's error
propagates only when the block or call succeeded, so the user's exception is never
replaced (``instrument/regions/frames.py``, "clock error").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import instrument
from instrument.testing import use_clock


class ClockBroke(Exception):
    pass


class UserError(Exception):
    pass


class FlakyClock:
    """Returns 0, 1, 2, ... until ``broken`` is set, then raises."""

    def __init__(self) -> None:
        self.broken = False
        self.ns = 0

    def now_ns(self) -> int:
        if self.broken:
            raise ClockBroke("the clock broke")
        self.ns += 1
        return self.ns


@pytest.fixture
def flaky() -> Iterator[FlakyClock]:
    clock = FlakyClock()
    with use_clock(clock):
        yield clock


def _recorded(reporter: instrument.Reporter) -> tuple[str, ...]:
    return reporter.flush().paths()


def test_with_clock_failing_on_exit_raises_the_clocks_error_and_keeps_the_stack(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    with pytest.raises(ClockBroke), instrument.timed("outer"), instrument.timed("x"):
        flaky.broken = True
    assert instrument.current_path() == ""
    flaky.broken = False
    with instrument.timed("after"):
        assert instrument.current_path() == "after"
    assert "after" in _recorded(reporter)


def test_with_clock_failing_on_exit_never_replaces_the_blocks_exception(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    def block() -> None:
        with instrument.timed("x"):
            flaky.broken = True
            raise UserError

    with pytest.raises(UserError):
        block()
    assert instrument.current_path() == ""


def test_decorated_call_clock_failing_on_exit_behaves_like_with(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    @instrument.timed("ok")
    def ok() -> int:
        flaky.broken = True
        return 1

    @instrument.timed("bad")
    def bad() -> None:
        flaky.broken = True
        raise UserError

    with pytest.raises(ClockBroke):
        ok()
    assert instrument.current_path() == ""
    flaky.broken = False
    with pytest.raises(UserError):
        bad()
    assert instrument.current_path() == ""


def test_async_and_generator_clock_failing_on_exit_behave_like_with(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    @instrument.timed("coro")
    async def coro(fail: bool) -> None:
        flaky.broken = True
        if fail:
            raise UserError

    @instrument.timed("gen")
    def gen(fail: bool) -> Iterator[int]:
        flaky.broken = True
        if fail:
            raise UserError
        yield 1

    for fail, error in ((False, ClockBroke), (True, UserError)):
        flaky.broken = False
        with pytest.raises(error):
            asyncio.run(coro(fail))
        flaky.broken = False
        with pytest.raises(error):
            next(gen(fail))
        assert instrument.current_path() == ""


def test_clock_failing_on_enter_runs_and_opens_nothing(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    ran: list[str] = []

    @instrument.timed("f")
    def f() -> None:
        ran.append("f")

    flaky.broken = True
    with pytest.raises(ClockBroke):
        f()
    with pytest.raises(ClockBroke), instrument.timed("x"):
        ran.append("x")
    assert ran == []
    assert instrument.current_path() == ""


def test_timer_stop_with_a_failing_clock_raises_and_keeps_the_stack(
    flaky: FlakyClock, reporter: instrument.Reporter
) -> None:
    timer = instrument.Timer("t").start()
    flaky.broken = True
    with pytest.raises(ClockBroke):
        timer.stop()
    assert not timer.running
    assert instrument.current_path() == ""


class FloatClock:
    """A clock of the wrong kind: seconds as a float."""

    def now_ns(self) -> float:
        return 1.5

    def __repr__(self) -> str:
        return "FloatClock()"


def test_a_clock_returning_a_float_fails_naming_the_clock_and_the_stack_stays_consistent(
    reporter: instrument.Reporter,
) -> None:
    @instrument.timed("decorated")
    def call() -> None:
        pass

    with use_clock(FloatClock()):
        wrong = r"clock FloatClock\(\): now_ns\(\) must return an int"
        with pytest.raises(TypeError, match=wrong), instrument.timed("block"):
            pass
        with pytest.raises(TypeError, match=r"clock FloatClock\(\)"):
            call()
    with instrument.timed("after"):
        pass
    assert reporter.flush().paths() == ("after",)


def test_a_regions_own_clock_object_times_it(reporter: instrument.Reporter) -> None:
    from instrument.testing import FakeClock

    own = FakeClock()
    with instrument.timed("own", clock=own):
        own.advance(1.5)
    assert reporter.flush()["own"].total == 1.5
