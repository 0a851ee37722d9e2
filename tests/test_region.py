"""timed(): context manager, decorator, nesting, exceptions, manual timers, validation."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading

import pytest

import instrument
from instrument.testing import FakeClock


def test_context_manager_nests_into_paths(clock: FakeClock, reporter: instrument.Reporter) -> None:
    with instrument.timed("step"):
        clock.advance(0.25)
        with instrument.timed("forward"):
            clock.advance(0.5)
        with instrument.timed("backward"):
            clock.advance(1.0)
    report = reporter.flush()
    assert report.paths() == ("step", "step/forward", "step/backward")
    assert report["step"].total == 1.75
    assert report["step"].self == 0.25
    assert report["step/forward"].total == 0.5
    assert report["step/backward"].count == 1


def test_same_name_under_other_parent_is_another_node(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    for parent in ("train", "eval"):
        with instrument.timed(parent), instrument.timed("forward"):
            clock.advance(0.1)
    report = reporter.flush()
    assert set(report.paths()) == {"train", "train/forward", "eval", "eval/forward"}


def test_decorator_bare_and_named(clock: FakeClock, reporter: instrument.Reporter) -> None:
    @instrument.timed
    def load(x: int) -> int:
        clock.advance(0.01)
        return x + 1

    @instrument.timed("model")
    def model(x: int) -> int:
        clock.advance(0.02)
        return load(x) * 2

    assert model(1) == 4
    report = reporter.flush()
    qual = load.__qualname__
    assert report.paths() == ("model", f"model/{qual}")
    assert report["model"].total == pytest.approx(0.03)


def test_decorator_preserves_metadata() -> None:
    def original(a: int, b: str = "x", *, c: float = 1.0) -> str:
        """Docstring."""
        return f"{a}{b}{c}"

    decorated = instrument.timed("orig")(original)
    assert decorated.__name__ == "original"
    assert decorated.__doc__ == "Docstring."
    assert decorated.__wrapped__ is original
    assert inspect.signature(decorated) == inspect.signature(original)
    assert decorated(1, "y", c=2.0) == "1y2.0"


def test_methods_classmethods_staticmethods(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    class Model:
        scale = 3

        @instrument.timed("method")
        def method(self, x: int) -> int:
            clock.advance(0.1)
            return x * self.scale

        @instrument.timed("cm")
        @classmethod
        def cm(cls, x: int) -> int:
            clock.advance(0.2)
            return x * cls.scale

        @instrument.timed("sm")
        @staticmethod
        def sm(x: int) -> int:
            clock.advance(0.3)
            return x

        @classmethod
        @instrument.timed
        def inner_cm(cls) -> str:
            return cls.__name__

    m = Model()
    assert m.method(2) == 6
    assert Model.cm(2) == 6
    assert m.cm(1) == 3
    assert Model.sm(5) == 5
    assert m.sm(4) == 4
    assert Model.inner_cm() == "Model"
    report = reporter.flush()
    assert report["method"].count == 1
    assert report["cm"].count == 2
    assert report["sm"].count == 2
    assert report["sm"].total == pytest.approx(0.6)


def test_recursion_nests_and_never_fails(clock: FakeClock, reporter: instrument.Reporter) -> None:
    @instrument.timed("fib")
    def fib(n: int) -> int:
        clock.advance(0.001)
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(4) == 3
    report = reporter.flush()
    assert report.paths() == ("fib", "fib/fib", "fib/fib/fib", "fib/fib/fib/fib")
    assert report["fib"].count == 1
    assert report["fib/fib"].count == 2
    assert sum(report[p].count for p in report.paths()) == 9


def test_reused_region_object_nests(clock: FakeClock, reporter: instrument.Reporter) -> None:
    region = instrument.timed("r")
    with region:
        clock.advance(1.0)
        with region:
            clock.advance(2.0)
    report = reporter.flush()
    assert report["r"].total == 3.0
    assert report["r/r"].total == 2.0


def test_exception_propagates_and_is_recorded(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    class Boom(Exception):
        pass

    @instrument.timed("inner")
    def inner() -> None:
        clock.advance(0.5)
        raise Boom("kaput")

    def outer() -> None:
        with instrument.timed("outer"):
            clock.advance(0.25)
            inner()

    with pytest.raises(Boom, match="kaput"):
        outer()
    assert instrument.current_path() == ""
    with instrument.timed("after"):
        clock.advance(1.0)
    report = reporter.flush()
    assert report.paths() == ("outer", "outer/inner", "after")
    assert report["outer"].total == 0.75
    assert report["outer/inner"].total == 0.5


def test_exit_returns_falsy_so_exceptions_are_never_swallowed() -> None:
    region = instrument.timed("x")
    region.__enter__()
    assert not region.__exit__(ValueError, ValueError("v"), None)


def test_async_function_is_timed_across_awaits(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    events: list[str] = []

    @instrument.timed("fetch")
    async def fetch() -> int:
        events.append("enter")
        await asyncio.sleep(0)
        clock.advance(0.5)
        events.append("body done")
        return 7

    assert inspect.iscoroutinefunction(fetch)
    assert asyncio.run(fetch()) == 7
    events.append("exit")
    assert events == ["enter", "body done", "exit"]
    report = reporter.flush()
    assert report["fetch"].total == 0.5


def test_concurrent_tasks_never_nest(reporter: instrument.Reporter) -> None:
    async def worker(name: str) -> None:
        with instrument.timed(name):
            await asyncio.sleep(0.001)
            with instrument.timed("io"):
                await asyncio.sleep(0.001)

    async def main() -> None:
        with instrument.timed("gather"):
            await asyncio.gather(*(worker(f"task{i}") for i in range(5)))

    asyncio.run(main())
    report = reporter.flush()
    assert set(report.paths()) == {"gather"} | {
        p for i in range(5) for p in (f"gather/task{i}", f"gather/task{i}/io")
    }


def test_tasks_nest_under_the_plain_code_region_around_the_event_loop(
    reporter: instrument.Reporter,
) -> None:
    async def worker(name: str) -> None:
        with instrument.timed(name):
            await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(worker("a"), worker("b"))
        with instrument.timed("after"):
            pass

    with instrument.timed("run"):
        asyncio.run(main())
        with instrument.timed("sync"):
            pass
    assert instrument.current_path() == ""
    assert set(reporter.flush().paths()) == {"run", "run/a", "run/b", "run/after", "run/sync"}


def test_a_task_started_while_another_is_inside_a_region_does_not_nest_in_it(
    reporter: instrument.Reporter,
) -> None:
    async def late() -> None:
        with instrument.timed("late"):
            await asyncio.sleep(0)

    async def main() -> None:
        task = None
        with instrument.timed("first"):
            task = asyncio.create_task(late())
            await asyncio.sleep(0)  # late() starts while "first" is open in main()
            with instrument.timed("second"):
                await task

    asyncio.run(main())
    # created inside "first", so it nests there (context snapshot), never under "second"
    assert set(reporter.flush().paths()) == {"first", "first/late", "first/second"}


def test_to_thread_and_copied_contexts_inherit_the_callers_path(
    reporter: instrument.Reporter,
) -> None:
    def work() -> str:
        with instrument.timed("work"):
            return instrument.current_path()

    async def main() -> str:
        with instrument.timed("task"):
            return await asyncio.to_thread(work)

    assert asyncio.run(main()) == "task/work"
    with instrument.timed("outer"):
        assert contextvars.copy_context().run(work) == "outer/work"
        assert instrument.current_path() == "outer"
    assert set(reporter.flush().paths()) == {"task", "task/work", "outer", "outer/work"}


def test_threads_start_at_the_top_level(reporter: instrument.Reporter) -> None:
    seen: list[str] = []

    def work() -> None:
        with instrument.timed("in-thread"):
            seen.append(instrument.current_path())

    with instrument.timed("main"):
        t = threading.Thread(target=work)
        t.start()
        t.join()
        assert instrument.current_path() == "main"
    assert seen == ["in-thread"]
    assert set(reporter.flush().paths()) == {"main", "in-thread"}


def test_generator_timed_per_resumption(clock: FakeClock, reporter: instrument.Reporter) -> None:
    @instrument.timed("gen")
    def gen(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            clock.advance(0.1)
            received = yield i
            if received:
                clock.advance(received)
        return "done"

    assert inspect.isgeneratorfunction(gen)
    g = gen(3)
    assert next(g) == 0
    clock.advance(10.0)  # consumer time is not generator time
    assert g.send(1.0) == 1
    assert list(g) == [2]
    report = reporter.flush()
    assert report["gen"].count == 4  # 3 yields + the final resumption that returns
    assert report["gen"].total == pytest.approx(0.1 + 1.1 + 0.1)


def test_generator_throw_and_close(reporter: instrument.Reporter) -> None:
    caught: list[str] = []

    @instrument.timed("g")
    def g():  # type: ignore[no-untyped-def]
        try:
            yield 1
        except KeyError:
            caught.append("key")
            yield 2
        finally:
            caught.append("closed")

    it = g()
    assert next(it) == 1
    assert it.throw(KeyError("k")) == 2
    it.close()
    assert caught == ["key", "closed"]
    assert instrument.current_path() == ""


def test_async_generator_timed_per_resumption(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    @instrument.timed("agen")
    async def agen(n: int):  # type: ignore[no-untyped-def]
        for i in range(n):
            clock.advance(0.25)
            yield i

    async def consume() -> list[int]:
        return [x async for x in agen(2)]

    assert asyncio.run(consume()) == [0, 1]
    report = reporter.flush()
    assert report["agen"].count == 3
    assert report["agen"].total == 0.5


def test_manual_timer(clock: FakeClock, reporter: instrument.Reporter) -> None:
    t = instrument.Timer("checkpoint")
    t.start()
    with instrument.timed("save"):
        clock.advance(2.0)
    t.stop()
    report = reporter.flush()
    assert report["checkpoint"].total == 2.0
    assert report["checkpoint/save"].total == 2.0


def test_manual_timer_misuse_names_the_region() -> None:
    t = instrument.Timer("ckpt")
    with pytest.raises(RuntimeError, match="timer 'ckpt' was stopped without being started"):
        t.stop()
    t.start()
    with pytest.raises(RuntimeError, match="timer 'ckpt' is already running"):
        t.start()
    t.stop()


def test_manual_timers_stopped_out_of_order(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    a = instrument.Timer("a").start()
    clock.advance(1.0)
    b = instrument.Timer("b").start()
    clock.advance(1.0)
    a.stop()
    assert instrument.current_path() == "a/b"  # b keeps its path; a is off the stack
    clock.advance(1.0)
    b.stop()
    assert instrument.current_path() == ""
    report = reporter.flush()
    assert report["a"].total == 2.0
    assert report["a/b"].total == 2.0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "region name must be a non-empty string, got ''"),
        ("a/b", "region name 'a/b' contains '/'"),
        (3, "region name must be a non-empty string, got 3"),
    ],
)
def test_bad_names(name: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        instrument.timed(name)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=message):
        instrument.Timer(name)  # type: ignore[arg-type]


def test_bad_clock_and_level() -> None:
    with pytest.raises(ValueError, match="unknown clock 'gpu'; expected one of 'auto', 'cpu'"):
        instrument.timed("x", clock="gpu")
    with pytest.raises(ValueError, match="region level must be an int >= 0, got -1"):
        instrument.timed("x", level=-1)


def test_nameless_timed_needs_a_name_as_context_manager() -> None:
    with pytest.raises(TypeError, match="needs a name"), instrument.timed():
        pass


def test_disable_enable(clock: FakeClock, reporter: instrument.Reporter) -> None:
    @instrument.timed("f")
    def f() -> int:
        clock.advance(1.0)
        return 1

    instrument.disable()
    assert not instrument.is_enabled()
    with instrument.timed("off"):
        f()
    assert instrument.current_path() == ""
    instrument.enable()
    with instrument.timed("on"):
        f()
    report = reporter.flush()
    assert report.paths() == ("on", "on/f")


def test_disable_inside_an_open_region_keeps_the_stack_consistent(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    with instrument.timed("outer"):
        clock.advance(1.0)
        instrument.disable()
    instrument.enable()
    assert instrument.current_path() == ""
    assert reporter.flush()["outer"].total == 1.0


def test_levels(clock: FakeClock, reporter: instrument.Reporter) -> None:
    instrument.configure(level=1)
    with instrument.timed("coarse", level=1), instrument.timed("fine", level=2):
        clock.advance(1.0)
    instrument.configure(level=None)
    with instrument.timed("fine", level=2):
        clock.advance(1.0)
    report = reporter.flush()
    assert report.paths() == ("coarse", "fine")


def test_exit_without_enter_warns_once_and_records_nothing(reporter: instrument.Reporter) -> None:
    region = instrument.timed("lonely")
    with pytest.warns(RuntimeWarning, match="region 'lonely' was exited without a matching enter"):
        region.__exit__(None, None, None)
    assert reporter.flush().paths() == ()


def test_current_path() -> None:
    assert instrument.current_path() == ""
    with instrument.timed("a"), instrument.timed("b"):
        assert instrument.current_path() == "a/b"
