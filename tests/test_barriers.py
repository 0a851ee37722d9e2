"""Barriers before regions and flushes: the wait is its own child, and nothing hangs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from distributed_helpers import run_ranks

import instrument


def region_barrier_worker(rank: int, world_size: int) -> dict[str, Any]:
    reporter = instrument.Reporter(every=None, memory=False)
    if rank == 1:
        time.sleep(0.5)  # a slow rank: rank 0 waits for it at the region's barrier
    with instrument.timed("step", barrier=True, barrier_timeout=timedelta(seconds=30)):
        time.sleep(0.01)
    return reporter.flush().to_dict()


@pytest.mark.timeout(120)
def test_barrier_wait_is_a_child_outside_the_region() -> None:
    first, second = (instrument.Report.from_dict(r) for r in run_ranks(region_barrier_worker, 2))
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
def test_a_rank_that_never_arrives_times_out_instead_of_hanging() -> None:
    first, _ = run_ranks(missing_rank_worker, 2, timeout=60)
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
def test_reporter_barrier_before_flush() -> None:
    assert run_ranks(flush_barrier_worker, 2) == [["work"], ["work"]]


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
