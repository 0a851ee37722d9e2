"""Several reporters at once: each report holds every record made in its own interval.

The reference is a log of every record (path, duration) with the step it ended in; each
reporter's k-th report must hold, per path, exactly the figures of the records of its k-th
interval (count, total, min, max and the percentiles of the same histogram).
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
from distributed_helpers import run_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

import instrument
from instrument import registry
from instrument.stats import Accumulator
from instrument.testing import FakeClock, use_clock

#: One region of a step: (name, its own µs, µs of a child ``x`` inside it or None).
Region = tuple[str, int, "int | None"]

regions = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 5_000),
    st.none() | st.integers(0, 3_000),
)
steps = st.lists(st.lists(regions, max_size=3), min_size=1, max_size=14)


def run_step(step: list[Region], clock: FakeClock, log: list[tuple[str, int]]) -> None:
    """Time the step's regions on the fake clock and log each record (path, ns)."""
    for name, own, child in step:
        with instrument.timed(name):
            clock.advance(own * 1e-6)
            if child is not None:
                with instrument.timed("x"):
                    clock.advance(child * 1e-6)
                log.append((f"{name}/x", child * 1000))
        log.append((name, (own + (child or 0)) * 1000))


def reference(records: list[tuple[str, int]]) -> dict[str, tuple[Any, ...]]:
    """Per path: (count, total, min, max, p50, p90, p99) of ``records``, in seconds."""
    by_path: dict[str, list[int]] = {}
    for path, ns in records:
        by_path.setdefault(path, []).append(ns)
    out = {}
    for path, values in by_path.items():
        acc = Accumulator()
        acc.add_batch(values)
        summary = acc.summary()
        assert summary is not None
        count, total_ns, _, low, high, _, p50, p90, p99 = summary
        out[path] = (count, total_ns / 1e9, low, high, p50, p90, p99)
    return out


def figures(report: instrument.Report) -> dict[str, tuple[Any, ...]]:
    out = {}
    for node in report.nodes:
        host = node.host
        out[node.path] = (host.count, host.total, host.min, host.max, host.p50, host.p90, host.p99)
    return out


def check_readers(everys: list[int], program: list[list[Region]]) -> None:
    clock = FakeClock()
    log: list[list[tuple[str, int]]] = []  # the records of each step
    with use_clock(clock):
        reports: list[list[instrument.Report]] = [[] for _ in everys]
        reporters = [
            instrument.Reporter(every=every, sinks=[out.append], diagnose=False, memory=False)
            for every, out in zip(everys, reports, strict=True)
        ]
        for step in program:
            records: list[tuple[str, int]] = []
            run_step(step, clock, records)
            log.append(records)
            instrument.step()
        for reporter in reporters:
            reporter.close()
    for every, got in zip(everys, reports, strict=True):
        intervals = [log[start : start + every] for start in range(0, len(log), every)]
        want = [reference([r for step in steps for r in step]) for steps in intervals]
        while want and not want[-1] and len(want) > len(got):  # a last interval of no record
            want.pop()
        assert [figures(report) for report in got] == want, f"every={every}"


#: The ``every`` of each of two, three or ten reporters.
everys = st.sampled_from([2, 3, 10]).flatmap(
    lambda n: st.lists(st.integers(1, 7), min_size=n, max_size=n)
)


@settings(max_examples=40, deadline=None)
@given(everys, steps)
def test_each_of_several_reporters_reports_every_record_of_its_intervals(
    everys: list[int], program: list[list[Region]]
) -> None:
    check_readers(everys, program)


