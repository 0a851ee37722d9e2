"""A region open across a flush: each interval shows its time inside the window, marked
open; the interval it closes in gets only the remainder. Exact, with a fake clock."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import instrument
from instrument import Report
from instrument.sinks import InMemory
from instrument.testing import FakeClock, use_clock


def check_consistent(report: Report) -> None:
    """Children <= parent, self >= 0, and the top level plus the flush line plus (other) is
    the step time (the flush line never more than the top level left uncovered)."""
    for node in report.nodes:
        below = sum(c.total for c in report.children(node.path) if not c.concurrent)
        assert below <= node.total + 1e-12, (report.index, node.path)
        assert node.self == pytest.approx(node.total - below, abs=1e-12)
        assert node.self >= 0.0
    if report.step_time is not None:
        top = sum(n.total for n in report.children("") if not n.concurrent)
        assert report.other is not None
        assert top + report.flush_time + report.other == pytest.approx(
            report.step_time.total, abs=1e-12
        )
        assert top + report.flush_time <= report.step_time.total + 1e-12


def test_train_region_around_the_loop_issue_example(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=5, sinks=[sink], normalizer="steps")
    with instrument.timed("train"):
        for _ in range(5):
            with instrument.timed("forward"):
                clock.advance(0.004)
            with instrument.timed("backward"):
                clock.advance(0.004)
            clock.advance(0.001)
            instrument.step()
    reporter.close()
    first, last = sink.reports
    check_consistent(first)
    train = first["train"]
    assert train.open
    assert (train.count, train.total) == (0, pytest.approx(0.009))
    assert train.self == pytest.approx(0.001)  # the untimed millisecond inside "train"
    assert first["train/forward"].total == pytest.approx(0.004)
    assert first.other == pytest.approx(0.0)
    text = first.render()
    assert "train (open)" in text
    assert "44.4" in text  # forward and backward: 4 of 9 ms of their parent
    # "train" closes right after the last flush: only the remainder (nothing) is left
    closed = last["train"]
    assert not closed.open
    assert (closed.count, closed.total, closed.self) == (1, 0.0, 0.0)
    assert closed.mean == pytest.approx(0.045)  # per-call figures describe the whole call


def test_epoch_of_four_steps_flushed_every_two(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[sink])
    with instrument.timed("epoch"):
        for _ in range(4):
            with instrument.timed("work"):
                clock.advance(1.0)
            instrument.step()
    reporter.close()
    assert len(sink.reports) == 3
    for report in sink.reports[:2]:
        check_consistent(report)
        epoch = report["epoch"]
        assert (epoch.open, epoch.count, epoch.total, epoch.self) == (True, 0, 2.0, 0.0)
        assert report["epoch/work"].total == 2.0
    epoch = sink.reports[2]["epoch"]
    assert (epoch.open, epoch.count, epoch.total, epoch.self, epoch.max) == (
        False,
        1,
        0.0,
        0.0,
        4.0,
    )


def _nested_run(clock: FakeClock, every: int) -> list[Report]:
    """Two epochs of five steps, each inside "train" > "epoch", flushed every ``every``
    steps (not aligned with epochs): 1 s of work and 0.5 s of untimed time per step, 0.25 s
    in each epoch outside its steps, 0.125 s in "train" between epochs."""
    sink = InMemory()
    reporter = instrument.Reporter(every=every, sinks=[sink])
    with instrument.timed("train"):
        for _ in range(2):
            clock.advance(0.125)
            with instrument.timed("epoch"):
                clock.advance(0.25)
                for _ in range(5):
                    with instrument.timed("work"):
                        clock.advance(1.0)
                    clock.advance(0.5)
                    instrument.step()
    reporter.close()
    return list(sink.reports)


@pytest.mark.parametrize("every", [1, 2, 3, 4, 7])
def test_nested_open_regions_split_over_intervals_without_double_counting(
    clock: FakeClock, every: int
) -> None:
    reports = _nested_run(clock, every)
    for report in reports:
        check_consistent(report)
    # over all intervals each region's totals add up to its real time, once
    assert sum(r["train"].total for r in reports if "train" in r) == pytest.approx(15.75)
    assert sum(r["train/epoch"].total for r in reports if "train/epoch" in r) == pytest.approx(15.5)
    assert sum(r["train/epoch/work"].total for r in reports if "train/epoch/work" in r) == 10
    assert sum(r["train"].count for r in reports if "train" in r) == 1
    assert sum(r["train/epoch"].count for r in reports if "train/epoch" in r) == 2
    # "train" covers every step of every interval; open in all but the last report
    for report in reports:
        if report.step_time is not None:
            assert report["train"].total == pytest.approx(report.step_time.total)
    assert all(r["train"].open for r in reports[:-1])
    assert not reports[-1]["train"].open


def test_nested_open_regions_exact_per_interval(clock: FakeClock) -> None:
    reports = _nested_run(clock, every=3)
    # flushes at steps 3 (t=4.875), 6 (t=9.75), 9 (t=14.25) and at close (t=15.75); epoch 1
    # runs 0.125..7.875, epoch 2 8.0..15.75
    first, second, third, last = reports
    assert (first.steps, second.steps, third.steps, last.steps) == (3, 3, 3, 1)
    assert first["train"].total == pytest.approx(4.875)
    assert first["train/epoch"].total == pytest.approx(4.75)
    assert first["train/epoch"].self == pytest.approx(0.25 + 3 * 0.5)
    # interval 2: epoch 1 ends (count 1, its remainder 3.0 s), epoch 2 starts and is open
    assert second["train/epoch"].count == 1
    assert second["train/epoch"].open
    assert second["train/epoch"].max == pytest.approx(7.75)  # the whole first epoch
    assert second["train/epoch"].total == pytest.approx(3.0 + 1.75)
    assert second["train"].total == pytest.approx(4.875)
    assert second["train"].self == pytest.approx(0.125)
    assert third["train/epoch"].total == pytest.approx(4.5)
    assert (last["train"].count, last["train"].total, last["train"].max) == (1, 1.5, 15.75)


def test_open_decorated_function_is_split_too(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[sink])

    @instrument.timed("fit")
    def fit() -> None:
        for _ in range(4):
            with instrument.timed("work"):
                clock.advance(1.0)
            clock.advance(0.5)
            instrument.step()
        clock.advance(0.25)

    fit()
    reporter.close()
    first, second, last = sink.reports
    for report in sink.reports:
        check_consistent(report)
    assert (first["fit"].open, first["fit"].count, first["fit"].total) == (True, 0, 3.0)
    assert (second["fit"].open, second["fit"].total) == (True, 3.0)
    assert (last["fit"].open, last["fit"].count, last["fit"].total) == (False, 1, 0.25)
    assert last["fit"].max == 6.25


def test_a_region_reopened_after_closing_is_split_per_call(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink])
    with instrument.timed("epoch"):
        clock.advance(2.0)
        reporter.flush()
        clock.advance(1.0)
    with instrument.timed("epoch"):  # the next epoch: a new call, same path
        clock.advance(4.0)
        reporter.flush()
        clock.advance(8.0)
    reporter.flush()
    totals = [(r["epoch"].count, r["epoch"].total, r["epoch"].open) for r in sink.reports]
    assert totals == [(0, 2.0, True), (1, 5.0, True), (1, 8.0, False)]


def test_exception_in_open_region_still_splits_cleanly(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink])

    def failing_epoch() -> None:
        with instrument.timed("epoch"):
            clock.advance(1.0)
            reporter.flush()
            clock.advance(2.0)
            raise KeyError("x")

    with pytest.raises(KeyError):
        failing_epoch()
    reporter.flush()
    assert [(r["epoch"].count, r["epoch"].total) for r in sink.reports] == [(0, 1.0), (1, 2.0)]


def test_region_open_in_another_thread_is_reported_whole_when_it_ends(clock: FakeClock) -> None:
    """The documented limit: only the flushing thread's open regions are split."""
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink])
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:
        with instrument.timed("loader"):
            with instrument.timed("read"):
                clock.advance(1.0)
            started.set()
            release.wait(10)
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(10)
    with instrument.timed("main"):
        clock.advance(2.0)
        first = reporter.flush()  # "main" is open here and split; "loader" is out of reach
    release.set()
    assert done.wait(10)
    thread.join()
    second = reporter.flush()
    assert "loader" not in first
    assert first["loader/read"].total == 1.0
    assert (first["main"].open, first["main"].total) == (True, 2.0)
    loader = second["loader"]
    assert (loader.open, loader.count, loader.total) == (False, 1, 3.0)  # whole, once
    assert (second["main"].open, second["main"].total) == (False, 0.0)


