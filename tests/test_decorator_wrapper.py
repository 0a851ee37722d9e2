"""The decorator's wrapt object: with the C accelerator, a subclass of wrapt's FunctionWrapper
that calls the function directly (``speedups.timed_function_types``) — same results as
wrapt's generic call for every binding, every region class and every way of calling."""

from __future__ import annotations

import functools
import inspect
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import wrapt
from fake_cuda import FakeCuda, fake_cuda

import instrument
from instrument._native import speedups
from instrument.regions import frames as regions
from instrument.regions import native
from instrument.testing import FakeClock

#: The C types are in use: the extension is built and wrapt runs on its own C types.
FAST = native.timed_types is not None
needs_c = pytest.mark.skipif(not FAST, reason="C accelerator or wrapt's C types not in use")


def test_decorated_sync_function_is_a_wrapt_function_wrapper_calling_directly() -> None:
    def f(a: int, /, b: int, *, c: int = 3) -> tuple[int, int, int]:
        return a, b, c

    decorated = instrument.timed("f")(f)
    assert isinstance(decorated, wrapt.FunctionWrapper)
    assert decorated.__wrapped__ is f
    assert inspect.signature(decorated) == inspect.signature(f)
    if FAST:
        assert type(decorated).__name__ == "TimedFunctionWrapper"
    assert decorated(1, 2) == (1, 2, 3)
    assert decorated(1, b=2, c=4) == (1, 2, 4)
    assert type(decorated).__call__(decorated, 1, b=5) == (1, 5, 3)  # tuple and dict
    assert functools.partial(decorated, 7)(8) == (7, 8, 3)
    with pytest.raises(TypeError):
        decorated(a=1, b=2)  # positional-only, as for the undecorated function


