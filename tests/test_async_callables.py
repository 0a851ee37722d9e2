"""A callable whose call is awaited — an object with an ``async def __call__``, a
``functools.partial`` of one, an async generator behind ``__call__`` — is timed until its
coroutine ends (per resumption for a generator), not as the ~0 s call that makes it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

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
