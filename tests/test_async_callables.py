"""A callable whose call is awaited — an object with an ``async def __call__``, a
``functools.partial`` of one, an async generator behind ``__call__``, a plain function that
returns a coroutine — is timed until its coroutine ends (per resumption for a generator),
not as the ~0 s call that makes it; on the C and the pure-Python paths alike."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

import instrument
from instrument.testing import FakeClock, capture_reports


class Fetch:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    async def __call__(self, seconds: float) -> float:
        await asyncio.sleep(0)
        self.clock.advance(seconds)
        return seconds


class Stream:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    async def __call__(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            self.clock.advance(0.01)
            yield i


def test_awaited_callables_are_timed_until_their_coroutine_ends(clock: FakeClock) -> None:
    fetch = instrument.timed("fetch")(Fetch(clock))
    bound = instrument.timed("partial")(functools.partial(Fetch(clock), 0.02))
    stream = instrument.timed("stream")(Stream(clock))

    async def main() -> list[int]:
        assert await fetch(0.05) == 0.05
        assert await bound() == 0.02
        return [i async for i in stream(3)]

    with capture_reports(memory=False) as reports:
        assert asyncio.run(main()) == [0, 1, 2]
    report = reports[0]
    assert (report["fetch"].count, report["fetch"].total) == (1, 0.05)
    assert (report["partial"].count, report["partial"].total) == (1, 0.02)
    assert report["stream"].count == 4  # three items and the end, each resumption
    assert abs(report["stream"].total - 0.03) < 1e-9


def test_a_plain_function_returning_a_coroutine_is_timed_until_it_ends(clock: FakeClock) -> None:
    fetch = Fetch(clock)

    def plain(seconds: float) -> Coroutine[Any, Any, float]:  # no __wrapped__, not async
        return fetch(seconds)

    timed_plain = instrument.timed("plain")(plain)
    timed_partial = instrument.timed("wrapped")(functools.partial(plain, 0.03))

    async def main() -> float:
        with instrument.timed("outer"):
            return await timed_plain(0.05) + await timed_partial()

    with capture_reports(memory=False) as reports:
        assert asyncio.run(main()) == 0.08
    report = reports[0]
    assert (report["outer/plain"].count, report["outer/plain"].total) == (1, 0.05)
    assert (report["outer/wrapped"].count, report["outer/wrapped"].total) == (1, 0.03)
    assert report["outer"].total == report["outer/plain"].total + report["outer/wrapped"].total


_REAL_CLOCK = """
import asyncio, instrument

async def work(seconds):
    await asyncio.sleep(seconds)
    return seconds

def plain(seconds):
    return work(seconds)

reporter = instrument.Reporter(every=None, sinks=[])
for clock in ("cpu", "sync"):  # the host-clock fast path, and the generic region call
    instrument.configure(clock=clock)
    assert asyncio.run(instrument.timed("plain." + clock)(plain)(0.05)) == 0.05
report = reporter.flush()
print(sorted((path, report[path].count, report[path].total >= 0.05) for path in report.paths()))
"""


@pytest.mark.parametrize("path", ["c", "pure"])
def test_a_plain_function_returning_a_coroutine_on_both_paths(path: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("INSTRUMENT_NO_EXTENSIONS", None)
    if path == "pure":
        env["INSTRUMENT_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _REAL_CLOCK],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('plain.cpu', 1, True), ('plain.sync', 1, True)]"
