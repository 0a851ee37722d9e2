"""What a ChromeTrace write costs: the events since the last write, not what came before.

Baseline: a write of 1,000 new events to a fresh trace. Compared: the same 1,000 new events
written to a trace that already holds 200,000 (its ring filled up once and was written).
Before writes were incremental, that second write re-serialised the whole ring every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import instrument
import instrument.testing
from instrument.sinks import ChromeTrace

if TYPE_CHECKING:
    from conftest import Measure

NEW = 1000
BEFORE = 200_000


def record(n: int) -> None:
    region = instrument.timed("x", clock="cpu")
    for _ in range(n):
        with region:
            pass


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[list[ChromeTrace]]:
    instrument.testing.reset()
    sinks: list[ChromeTrace] = []
    yield sinks
    for sink in sinks:
        sink.close()


@pytest.mark.benchmark(group="trace write")
class TestTraceWrite:
    def test_fresh(self, measure: Measure, tmp_path: Path, fresh: list[ChromeTrace]) -> None:
        def setup() -> None:
            for sink in fresh:
                sink.close()
            fresh.clear()
            fresh.append(ChromeTrace(tmp_path / f"t{len(list(tmp_path.iterdir()))}.json"))
            record(NEW)

        measure(lambda: fresh[-1].write(instrument.Report()), label=f"write {NEW} new events, "
                "fresh trace", setup=setup, inner=NEW, baseline=True)  # fmt: skip

    def test_after_a_full_ring(
        self, measure: Measure, tmp_path: Path, fresh: list[ChromeTrace]
    ) -> None:
        sink = ChromeTrace(tmp_path / "full.json", max_events=BEFORE)
        fresh.append(sink)
        record(BEFORE)
        sink.write(instrument.Report())  # the ring was full; written once

        measure(lambda: sink.write(instrument.Report()), label=f"write {NEW} new events after "
                f"{BEFORE:,}", setup=lambda: record(NEW), inner=NEW)  # fmt: skip
