"""Async work (a collective until its wait(), any Span) overlaps its siblings: it is not
subtracted from its parent's self time, not counted as covering step time in (other), and
not part of the whole that the no-step tree's percentages divide."""

from __future__ import annotations

import pytest

import instrument
from instrument.regions.span import Span
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
    assert other.total == 3.0
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
