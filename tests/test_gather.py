"""Reports across ranks: real gloo processes, different work per rank, subgroups."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from distributed_helpers import run_ranks

import instrument
from instrument.hooks import collectives
from instrument.testing import FakeClock, reset, use_clock


def _work(clock: FakeClock, rank: int, reporter: instrument.Reporter) -> dict[str, Any]:
    with instrument.timed("forward"):
        clock.advance(0.1 * (rank + 1))  # rank r is r+1 times slower
    if rank == 1:
        with instrument.timed("only_on_1"):
            clock.advance(0.5)
    clock.advance(0.05)
    instrument.step(samples=10 * (rank + 1))
    return reporter.flush().to_dict()


def uneven_worker(rank: int, world_size: int, ranks: str) -> dict[str, Any]:
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, ranks=ranks, warmup=0, memory=False)
        return _work(clock, rank, reporter)


@pytest.mark.timeout(120)
def test_max_names_the_slowest_rank_and_regions_only_one_rank_ran(
    two: list[dict[str, Any]],
) -> None:
    for result in (r["minmax"] for r in two):
        report = instrument.Report.from_dict(result)
        forward = report["forward"]
        assert forward.rank_min == pytest.approx(0.1)
        assert forward.rank_max == pytest.approx(0.2)
        assert forward.rank_argmax == 1
        assert forward.rank_argmin == 0
        assert forward.rank_mean == pytest.approx(0.15)
        assert forward.ranks_present == 2
        assert forward.per_rank is None  # only with ranks="all"
        only = report["only_on_1"]  # present on rank 0's report too, never as zero
        assert only.ranks_present == 1
        assert only.rank_max == pytest.approx(0.5)
        assert only.rank_argmax == 1
        rate = report.across["throughput.samples_per_sec"]
        assert rate.rank_argmin == 1  # 20 samples in 0.75 s against 10 in 0.15 s
        assert rate.rank_max == pytest.approx(10 / 0.15)
        text = report.render()
        assert "slowest" in text
        assert "ranks: minmax" in text
        assert "across 2 ranks" in text
    first = instrument.Report.from_dict(result)
    assert first.world_size == 2


@pytest.mark.timeout(120)
def test_all_keeps_one_total_per_rank_with_none_where_absent(two: list[dict[str, Any]]) -> None:
    report = instrument.Report.from_dict(two[0]["all"])
    assert report["forward"].per_rank == pytest.approx((0.1, 0.2))
    assert report["only_on_1"].per_rank == (None, pytest.approx(0.5))
    assert report["only_on_1"].count == 0  # rank 0 never ran it: its own stats are empty


def subgroup_worker(rank: int, world_size: int) -> dict[str, Any] | None:
    group = dist.new_group([0, 2])  # collective over the world: every rank creates it
    if rank == 1:
        return None  # not in the group: never flushes across ranks
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, ranks="minmax", group=group, memory=False)
        return _work(clock, rank, reporter)


@pytest.mark.slow  # three ranks
@pytest.mark.timeout(120)
def test_a_subgroup_names_global_ranks() -> None:
    results = run_ranks(subgroup_worker, 3, timeout=100)
    assert results[1] is None
    for result in (results[0], results[2]):
        forward = instrument.Report.from_dict(result)["forward"]
        assert forward.ranks_present == 2
        assert forward.rank_argmax == 2  # the global rank, not the index in the group
        assert forward.rank_max == pytest.approx(0.3)


def suppressed_worker(rank: int, world_size: int) -> list[str]:
    undo = collectives.install()
    try:
        reporter = instrument.Reporter(every=None, ranks="minmax", memory=False)
        with instrument.timed("work"):
            pass
        reporter.flush()  # gathers, with collectives patched
        with instrument.timed("work"):
            pass
        return list(reporter.flush().paths())
    finally:
        undo()


@pytest.mark.timeout(120)
def test_the_gather_never_times_itself(two: list[dict[str, Any]]) -> None:
    for paths in (r["suppressed"] for r in two):
        assert paths == ["work"]


def local_worker(rank: int, world_size: int) -> int:
    reporter = instrument.Reporter(every=None, ranks="local", memory=False)
    if rank == 0:  # only rank 0 flushes: "local" is never collective
        with instrument.timed("x"):
            pass
        report = reporter.flush()
        assert report["x"].ranks is None
    return rank


@pytest.mark.timeout(120)
def test_local_reports_are_never_collective(two: list[dict[str, Any]]) -> None:
    assert [r["local"] for r in two] == [0, 1]


def two_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    """Each two-rank case in turn on one pair of processes."""
    results: dict[str, Any] = {}
    for name, case in (
        ("minmax", lambda: uneven_worker(rank, world_size, "minmax")),
        ("all", lambda: uneven_worker(rank, world_size, "all")),
        ("suppressed", lambda: suppressed_worker(rank, world_size)),
        ("local", lambda: local_worker(rank, world_size)),
    ):
        reset()
        results[name] = case()
    return results


@pytest.fixture(scope="module")
def two() -> list[dict[str, Any]]:
    """What each rank's cases returned: one spawn for the module, not one a test."""
    return run_ranks(two_rank_worker, 2, timeout=90)
