"""Run random region programs and print what they record: the worker of test_differential.py.

A *program* is a JSON list of operations; each operation is a list whose first item names it:

- ``["region", name, via, body]``: run ``body`` inside region ``name`` entered ``via``
  "with", "decorator" (a decorated function, a coroutine function inside a task) or "timer";
- ``["catch", body]``: run ``body``, catching :class:`Boom`; ``["boom"]`` raises it;
- ``["thread", body]``: run ``body`` in a new thread and join it;
- ``["copy", body]``: run ``body`` in ``contextvars.copy_context()``;
- ``["task", body]``: create an asyncio task running ``body`` now (on this thread's loop),
  run it at the next ``["runloop"]`` (or when the enclosing thread or program ends), so it
  can start while its creator is in another region; ``["await"]`` yields to the loop;
- ``["greenlet", body]``: run ``body`` in a new greenlet; ``["yield"]`` switches back to its
  parent, ``["resume"]`` resumes the suspended greenlets of this thread;
- ``["gen", name, steps, inner, outer]``: a generator decorated with region ``name`` runs
  ``inner`` before each of its ``steps`` yields; the consumer runs ``outer`` after each item,
  so the region is open across the ``yield`` the consumer sees;
- ``["tick"]``: advance the fake clock by 1 µs; ``["flush"]``: flush the reporter (in the
  main thread; elsewhere it does nothing).

Reads one program per line on stdin and writes, per program, one JSON line: a list of the
flushes' records ``[path, count, total_ns, min_ns, max_ns, open]``. The same programs run with
and without ``INSTRUMENT_NO_EXTENSIONS=1`` must print the same lines.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

import greenlet

import instrument
from instrument.testing import FakeClock, reset, use_clock

Op = list[Any]


class Boom(Exception):
    """The exception programs raise and catch."""


class _Run:
    """The state of one program: its clock, reporter, flushes, and per-thread loops and
    suspended greenlets."""

    def __init__(self, clock: FakeClock, reporter: instrument.Reporter) -> None:
        self.clock = clock
        self.reporter = reporter
        self.flushes: list[list[list[Any]]] = []
        self.local = threading.local()

    # -- per-thread asyncio loop and suspended greenlets ----------------------------------

    def loop(self) -> asyncio.AbstractEventLoop:
        loop = getattr(self.local, "loop", None)
        if loop is None:
            loop = self.local.loop = asyncio.new_event_loop()
            self.local.tasks = []
        return loop  # type: ignore[no-any-return]

    def suspended(self) -> list[Any]:
        if not hasattr(self.local, "greenlets"):
            self.local.greenlets = []
        return self.local.greenlets  # type: ignore[no-any-return]

    def run_loop(self) -> None:
        loop = getattr(self.local, "loop", None)
        if loop is None or loop.is_running():
            return
        while self.local.tasks:
            tasks, self.local.tasks = self.local.tasks, []
            loop.run_until_complete(asyncio.gather(*tasks))

    def resume(self) -> None:
        while self.suspended():
            pending, self.local.greenlets = self.local.greenlets, []
            for g in pending:
                g.switch()
                if not g.dead:
                    self.local.greenlets.append(g)

    def finish_thread(self) -> None:
        self.resume()
        self.run_loop()
        loop = getattr(self.local, "loop", None)
        if loop is not None:
            loop.close()
            self.local.loop = None

    # -- flushes --------------------------------------------------------------------------

    def flush(self) -> None:
        report = self.reporter.flush()
        self.flushes.append(
            sorted(
                [
                    n.path,
                    n.host.count,
                    round(n.host.total * 1e9),
                    round(n.host.min * 1e9),
                    round(n.host.max * 1e9),
                    n.open,
                ]
                for n in report.nodes
            )
        )

    # -- the interpreter (plain code) -----------------------------------------------------

    def run(self, ops: list[Op]) -> None:
        for op in ops:
            self.step(op)

    def step(self, op: Op) -> None:
        kind = op[0]
        if kind == "tick":
            self.clock.advance(1e-6)
        elif kind == "flush":
            # Only the main thread flushes: the registry keys a call left open at a flush by
            # the flushing thread's ident, which a later thread may reuse, and whether it is
            # reused differs from run to run (not from path to path).
            if threading.current_thread() is threading.main_thread():
                self.flush()
        elif kind == "boom":
            raise Boom
        elif kind == "catch":
            try:
                self.run(op[1])
            except Boom:
                pass
        elif kind == "region":
            self.region(op[1], op[2], op[3])
        elif kind == "thread":
            thread = threading.Thread(target=self.thread_body, args=(op[1],))
            thread.start()
            thread.join()
        elif kind == "copy":
            contextvars.copy_context().run(self.run_caught, op[1])
        elif kind == "task":
            loop = self.loop()
            self.local.tasks.append(loop.create_task(self.arun_caught(op[1])))
        elif kind == "runloop":
            self.run_loop()
        elif kind == "greenlet":
            g = greenlet.greenlet(self.run_caught)
            g.switch(op[1])
            if not g.dead:
                self.suspended().append(g)
        elif kind == "yield":
            parent = greenlet.getcurrent().parent
            if parent is not None:
                parent.switch()
        elif kind == "resume":
            self.resume()
        elif kind == "gen":
            self.generator(op[1], op[2], op[3], op[4])
        elif kind == "disable":
            instrument.disable()
        elif kind == "enable":
            instrument.enable()
        # "await" is a no-op in plain code

    def run_caught(self, ops: list[Op]) -> None:
        try:
            self.run(ops)
        except Boom:
            pass

    def thread_body(self, ops: list[Op]) -> None:
        self.run_caught(ops)
        self.finish_thread()

    def region(self, name: str, via: str, body: list[Op]) -> None:
        if via == "with":
            with instrument.timed(name):
                self.clock.advance(1e-6)
                self.run(body)
        elif via == "decorator":

            @instrument.timed(name)
            def call() -> None:
                self.clock.advance(1e-6)
                self.run(body)

            call()
        else:
            timer = instrument.Timer(name).start()
            try:
                self.clock.advance(1e-6)
                self.run(body)
            finally:
                timer.stop()

    def generator(self, name: str, steps: int, inner: list[Op], outer: list[Op]) -> None:
        @instrument.timed(name)
        def produce() -> Iterator[int]:
            for i in range(steps):
                self.clock.advance(1e-6)
                self.run(inner)
                yield i

        for _ in produce():
            self.run(outer)

    # -- the interpreter inside an asyncio task --------------------------------------------

    async def arun_caught(self, ops: list[Op]) -> None:
        try:
            await self.arun(ops)
        except Boom:
            pass

    async def arun(self, ops: list[Op]) -> None:
        for op in ops:
            kind = op[0]
            if kind == "await":
                await asyncio.sleep(0)
            elif kind == "catch":
                try:
                    await self.arun(op[1])
                except Boom:
                    pass
            elif kind == "region":
                await self.aregion(op[1], op[2], op[3])
            elif kind == "task":
                tasks = self.local.tasks
                tasks.append(asyncio.get_running_loop().create_task(self.arun_caught(op[1])))
            else:
                self.step(op)

    async def aregion(self, name: str, via: str, body: list[Op]) -> None:
        if via == "with":
            with instrument.timed(name):
                self.clock.advance(1e-6)
                await self.arun(body)
        elif via == "decorator":

            @instrument.timed(name)
            async def call() -> None:
                self.clock.advance(1e-6)
                await self.arun(body)

            await call()
        else:
            timer = instrument.Timer(name).start()
            try:
                self.clock.advance(1e-6)
                await self.arun(body)
            finally:
                timer.stop()


def run_program(program: list[Op]) -> list[list[list[Any]]]:
    """Run ``program`` from a fresh state; what each flush recorded, the final one last."""
    reset()
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=[])
        try:
            run = _Run(clock, reporter)
            run.run_caught(program)
            run.finish_thread()
            run.flush()
        finally:
            reporter.close()
    reset()
    return run.flushes


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(run_program(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
