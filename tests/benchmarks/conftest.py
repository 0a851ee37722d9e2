"""Shared set-up for the speed benchmarks (pytest-benchmark).

Every test here takes the ``benchmark`` fixture (directly or through ``measure``), so the
default run skips it (``--benchmark-skip`` in pyproject); run them with::

    pytest tests/benchmarks --benchmark-only

Each benchmark times a loop of ``INNER`` operations per round, so the timer's own cost
is spread over many operations; ``report_ratios.py`` divides by the loop count it finds
in ``extra_info["inner"]`` and compares each row with the row marked as its group's
baseline (``extra_info["baseline"]``).

A group whose figures are ratios to a baseline is measured with ``paired``: every round
runs the baseline and each contender once, in an order that rotates from round to round,
and a contender's ratio is the median of its per-round ratios — separately measured rows
drift by 20-30 % between runs on a shared 2-core machine, interleaved ones do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Protocol

import pytest
from paired import INNER, ROUNDS, WARMUP_ROUNDS, Contender, run_paired

import instrument
import instrument.testing

_HERE = Path(__file__).resolve().parent


class Measure(Protocol):
    """The ``measure`` fixture: run one benchmark and label it for the ratio report.

    Options: ``setup`` (untimed, before every round), ``inner`` (operations per round),
    ``baseline`` (the group's reference row), ``floor`` (the cost of the bare operation:
    the report then also compares costs *above* it), ``rounds``, ``warmup_rounds``, ``note``.
    """

    def __call__(self, fn: Callable[[], object], *, label: str, **options: Any) -> None: ...


@pytest.fixture
def measure(benchmark: Any) -> Measure:
    """Time ``fn`` (which performs ``inner`` operations) with ``benchmark.pedantic``.

    ``setup`` runs untimed before every round (drain what the previous round recorded).
    """

    def run(
        fn: Callable[[], object],
        *,
        label: str,
        setup: Callable[[], object] | None = None,
        inner: int = INNER,
        baseline: bool = False,
        floor: bool = False,
        rounds: int = ROUNDS,
        warmup_rounds: int = WARMUP_ROUNDS,
        note: str = "",
    ) -> None:
        benchmark.extra_info.update(
            label=label, inner=inner, baseline=baseline, floor=floor, note=note
        )

        def setup_round() -> None:
            if setup is not None:
                setup()

        benchmark.pedantic(
            fn, setup=setup_round, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1
        )

    return run


class Paired(Protocol):
    """The ``paired`` fixture: time contenders interleaved, round by round."""

    def __call__(
        self,
        contenders: Sequence[Contender],
        *,
        rounds: int = ...,
        warmup_rounds: int = ...,
        clock: Callable[[], int] = ...,
        interleave: int = ...,
        block: int = ...,
        settle: int = ...,
    ) -> dict[str, list[float]]: ...


@pytest.fixture
def paired(benchmark: Any) -> Paired:
    """Run :func:`run_paired` and store its rows in the benchmark's ``extra_info``."""

    def run(
        contenders: Sequence[Contender],
        *,
        rounds: int = ROUNDS,
        warmup_rounds: int = WARMUP_ROUNDS,
        clock: Callable[[], int] = perf_counter_ns,
        interleave: int = 1,
        block: int = 1,
        settle: int = 0,
    ) -> dict[str, list[float]]:
        summary, per_op = run_paired(
            contenders,
            rounds=rounds,
            warmup_rounds=warmup_rounds,
            clock=clock,
            interleave=interleave,
            block=block,
            settle=settle,
        )
        benchmark.extra_info.update(paired_rows=summary)
        benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # a benchmark: skipped by default
        return per_op

    return run


@pytest.fixture(autouse=True)
def _fresh_instrument() -> Iterator[None]:
    """Each benchmark starts and ends with instrument as freshly imported (and enabled)."""
    instrument.testing.reset()
    yield
    instrument.testing.reset()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Guard: a test in this folder that does not use ``benchmark`` never runs by default."""
    skip = pytest.mark.skip(reason="benchmarks only run with --benchmark-only")
    if config.getoption("benchmark_only", default=False):
        return
    for item in items:
        if _HERE in item.path.parents and "benchmark" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
