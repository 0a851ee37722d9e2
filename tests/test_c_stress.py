"""Every C entry point, many times, with the garbage collector running in between.

Cheap under a release build (a functional check on both paths); its purpose is the debug
CPython run (tools/debug_cpython.sh), where a reference counted once too often or too
rarely, or an object visited twice by ``tp_traverse``, aborts the interpreter with an
assertion. Each case ends in ``gc.collect()`` and checks what was recorded.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import instrument
from instrument import registry
from instrument.testing import reset

ROUNDS = 200


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset()
    yield
    reset()


def _count(path: str) -> int:
    node: Any = registry.ROOT
    for name in path.split("/"):
        node = node.children[name]
    parts = node.take()
    return 0 if parts is None else int(parts[0])


@pytest.mark.slow
def test_nested_regions_exceptions_and_decorators_under_gc() -> None:
    @instrument.timed("call")
    def call(x: int, *, y: int = 0) -> int:
        if x % 7 == 0:
            raise ValueError(x)
        return x + y

    for i in range(ROUNDS):
        with instrument.timed("outer"):
            try:
                with instrument.timed(f"inner{i % 3}"):
                    call(i, y=1)
            except ValueError:
                pass
        if i % 50 == 0:
            instrument.disable()
            with instrument.timed("outer"):
                call(1)
            instrument.enable()
            gc.collect()
    gc.collect()
    assert _count("outer") == ROUNDS
    assert _count("outer/inner1/call") == sum(1 for i in range(ROUNDS) if i % 3 == 1)


@pytest.mark.slow
def test_threads_and_tasks_under_gc() -> None:
    def in_context() -> None:
        with instrument.timed("ctx"):
            pass

    def worker() -> None:
        for i in range(ROUNDS // 4):
            with instrument.timed("thread"):
                contextvars.copy_context().run(in_context)
            if i % 10 == 0:
                gc.collect()

    async def task(n: int) -> None:
        for _ in range(n):
            with instrument.timed("task"):
                await asyncio.sleep(0)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def main() -> None:
        await asyncio.gather(*(task(ROUNDS // 10) for _ in range(10)))

    asyncio.run(main())
    gc.collect()
    assert _count("thread") == ROUNDS
    assert _count("thread/ctx") == ROUNDS
    assert _count("task") == ROUNDS


def test_cycles_through_regions_and_nodes_are_collected() -> None:
    # Cycles through C-typed objects (node <-> children dict, region <-> clock, wrapper <->
    # function) are found and freed by the collector: the traverse and clear slots at work.
    for i in range(ROUNDS):
        node = registry.PathNode(f"cycle{i}", None)
        node.children = {"self": node}
        region = instrument.timed("cycle")
        holder: list[Any] = [region]
        holder.append(holder)

        @instrument.timed("fn")
        def fn() -> None:
            return None

        fn.me = fn  # type: ignore[attr-defined]
        del node, holder, fn
    assert gc.collect() > 0
    gc.collect()
    with instrument.timed("still"):
        pass
    assert _count("still") == 1
