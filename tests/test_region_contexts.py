"""Each context has its own region stack, on the C path exactly as in pure Python.

A context is a thread, an asyncio task, a greenlet or a ``copy_context().run()``; a copied
context starts from the frame that was innermost when it was copied (see
``instrument/regions/frames.py``). The C path keeps frames in per-context stack holders
rather than setting the context variable on every transition; these tests pin the cases
where a shortcut would differ.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import tracemalloc

import pytest

import instrument
from instrument._native import speedups
from instrument.regions import frames


def test_greenlets_each_have_their_own_region_stack(reporter: instrument.Reporter) -> None:
    greenlet = pytest.importorskip("greenlet")

    def first() -> None:
        with instrument.timed("g1"):
            g2.switch()
            with instrument.timed("io"):
                pass

    def second() -> None:
        with instrument.timed("g2"):
            g1.switch()
            with instrument.timed("io"):
                pass

    g1 = greenlet.greenlet(first)
    g2 = greenlet.greenlet(second)
    g1.switch()
    g2.switch()
    assert instrument.current_path() == ""
    assert sorted(reporter.flush().paths()) == ["g1", "g1/io", "g2", "g2/io"]


def test_a_greenlet_starts_at_the_top_level(reporter: instrument.Reporter) -> None:
    greenlet = pytest.importorskip("greenlet")
    seen: list[str] = []

    def work() -> None:
        with instrument.timed("in-greenlet"):
            seen.append(instrument.current_path())

    with instrument.timed("main"):
        greenlet.greenlet(work).switch()
        assert instrument.current_path() == "main"
    assert seen == ["in-greenlet"]


def test_a_task_created_in_one_region_and_first_timed_in_another_nests_where_created(
    reporter: instrument.Reporter,
) -> None:
    async def child() -> None:
        with instrument.timed("x"):
            pass

    loop = asyncio.new_event_loop()
    try:
        with instrument.timed("A"):
            task = loop.create_task(child())  # the task's context is copied here, inside A
        with instrument.timed("B"):
            loop.run_until_complete(task)
    finally:
        loop.close()
    assert sorted(reporter.flush().paths()) == ["A", "A/x", "B"]


def test_a_copied_context_keeps_the_frame_current_at_copy_time(
    reporter: instrument.Reporter,
) -> None:
    with instrument.timed("A"):
        copied = contextvars.copy_context()
    with instrument.timed("B"):
        assert copied.run(instrument.current_path) == "A"
        with instrument.timed("C"):
            assert copied.run(instrument.current_path) == "A"
    assert copied.run(instrument.current_path) == "A"
    assert instrument.current_path() == ""


@pytest.mark.parametrize("other_variables", [0, 3, 40])
def test_a_copy_that_changed_other_variables_still_sees_the_frame_at_copy_time(
    reporter: instrument.Reporter, other_variables: int
) -> None:
    # the copy's own mapping then shares only part of the original's (structural sharing)
    variables = [contextvars.ContextVar(f"v{i}") for i in range(other_variables)]
    for i, var in enumerate(variables):
        var.set(i)
    late = contextvars.ContextVar("late")
    with instrument.timed("A"):
        copied = contextvars.copy_context()
        copied.run(late.set, 1)
        for var in variables:
            copied.run(var.set, -1)
    with instrument.timed("B"), instrument.timed("C"):
        assert copied.run(instrument.current_path) == "A"
    assert copied.run(instrument.current_path) == "A"


def test_a_context_run_twice_keeps_its_own_stack(reporter: instrument.Reporter) -> None:
    ctx = contextvars.copy_context()
    region = instrument.timed("inner")
    ctx.run(region.__enter__)
    assert ctx.run(instrument.current_path) == "inner"
    assert instrument.current_path() == ""
    ctx.run(region.__exit__, None, None, None)
    assert ctx.run(instrument.current_path) == ""
    assert reporter.flush().paths() == ("inner",)


def test_a_thread_that_exits_with_a_region_open_leaks_nothing() -> None:
    def leave_open() -> None:
        instrument.timed("left-open").__enter__()

    def run_threads(n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=leave_open)
            thread.start()
            thread.join()

    run_threads(50)  # warm up: nodes, caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run_threads(1000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a leaked frame is ~110 bytes per thread (~110 KB here); allow allocator noise
    assert grown < 20_000, f"{grown} bytes kept after 1000 threads exited"


@pytest.mark.skipif(speedups is None, reason="the C accelerator is not built")
@pytest.mark.parametrize("other_variables", [0, 40, 500])
def test_the_c_path_updates_its_holder_in_place_until_the_context_is_copied(
    other_variables: int,
) -> None:
    assert speedups is not None
    if not speedups.CONTEXT_LAYOUT_KNOWN:
        pytest.skip("every transition sets the variable on this Python")
    variables = [contextvars.ContextVar(f"w{i}") for i in range(other_variables)]

    def transitions() -> None:
        for i, var in enumerate(variables):
            var.set(i)
        region = instrument.timed("r")
        region.__enter__()
        # ids only: a reference kept here would itself make the holder shared
        holder = id(frames._frame.get())
        region.__exit__(None, None, None)
        region.__enter__()
        assert id(frames._frame.get()) == holder  # swapped in place: no variable set
        copied = contextvars.copy_context()
        region.__exit__(None, None, None)
        assert id(frames._frame.get()) != holder  # the copy keeps the old holder
        assert copied.run(instrument.current_path) == "r"
        assert instrument.current_path() == ""

    contextvars.copy_context().run(transitions)
