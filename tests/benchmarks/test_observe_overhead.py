"""What a region costs while something watches it: a trace sink, a running profiler.

Baseline: the same region with nothing watching (the fast path). The profiler rows include
the profiler's own cost of recording a range; ``record_function`` alone, under the same
profiler, is the peer row (what a hand-annotated region costs there).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import instrument
import instrument.testing
from instrument.sinks import ChromeTrace

if TYPE_CHECKING:
    from conftest import Measure

INNER = 2000


def _cpu() -> None:
    instrument.testing.reset()
    instrument.configure(clock="cpu")


def regions() -> None:
    for _ in range(INNER):
        with instrument.timed("x"):
            pass


@pytest.fixture
def profiler() -> Iterator[None]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        yield


@pytest.mark.benchmark(group="observed")
class TestObserved:
    def test_plain(self, measure: Measure) -> None:
        measure(regions, label="timed, nothing watching", setup=_cpu, inner=INNER, baseline=True)

    def test_chrome_trace(self, measure: Measure, tmp_path: Path) -> None:
        def setup() -> None:
            _cpu()
            ChromeTrace(tmp_path / "t.json", max_events=INNER)

        measure(regions, label="timed, ChromeTrace open", setup=setup, inner=INNER)

    def test_profiled(self, measure: Measure, profiler: None) -> None:
        measure(
            regions, label="timed, torch.profiler running", inner=INNER, rounds=30, warmup_rounds=3
        )

    def test_record_function(self, measure: Measure, profiler: None) -> None:
        def run() -> None:
            for _ in range(INNER):
                with torch.autograd.profiler.record_function("x"):
                    pass

        measure(
            run, label="record_function, torch.profiler running", inner=INNER, rounds=30,
            warmup_rounds=3,
        )  # fmt: skip
