"""Async work (a collective until its wait(), any Span) overlaps its siblings: it is not
subtracted from its parent's self time, not counted as covering step time in (other), and
not part of the whole that the no-step tree's percentages divide. What it covers of its
parent, overlaps counted once, is the parent's ``concurrent_time``: the waiting that a
region's own time leaves out."""

from __future__ import annotations

import threading

import pytest

import instrument
from instrument import registry
from instrument.distributed.stragglers import own_times
from instrument.regions.span import Span
from instrument.report import Node, Report
from instrument.testing import FakeClock
from instrument.tree import rows


def test_a_span_is_not_subtracted_from_its_parents_self(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    with instrument.timed("step"):
        span = Span("all_reduce")  # runs beside the forward pass
        clock.advance(1.0)
        with instrument.timed("forward"):
            clock.advance(2.0)
        span.end()
        clock.advance(0.5)
    report = reporter.flush()
    assert report["step/all_reduce"].concurrent
    assert report["step/all_reduce"].total == 3.0
    assert report["step"].total == 3.5
    assert report["step"].self == 1.5  # 3.5 - forward's 2.0; the span overlaps, it is not a part


def test_a_top_level_span_does_not_cover_step_time_in_other(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    span = Span("prefetch")
    with instrument.timed("forward"):
        clock.advance(1.0)
    clock.advance(3.0)
    span.end()
    instrument.step()
    report = reporter.flush()
    assert report["prefetch"].total == 4.0
    assert report.step_time is not None
    assert report.step_time.total == 4.0
    assert report.other == 3.0  # the span's 4 s covered nothing: it overlapped the rest
    other = next(row for row in rows(report) if "(other)" in row.label)
    assert other.time == 3.0
    assert other.percent == pytest.approx(75.0)


def test_no_step_percentages_leave_spans_out_of_the_whole(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    span = Span("send")
    with instrument.timed("compute"):
        clock.advance(1.0)
    with instrument.timed("save"):
        clock.advance(3.0)
    span.end()  # 4 s, overlapping both
    report = reporter.flush()
    assert report.step_time is None
    percent = {row.label.split()[0]: row.percent for row in rows(report)}
    assert percent == {"compute": 25.0, "save": 75.0, "send": 100.0}


def _buckets(clock: FakeClock, starts_ends: list[tuple[float, float]], total: float) -> None:
    """A ``backward`` of ``total`` seconds holding one ``ddp_all_reduce`` span per
    ``(start, end)`` (seconds from its start; an end may lie past ``total``)."""
    events = sorted(
        [(start, 0, i) for i, (start, _) in enumerate(starts_ends)]
        + [(end, 1, i) for i, (_, end) in enumerate(starts_ends)]
        + [(total, 2, -1)]
    )
    spans: dict[int, Span] = {}
    now = 0.0
    region = instrument.timed("backward")
    region.__enter__()
    for at, kind, i in events:
        clock.advance(at - now)
        now = at
        if kind == 0:
            spans[i] = Span("ddp_all_reduce")
        elif kind == 1:
            spans[i].end()
        else:
            region.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("buckets", "total", "covered", "own"),
    [
        pytest.param([(0.0, 2.0), (1.0, 3.0)], 3.5, 3.0, 0.5, id="overlapping: the union"),
        pytest.param([(0.0, 1.0), (2.0, 3.0)], 4.0, 2.0, 2.0, id="apart: the sum"),
        pytest.param([(0.0, 3.0)], 1.0, 1.0, 0.0, id="past the parent's end: clipped"),
        pytest.param([(0.5, 1.0), (0.0, 2.0), (0.2, 0.4)], 3.0, 2.0, 1.0, id="nested"),
    ],
)
def test_concurrent_time_counts_overlapping_spans_once_and_own_time_leaves_it_out(
    clock: FakeClock,
    buckets: list[tuple[float, float]],
    total: float,
    covered: float,
    own: float,
) -> None:
    reporter = instrument.Reporter(every=None, normalizer=2.0, memory=False)
    _buckets(clock, buckets, total)
    report = reporter.flush()
    backward = report["backward"]
    assert backward.total == pytest.approx(total / 2)  # (normalized: divided by 2)
    assert backward.concurrent_time == pytest.approx(covered / 2)
    assert report["backward/ddp_all_reduce"].concurrent_time == 0.0
    assert own_times(report.nodes) == {"/own/backward": pytest.approx(own / 2)}
    again = Report.from_dict(report.to_dict())
    assert again == report
    assert again["backward"].concurrent_time == backward.concurrent_time
    reporter.close()


def test_concurrent_time_is_per_step_with_the_steps_normalizer(
    clock: FakeClock,
) -> None:
    reporter = instrument.Reporter(every=None, normalizer="steps", memory=False)
    for _ in range(2):
        _buckets(clock, [(0.0, 2.0), (1.0, 3.0)], 3.5)
        instrument.step()
    report = reporter.flush()
    assert report["backward"].total == pytest.approx(3.5)
    assert report["backward"].concurrent_time == pytest.approx(3.0)
    reporter.close()


def test_concurrent_time_of_spans_ended_on_other_threads_and_united_past_the_bound(
    clock: FakeClock, reporter: instrument.Reporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry._Spans, "bound", 4)
    registry.spans = registry._Spans()

    def end(span: Span) -> None:  # on another thread, as gloo's callbacks do
        thread = threading.Thread(target=span.end)
        thread.start()
        thread.join()

    with instrument.timed("step"):
        spans = []
        for i in range(10):  # a span a second, each 2 s long: 0..11 covered
            spans.append(Span("all_reduce (async)"))
            clock.advance(1.0)
            if i:
                end(spans[i - 1])
        clock.advance(1.0)
        end(spans[-1])
        clock.advance(1.0)
    assert len(registry._united) == 1  # (united on the way: the list stays short)
    report = reporter.flush()
    assert report["step"].total == 12.0
    assert report["step/all_reduce (async)"].total == 20.0
    assert report["step"].concurrent_time == 11.0
    assert own_times(report.nodes) == {"/own/step": 1.0}
    assert registry.spans == []
    assert registry._united == {}
    assert reporter.flush().get("step") is None  # nothing carried into the next interval


def test_a_report_without_concurrent_time_reads_as_none() -> None:
    node = Node.from_dict(
        {"path": "backward", "self": 0.0, "host": instrument.Stats.empty().to_dict()}
    )
    assert node.concurrent_time == 0.0