def test_open_marker_round_trips_and_renders(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None)
    with instrument.timed("epoch"):
        clock.advance(1.5)
        report = reporter.flush()
    assert report["epoch"].open
    data = report.to_dict()
    assert data["nodes"][0]["open"] is True
    assert Report.from_dict(data) == report
    assert not Report.from_dict(reporter.flush().to_dict())["epoch"].open
    line = next(line for line in report.render().splitlines() if "epoch" in line)
    assert line.split() == ["epoch", "(open)", "1500.000", "100.0", "0"]  # no per-call figures


# -- random trees with flushes anywhere: consistent intervals, conservation over all ------

names = st.sampled_from(["a", "b", "c"])
micros = st.integers(min_value=0, max_value=5_000)
blocks = st.recursive(
    st.tuples(names, micros, st.just([]), micros, st.booleans(), st.booleans()),
    lambda inner: st.tuples(
        names, micros, st.lists(inner, max_size=3), micros, st.booleans(), st.booleans()
    ),
    max_leaves=12,
)


def _run_block(
    block: Any, clock: FakeClock, reporter: instrument.Reporter, path: str, truth: dict[str, int]
) -> None:
    name, pre, children, post, flush_inside, as_decorator = block
    full = f"{path}/{name}" if path else name

    def body() -> None:
        clock.advance(pre * 1e-6)
        if flush_inside:
            instrument.step()
            reporter.flush()
        for child in children:
            _run_block(child, clock, reporter, full, truth)
        clock.advance(post * 1e-6)

    start = clock.now_ns()
    if as_decorator:
        instrument.timed(name)(body)()
    else:
        with instrument.timed(name):
            body()
    truth[full] = truth.get(full, 0) + clock.now_ns() - start


