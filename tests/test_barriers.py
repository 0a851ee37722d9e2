"""Barriers before regions and flushes: the wait is its own child, and nothing hangs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from distributed_helpers import run_ranks

import instrument
from instrument.testing import reset


def region_barrier_worker(rank: int, world_size: int) -> dict[str, Any]:
    reporter = instrument.Reporter(every=None, memory=False)
    if rank == 1:
        time.sleep(0.5)  # a slow rank: rank 0 waits for it at the region's barrier
    with instrument.timed("step", barrier=True, barrier_timeout=timedelta(seconds=30)):
        time.sleep(0.01)
    return reporter.flush().to_dict()


@pytest.mark.timeout(120)
def test_barrier_wait_is_a_child_outside_the_region(ranks: list[dict[str, Any]]) -> None:
    first, second = (instrument.Report.from_dict(r["region"]) for r in ranks)
    waited = first["step/barrier"]
    assert waited.concurrent
    assert waited.total >= 0.3  # rank 0 waited for rank 1
    assert first["step"].total < 0.3  # ... and its region is not inflated by the wait
    assert first["step"].self == pytest.approx(first["step"].total)
    assert second["step/barrier"].total < 0.3  # rank 1 arrived last: a short wait


def missing_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    reporter = instrument.Reporter(every=None, memory=False)
    start = time.monotonic()
    if rank == 0:
        with instrument.timed("step", barrier=True, barrier_timeout=timedelta(seconds=2)):
            pass
    else:
        time.sleep(4)  # never reaches the barrier in time
    return {"report": reporter.flush().to_dict(), "seconds": time.monotonic() - start}


@pytest.mark.timeout(120)
def test_a_rank_that_never_arrives_times_out_instead_of_hanging(
    ranks: list[dict[str, Any]],
) -> None:
    first = ranks[0]["missing"]
    report = instrument.Report.from_dict(first["report"])
    assert report["step"].count == 1  # the region ran after the timeout
    assert 1.5 <= report["step/barrier"].total < 10
    assert first["seconds"] < 10


def flush_barrier_worker(rank: int, world_size: int) -> list[str]:
    reporter = instrument.Reporter(
        every=None, memory=False, barrier=True, barrier_timeout=timedelta(seconds=30)
    )
    with instrument.timed("work"):
        pass
    if rank == 1:
        time.sleep(0.3)
    return list(reporter.flush().paths())


@pytest.mark.timeout(120)
def test_reporter_barrier_before_flush(ranks: list[dict[str, Any]]) -> None:
    assert [r["flush"] for r in ranks] == [["work"], ["work"]]


def every_case_worker(rank: int, world_size: int) -> dict[str, Any]:
    """The three cases on one pair of processes, the missing rank last: its rank 1 never
    reaches that barrier, so no barrier of the group may follow it."""
    results: dict[str, Any] = {}
    for name, worker in (
        ("region", region_barrier_worker),
        ("flush", flush_barrier_worker),
        ("missing", missing_rank_worker),
    ):
        reset()
        results[name] = worker(rank, world_size)
    return results


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    """What each rank's three cases returned: one spawn for the module, not one a test."""
    return run_ranks(every_case_worker, 2, timeout=90)


def test_barrier_region_without_a_group_just_times() -> None:
    reporter = instrument.Reporter(every=None, memory=False)

    @instrument.timed("solo", barrier=True)
    def solo() -> int:
        return 7

    assert solo() == 7
    report = reporter.flush()
    assert report["solo"].count == 1
    assert report["solo/barrier"].concurrent
    with pytest.raises(TypeError, match="needs a region name"):
        instrument.timed(None, barrier=True)  # type: ignore[call-overload]