def test_records_of_other_threads_reach_every_reporter_once() -> None:
    made = {"n": 0}
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            with instrument.timed("worker"):
                pass
            made["n"] += 1

    outs: list[list[instrument.Report]] = [[], [], []]
    reporters = [
        instrument.Reporter(every=every, sinks=[out.append], diagnose=False, memory=False)
        for every, out in zip((2, 3, 5), outs, strict=True)
    ]
    thread = threading.Thread(target=record)
    thread.start()
    try:
        for _ in range(60):
            with instrument.timed("main"):
                pass
            instrument.step()
    finally:
        stop.set()
        thread.join()
    for reporter in reporters:
        reporter.close()
    assert made["n"] > 0
    totals = []
    for out in outs:
        assert sum(r["main"].count for r in out if "main" in r) == 60
        assert sum(r["worker"].count for r in out if "worker" in r) == made["n"]
        totals.append(sum(r["worker"].total for r in out if "worker" in r))
    assert totals[0] == pytest.approx(totals[1], rel=1e-9) == pytest.approx(totals[2], rel=1e-9)


def test_a_dropped_reporter_stops_reading_and_takes_nothing() -> None:
    kept: list[instrument.Report] = []
    keeper = instrument.Reporter(every=None, sinks=[kept.append], diagnose=False)
    dropped = instrument.Reporter(every=None, sinks=[], diagnose=False)
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None
    assert registry.readers() == 1
    for _ in range(4):
        with instrument.timed("work"):
            pass
    assert keeper.flush()["work"].count == 4


def test_a_closed_reporter_stops_reading() -> None:
    first = instrument.Reporter(every=None, sinks=[], diagnose=False)
    second = instrument.Reporter(every=None, sinks=[], diagnose=False)
    with instrument.timed("before"):
        pass
    first.close()
    assert registry.readers() == 1
    with instrument.timed("after"):
        pass
    report = second.flush()
    assert report["before"].count == 1
    assert report["after"].count == 1


def test_a_later_reporter_reports_from_when_it_was_made() -> None:
    first = instrument.Reporter(every=None, sinks=[], diagnose=False)
    with instrument.timed("early"):
        pass
    later = instrument.Reporter(every=None, sinks=[], diagnose=False)
    with instrument.timed("late"):
        pass
    early_view, late_view = first.flush(), later.flush()
    assert early_view["early"].count == 1
    assert early_view["late"].count == 1
    assert "early" not in late_view
    assert late_view["late"].count == 1


def test_a_region_open_across_flushes_is_split_per_reporter() -> None:
    clock = FakeClock()
    with use_clock(clock):
        outs: list[list[instrument.Report]] = [[], []]
        reporters = [
            instrument.Reporter(every=every, sinks=[out.append], diagnose=False, memory=False)
            for every, out in zip((2, 3), outs, strict=True)
        ]
        with instrument.timed("epoch"):
            for _ in range(6):
                clock.advance(0.010)
                instrument.step()
            clock.advance(0.005)  # after the last step: the closing flush's part
        for reporter in reporters:
            reporter.close()
    for every, out in zip((2, 3), outs, strict=True):
        shares = [round(r["epoch"].total, 9) for r in out]
        assert shares == [round(every * 0.010, 9)] * (6 // every) + [0.005]


def cross_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    outs: list[list[instrument.Report]] = [[], []]
    reporters = [
        instrument.Reporter(
            every=every,
            sinks=[out.append],
            ranks="minmax",
            rank_timeout=20,
            diagnose=False,
            memory=False,
        )
        for every, out in zip((2, 3), outs, strict=True)
    ]
    for step in range(6):
        with instrument.timed("work"):
            pass
        if rank == 1 and step % 2:
            with instrument.timed("extra"):
                pass
        instrument.step()
    for reporter in reporters:
        reporter.close()
    return {
        "counts": [[r["work"].count for r in out] for out in outs],
        "notes": [[r.across_note for r in out] for out in outs],
        "ranks": [[r["work"].ranks is not None for r in out] for out in outs],
    }


@pytest.mark.timeout(120)
def test_each_reporter_meets_the_same_reporter_of_the_other_ranks() -> None:
    for result in run_ranks(cross_rank_worker, 2, timeout=100):
        assert result["counts"] == [[2, 2, 2], [3, 3]]
        assert result["notes"] == [[""] * 3, [""] * 2]  # every flush combined both ranks
        assert result["ranks"] == [[True] * 3, [True] * 2]
