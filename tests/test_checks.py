"""Bad arguments are refused where they are given, naming the argument, the value and what
is accepted — not at the first flush, write or iteration."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from datetime import timedelta

import pytest

import instrument
from instrument import checks
from instrument.reporter import live_reporters
from instrument.sinks import Console, InMemory, Logging
from instrument.sinks.adapt import CallableSink

BAD: dict[str, tuple[Callable[[], object], type[Exception], str]] = {
    "barrier_timeout_text": (
        lambda: instrument.Reporter(barrier=True, barrier_timeout="1s"),
        TypeError,
        "barrier_timeout must be a number of seconds > 0 or a datetime.timedelta, got '1s'",
    ),
    "barrier_timeout_negative": (
        lambda: instrument.Reporter(barrier_timeout=-5),
        ValueError,
        "barrier_timeout must be a number of seconds > 0 or a datetime.timedelta, got -5",
    ),
    "barrier_timeout_zero": (
        lambda: instrument.Reporter(barrier_timeout=timedelta(0)),
        ValueError,
        "got datetime.timedelta(0)",
    ),
    "barrier_timeout_nan": (
        lambda: instrument.Reporter(barrier_timeout=float("nan")),
        ValueError,
        "got nan",
    ),
    "barrier_not_bool": (
        lambda: instrument.Reporter(barrier="yes"),
        TypeError,
        "barrier must be True or False, got 'yes'",
    ),
    "memory_not_bool": (
        lambda: instrument.Reporter(memory="no"),
        TypeError,
        "memory must be True or False, got 'no'",
    ),
    "group": (
        lambda: instrument.Reporter(ranks="minmax", group=[0, 1]),
        TypeError,
        "group must be a torch.distributed process group (e.g. dist.new_group([0, 1])) or "
        "None for the world, got [0, 1]",
    ),
    "barrier_group": (
        lambda: instrument.Reporter(barrier=True, barrier_group="world"),
        TypeError,
        "barrier_group must be a torch.distributed process group",
    ),
    "peak_flops_auto": (
        lambda: instrument.Reporter(peak_flops="auto"),
        ValueError,
        "peak_flops must be a number > 0 or None, got 'auto'",
    ),
    "sinks_text": (
        lambda: instrument.Reporter(sinks="console"),
        TypeError,
        "sinks must be a list of sinks, e.g. [instrument.sinks.Console()]; got 'console'",
    ),
    "sinks_number": (
        lambda: instrument.Reporter(sinks=42),
        TypeError,
        "sinks must be a list of sinks (objects with write(report) or functions taking a "
        "report), e.g. [instrument.sinks.Console()]; got 42",
    ),
    "sinks_item": (
        lambda: instrument.Reporter(sinks=[InMemory(), 3]),
        TypeError,
        "sinks[1]: not a sink: 3; pass an object with write(report)",
    ),
    "sinks_class": (
        lambda: instrument.Reporter(sinks=[Console]),
        TypeError,
        "sinks[0]: not a sink: the class Console; pass an instance, e.g. Console()",
    ),
    "console_stream": (
        lambda: Console(42),  # type: ignore[arg-type]
        TypeError,
        "Console stream must be a text stream with write() (e.g. sys.stderr or an open "
        "file) or None, got 42",
    ),
    "console_unicode": (
        lambda: Console(unicode="yes"),  # type: ignore[arg-type]
        TypeError,
        "Console unicode must be True, False or None, got 'yes'",
    ),
    "logging_logger": (
        lambda: Logging(logger=3),  # type: ignore[arg-type]
        TypeError,
        "Logging logger must be a logging.Logger (or LoggerAdapter) or a logger's name, got 3",
    ),
    "logging_level": (
        lambda: Logging(level="INFO"),  # type: ignore[arg-type]
        TypeError,
        "Logging level must be a logging level int (e.g. logging.INFO), got 'INFO'",
    ),
    "data": (
        lambda: instrument.data(3),  # type: ignore[arg-type]
        TypeError,
        "instrument.data needs an iterable (a DataLoader, a list, a generator), got 3",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_are_refused_at_construction(case: str) -> None:
    build, error, message = BAD[case]
    with pytest.raises(error) as raised:
        build()
    assert message in str(raised.value)
    assert live_reporters() == ()  # nothing half-built was left ticking


def test_one_sink_on_its_own_is_taken_as_a_list_of_one() -> None:
    memory = InMemory()
    reporter = instrument.Reporter(every=None, sinks=memory, memory=False)
    with instrument.timed("x"):
        pass
    reporter.flush()
    assert [r.paths() for r in memory.reports] == [("x",)]
    reporter.close()
    assert isinstance(instrument.Reporter(sinks=print).sinks[0], CallableSink)
    stdout = instrument.Reporter(sinks=sys.stdout).sinks
    assert len(stdout) == 1
    assert isinstance(stdout[0], Console)  # not the lines of stdout, one by one
    assert instrument.Reporter(sinks=(memory,)).sinks == (memory,)


def test_good_arguments_pass() -> None:
    reporter = instrument.Reporter(barrier=True, barrier_timeout=2.5, peak_flops=1e12)
    assert reporter.barrier_timeout == timedelta(seconds=2.5)
    reporter.close()
    Console(io.StringIO(), unicode=False)
    Logging(logging.LoggerAdapter(logging.getLogger("x"), {}), level=logging.DEBUG)
    assert list(instrument.data([1, 2])) == [1, 2]


def test_check_choice_names_every_choice() -> None:
    with pytest.raises(ValueError, match=r"^unknown log_option 'foo'; expected one of 'max', "
                       r"'minmax', 'all'$"):  # fmt: skip
        checks.check_choice("log_option", "foo", ("max", "minmax", "all"))
    assert checks.check_choice("log_option", "max", ("max", "minmax", "all")) == "max"
    with pytest.raises(ValueError, match="unknown ranks"):
        checks.check_choice("ranks", [], ("max",))  # unhashable: no TypeError from `in`
    with pytest.raises(TypeError, match=r"every must be an int >= 1, got 2\.0"):
        checks.check_positive_int("every", 2.0)
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        checks.check_positive_int("every", 0)
    with pytest.raises(ValueError, match=r"at most days=999999999"):
        checks.check_timeout("barrier_timeout", 1e300)


@pytest.mark.parametrize("make", ["Timer", "Timers", "NemoTimers"])
def test_compat_timers_check_barrier_timeout_at_construction(make: str) -> None:
    from instrument.compat import megatron, nemo

    build = {
        "Timer": lambda t: megatron.Timer("x", barrier_timeout=t),
        "Timers": lambda t: megatron.Timers(1, "max", barrier_timeout=t),
        "NemoTimers": lambda t: nemo.Timers(1, "max", barrier_timeout=t),
    }[make]
    with pytest.raises(TypeError, match="barrier_timeout must be a number of seconds > 0"):
        build("1s")
    with pytest.raises(ValueError, match=r"barrier_timeout must be .* got -5"):
        build(-5)
    build(timedelta(seconds=3))