def check_flushed_anywhere(tree: list[Any], flush_cost: int) -> None:
    """Flushes inside regions and between them, each taking ``flush_cost`` µs (its time is
    in its region, or the next report's flush line)."""
    instrument.testing.reset()
    clock = FakeClock()
    with use_clock(clock):
        sink = InMemory()
        reporter = instrument.Reporter(
            every=None, sinks=[sink, lambda _: clock.advance(flush_cost * 1e-6)]
        )
        truth: dict[str, int] = {}
        for block, flush_after in tree:
            _run_block(block, clock, reporter, "", truth)
            if flush_after:
                instrument.step()
                reporter.flush()
        instrument.step()
        reporter.close()
    for report in sink.reports:
        check_consistent(report)
    for path, ns in truth.items():
        seen = sum(r[path].total for r in sink.reports if path in r)
        assert seen == pytest.approx(ns / 1e9, abs=1e-9), path
    assert all(not n.open for n in sink.reports[-1].nodes)


trees = given(
    tree=st.lists(st.tuples(blocks, st.booleans()), min_size=1, max_size=3),
    flush_cost=micros,
)


@settings(max_examples=15, deadline=None)
@trees
def test_random_trees_flushed_anywhere_stay_consistent_and_conserve_time(
    tree: list[Any], flush_cost: int
) -> None:
    check_flushed_anywhere(tree, flush_cost)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@trees
def test_random_trees_flushed_anywhere_in_many_trees(tree: list[Any], flush_cost: int) -> None:
    check_flushed_anywhere(tree, flush_cost)


def test_a_flush_from_another_thread_keeps_the_carry_of_this_threads_open_call(
    clock: FakeClock,
) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink])
    with instrument.timed("epoch"):
        clock.advance(1.0)
        reporter.flush()  # split here: 1 s reported
        clock.advance(2.0)
        other = threading.Thread(target=reporter.flush)  # cannot see "epoch"
        other.start()
        other.join()
        clock.advance(4.0)
    reporter.flush()
    totals = [r["epoch"].total for r in sink.reports if "epoch" in r]
    assert totals == [1.0, 6.0]  # 7 s in all, once: the carry survived the other flush


def test_an_abandoned_open_call_leaves_no_carry_behind(clock: FakeClock) -> None:
    from instrument.regions.frames import abandon

    reporter = instrument.Reporter(every=None)
    data = instrument.Timer("data")
    data.start()
    clock.advance(1.0)
    assert reporter.flush()["data"].total == 1.0
    abandon(data.region)  # e.g. the end of a loader: not a batch, nothing recorded
    clock.advance(1.0)
    assert reporter.flush().get("data") is None
    with instrument.timed("data"):
        clock.advance(3.0)
    assert reporter.flush()["data"].total == 3.0


def test_a_new_thread_with_an_ended_threads_id_keeps_its_own_calls_whole(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from instrument import registry
    from instrument.regions.frames import abandon

    class SameIdent:  # threading as the registry sees it, where the OS hands an id on
        get_ident = staticmethod(lambda: 7)

        def __getattr__(self, name: str) -> Any:
            return getattr(threading, name)

    monkeypatch.setattr(registry, "threading", SameIdent())
    reporter = instrument.Reporter(every=None)
    seen: list[float] = []

    def first() -> None:  # a split call, abandoned; the thread ends before flushing again
        job = instrument.Timer("job")
        job.start()
        clock.advance(1.0)
        seen.append(reporter.flush()["job"].total)
        abandon(job.region)

    def second() -> None:  # a whole call of the same path in the next thread
        with instrument.timed("job"):
            clock.advance(3.0)
        seen.append(reporter.flush()["job"].total)

    for target in (first, second):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen == [1.0, 3.0]  # not 2.0: the first thread's carry is not the second's