def test_calls_record_and_nest_like_with_regions(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    @instrument.timed("inner")
    def inner(**kwargs: int) -> dict[str, int]:
        clock.advance(0.5)
        return kwargs

    with instrument.timed("outer"):
        assert inner(x=1) == {"x": 1}
        assert inner() == {}
    assert regions.current_path() == ""
    report = reporter.flush()
    assert report["outer/inner"].count == 2
    assert report["outer/inner"].total == pytest.approx(1.0)


def test_exception_propagates_unchanged_and_the_stack_unwinds(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    error = KeyError("boom")

    @instrument.timed("fails")
    def fails() -> None:
        clock.advance(0.25)
        with instrument.timed("deeper"):
            raise error

    with pytest.raises(KeyError) as caught:
        fails()
    assert caught.value is error
    assert caught.traceback[-1].name == "fails"
    assert regions.current_path() == ""
    with instrument.timed("after"):
        assert regions.current_path() == "after"
    report = reporter.flush()
    assert report["fails"].count == 1
    assert report["fails"].total == pytest.approx(0.25)
    assert report["fails/deeper"].count == 1
    assert set(report.paths()) == {"fails", "fails/deeper", "after"}


class Model:
    scale = 3

    @instrument.timed("method")
    def method(self, x: int, *, y: int = 0) -> int:
        return x * self.scale + y

    @instrument.timed("cm")
    @classmethod
    def cm(cls, x: int) -> int:
        return x * cls.scale

    @instrument.timed("sm")
    @staticmethod
    def sm(x: int) -> int:
        return -x


def test_every_binding_calls_the_function_and_records(reporter: instrument.Reporter) -> None:
    m = Model()
    bound = m.method
    assert isinstance(bound, wrapt.BoundFunctionWrapper)
    if FAST:
        assert type(bound).__name__ == "TimedBoundFunctionWrapper"
    assert bound(2, y=1) == 7
    assert Model.method(m, 2) == 6  # the instance passed by hand
    assert m.cm(2) == 6
    assert Model.cm(1) == 3
    assert m.sm(4) == -4
    assert Model.sm(5) == -5
    assert bound.__self__ is m
    assert inspect.signature(bound) == inspect.signature(Model().method.__wrapped__)
    report = reporter.flush()
    assert (report["method"].count, report["cm"].count, report["sm"].count) == (2, 2, 2)


def test_a_method_call_needs_no_bound_wrapper_and_gets_the_instance(
    reporter: instrument.Reporter,
) -> None:
    class Counter:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        @instrument.timed("add")
        def add(self, *args: Any, **kwargs: Any) -> Counter:
            self.seen.append((args, kwargs))
            return self

    counter = Counter()
    assert counter.add(1, k=2) is counter  # obj.method(...): the function called with obj
    assert Counter.add(counter, 3) is counter
    add = Counter.__dict__["add"]
    assert add(counter) is counter  # the wrapper called directly, as the function would be
    assert counter.seen == [((1,), {"k": 2}), ((3,), {}), ((), {})]
    if FAST:
        assert type(add).__name__ == "TimedFunctionWrapper"
        assert type(Model.__dict__["cm"]).__name__ == "TimedCallableWrapper"
        assert type(Model.__dict__["sm"]).__name__ == "TimedCallableWrapper"
    assert reporter.flush()["add"].count == 3


def test_disabled_and_level_skipped_calls_record_nothing(reporter: instrument.Reporter) -> None:
    calls: list[int] = []
    plain = instrument.timed("plain")(calls.append)
    deep = instrument.timed("deep", level=2)(calls.append)
    instrument.configure(level=1)
    deep(1)
    instrument.disable()
    plain(2)
    Model().method(1)
    instrument.enable()
    plain(3)
    assert calls == [1, 2, 3]
    assert reporter.flush().paths() == ("plain",)


@pytest.fixture
def gpu() -> Iterator[FakeCuda]:
    with fake_cuda() as fake:
        yield fake
    instrument.configure(clock="auto")


def test_device_clock_regions_take_wrapt_s_generic_call(gpu: FakeCuda) -> None:
    instrument.configure(clock="cpu")
    reporter = instrument.Reporter(every=None, memory=False)

    @instrument.timed("on_device", clock="cuda")
    def step(x: int, *, k: int) -> int:
        return x + k

    class OnDevice:
        @instrument.timed("on_device_method", clock="cuda")
        def method(self, x: int) -> tuple[OnDevice, int]:
            return self, x

    assert step(1, k=2) == 3
    assert Model().method(1, y=1) == 4  # host clock, bound, next to it
    on_device = OnDevice()
    assert on_device.method(5) == (on_device, 5)
    assert gpu.records == 4
    report = reporter.flush()
    assert report["on_device"].clock == "cuda"
    assert report["on_device"].count == 1
    assert report["on_device_method"].count == 1
    assert report["method"].clock == "cpu"
    reporter.close()


@needs_c
def test_a_wrapper_other_than_the_call_timer_gets_wrapt_s_own_call() -> None:
    assert speedups is not None
    _, timed_type, bound_type = speedups.timed_function_types(
        wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper
    )
    seen: list[Any] = []

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        seen.append((instance, args, kwargs))
        return wrapped(*args, **kwargs)

    class Holder:
        meth = timed_type(lambda self, x: x + 1, wrapper)

    holder = Holder()
    assert timed_type(max, wrapper)(1, 5, key=abs) == 5
    assert holder.meth(1) == 2
    assert type(holder.meth) is bound_type
    assert seen == [(None, (1, 5), {"key": abs}), (holder, (1,), {})]


@needs_c
def test_timed_function_types_checks_its_arguments() -> None:
    assert speedups is not None
    first = speedups.timed_function_types(wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)
    again = speedups.timed_function_types(wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)
    assert first == again
    with pytest.raises(TypeError, match="already bound"):
        speedups.timed_function_types(wrapt.ObjectProxy, wrapt.BoundFunctionWrapper)
    with pytest.raises(TypeError):
        speedups.timed_function_types(wrapt.FunctionWrapper)


REFUSED_TYPES = [
    "int, str",
    "wrapt.ObjectProxy, wrapt.BoundFunctionWrapper",
    "wrapt.FunctionWrapper, wrapt.FunctionWrapper",
    "type('Py', (), {}), wrapt.BoundFunctionWrapper",
    "wrapt.wrappers.FunctionWrapper, wrapt.wrappers.BoundFunctionWrapper",  # wrapt's Python
]


@pytest.mark.slow  # a subprocess
@needs_c
def test_types_other_than_wrapt_s_c_wrappers_are_refused() -> None:
    """Checked in a fresh process, where nothing has bound the types yet."""
    code = ["import wrapt, wrapt.wrappers", "from instrument._native import speedups"]
    for types in REFUSED_TYPES:
        code += [
            "try:",
            f"    speedups.timed_function_types({types})",
            "except TypeError as e:",
            "    print('refused:', e)",
            "else:",
            f"    print('accepted:', {types!r})",
        ]
    out = subprocess.run(
        [sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=60
    )
    lines = out.stdout.splitlines()
    assert len(lines) == len(REFUSED_TYPES), out.stderr
    assert all(line.startswith("refused:") for line in lines), out.stdout
