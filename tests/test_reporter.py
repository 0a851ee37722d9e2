"""Reporter: intervals, steps, normalizers, levels, sinks, validation."""

from __future__ import annotations

import gc
import io
import logging

import pytest

import instrument
from instrument.sinks import InMemory
from instrument.testing import FakeClock, capture_reports


def _train(clock: FakeClock, steps: int) -> None:
    for _ in range(steps):
        with instrument.timed("data"):
            clock.advance(0.1)
        with instrument.timed("forward"):
            clock.advance(0.3)
        clock.advance(0.1)  # untimed work
        instrument.step()


def test_flushes_every_n_steps_with_step_root_and_other(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[sink])  # held: the ticker holds it weakly
    _train(clock, 5)
    assert reporter.steps == 1
    assert [r.steps for r in sink.reports] == [2, 2]
    report = sink.last
    assert sorted(report.paths()) == ["data", "forward"]  # never prefixed by a synthetic root
    assert report.step_time is not None
    assert report.step_time.total == pytest.approx(1.0)
    assert report.step_time.count == 2
    assert report["forward"].total == pytest.approx(0.6)
    assert report.other == pytest.approx(0.2)
    text = report.render()
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("region")))
    assert lines[header + 1].startswith("step (2 steps)")  # the first line under the header
    assert "(other)" in text


def test_reports_come_at_multiples_of_every_also_after_a_flush_of_your_own(
    clock: FakeClock,
) -> None:
    reports: list[instrument.Report] = []
    reporter = instrument.Reporter(every=4, sinks=[reports.append])
    for step in range(1, 13):
        clock.advance(0.1)
        instrument.step()
        if step == 3:
            reporter.flush()
    assert [(r.step - r.steps, r.step) for r in reports] == [(0, 3), (3, 4), (4, 8), (8, 12)]


def test_another_threads_top_level_work_overlaps_the_steps_and_leaves_other_alone(
    clock: FakeClock,
) -> None:
    """A background thread's top-level region is concurrent (shown "(async)"): it is not
    counted against the step, whose untimed time stays in ``(other)`` (it took the
    ``(other)`` of the steps, the lines summing past 100 %)."""
    import threading

    def background() -> None:
        with instrument.timed("bg"):
            clock.advance(0.0)  # (the fake clock is shared: no time of its own)

    with capture_reports(normalizer=1.0) as reports:
        worker = threading.Thread(target=background)
        worker.start()
        worker.join()
        _train(clock, 2)
    report = reports[-1]
    assert report["bg"].concurrent
    assert not report["data"].concurrent
    assert not report["forward"].concurrent
    assert report.other == pytest.approx(0.2)  # the loop's own untimed 0.1 s a step
    assert "bg (async)" in report.render()


def test_numeric_normalizer_divides_times_not_counts(clock: FakeClock) -> None:
    with capture_reports(normalizer=4.0) as reports:
        for _ in range(3):
            with instrument.timed("x"):
                clock.advance(2.0)
    node = reports[-1]["x"]
    assert (node.count, node.total, node.mean, node.max) == (3, 1.5, 0.5, 0.5)


def test_steps_normalizer_gives_per_step_totals(clock: FakeClock) -> None:
    with capture_reports(normalizer="steps") as reports:
        _train(clock, 4)
    report = reports[-1]
    assert report["forward"].total == pytest.approx(0.3)
    assert report["forward"].count == 4
    assert report["forward"].mean == pytest.approx(0.3)
    assert report.step_time is not None
    assert report.step_time.total == pytest.approx(0.5)
    assert "ms/step" in report.render()


def test_records_made_before_the_reporter_are_in_its_first_flush(clock: FakeClock) -> None:
    with instrument.timed("early"):
        clock.advance(1.0)
    reporter = instrument.Reporter(every=None)
    assert reporter.flush()["early"].total == 1.0


def test_close_flushes_what_is_left_and_detaches(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=10, sinks=[sink])
    _train(clock, 3)
    reporter.close()
    assert [r.steps for r in sink.reports] == [3]
    assert reporter.closed
    _train(clock, 20)
    assert len(sink.reports) == 1
    assert reporter.close() is None


def test_reporter_is_held_weakly_by_the_step_ticker() -> None:
    reporter = instrument.Reporter(every=1)
    assert reporter in instrument.reporter.live_reporters()
    del reporter
    gc.collect()
    assert instrument.reporter.live_reporters() == ()
    instrument.step()


def test_one_snapshot_for_every_sink_and_callables_work(clock: FakeClock) -> None:
    seen: list[instrument.Report] = []
    first, second = InMemory(), InMemory()
    reporter = instrument.Reporter(every=None, sinks=[first, seen.append, second])
    with instrument.timed("x"):
        clock.advance(1.0)
    report = reporter.flush()
    assert first.last is report
    assert seen[0] is report
    assert second.last is report


def test_failing_sink_is_logged_once_and_skipped(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(report: instrument.Report) -> None:
        raise OSError("disk full")

    good = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[broken, good])
    with caplog.at_level(logging.ERROR, logger="instrument"):
        for _ in range(3):
            with instrument.timed("x"):
                clock.advance(1.0)
            reporter.flush()
    assert len(good.reports) == 3
    failures = [r for r in caplog.records if "failed and was skipped" in r.getMessage()]
    assert len(failures) == 1
    assert "disk full" in caplog.text


def test_level_filter_hides_regions_and_their_subtrees(clock: FakeClock) -> None:
    with (
        capture_reports(level=1) as reports,
        instrument.timed("coarse", level=1),
        instrument.timed("detail", level=2),
        instrument.timed("inside"),
    ):
        clock.advance(1.0)
    assert reports[-1].paths() == ("coarse",)


def test_level_filter_hides_children_of_a_filtered_region_still_open_at_flush(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    filtered = instrument.Reporter(every=None, level=0)
    with instrument.timed("a"), instrument.timed("fine", level=1):
        with instrument.timed("inner"):
            clock.advance(1.0)
        first = filtered.flush()  # "a/fine" is open and filtered out, with its child
    assert first.paths() == ("a",)
    assert (first["a"].open, first["a"].total) == (True, 1.0)
    assert filtered.flush().paths() == ("a",)
    filtered.close()


def test_steps_normalizer_without_steps_renders_undivided_times(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, normalizer="steps")
    with instrument.timed("x"):
        clock.advance(1.0)
    text = reporter.flush().render()
    assert "no steps marked: interval totals" in text
    assert "ms/step" not in text
    assert "1000.000" in text
    reporter.close()


def test_a_text_stream_as_sink_prints_the_tree(clock: FakeClock) -> None:
    stream = io.StringIO()
    reporter = instrument.Reporter(every=None, sinks=[stream])
    with instrument.timed("x"):
        clock.advance(1.0)
    reporter.flush()
    assert "x" in stream.getvalue()
    assert "total ms" in stream.getvalue()


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0, -1.0])
def test_normalizer_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="normalizer must be a finite number > 0"):
        instrument.Reporter(every=None, normalizer=bad)


def test_unhashable_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="region name must be a non-empty string"):
        instrument.timed(["a"])  # type: ignore[call-overload]


def test_flush_inside_an_open_region(clock: FakeClock, reporter: instrument.Reporter) -> None:
    with instrument.timed("outer"):
        with instrument.timed("inner"):
            clock.advance(1.0)
        early = reporter.flush()
    assert early.paths() == ("outer", "outer/inner")
    assert (early["outer"].open, early["outer"].total, early["outer"].self) == (True, 1.0, 0.0)
    assert "outer (open)" in early.render()
    late = reporter.flush()
    assert late.paths() == ("outer",)
    assert (late["outer"].open, late["outer"].count, late["outer"].total) == (False, 1, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0}, "every must be a positive int"),
        ({"every": -3}, "every must be a positive int"),
        ({"normalizer": 0}, "normalizer must be a finite number > 0, got 0"),
        ({"normalizer": -1.5}, "normalizer must be a finite number > 0"),
        ({"normalizer": "tokens"}, "unknown normalizer 'tokens'; expected a number > 0 or 'steps'"),
        ({"ranks": "foo"}, "unknown ranks 'foo'; expected one of 'local', 'minmax', 'all'"),
        ({"level": -1}, "region level must be an int >= 0"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        instrument.Reporter(**kwargs)  # type: ignore[arg-type]


def test_not_a_sink() -> None:
    with pytest.raises(TypeError, match="not a sink: 42"):
        instrument.Reporter(sinks=[42])


def test_console_and_logging_sinks(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    reporter = instrument.Reporter(
        every=None, sinks=[instrument.sinks.Console(stream), instrument.sinks.Logging()]
    )
    with instrument.timed("a"), instrument.timed("b"):
        clock.advance(0.002)
    with caplog.at_level(logging.INFO, logger="instrument"):
        report = reporter.flush()
    assert "└── b" in stream.getvalue()
    (record,) = [r for r in caplog.records if r.name == "instrument"]
    assert record.instrument_report is report  # type: ignore[attr-defined]
    assert "2.000" in record.getMessage()


def test_console_falls_back_to_ascii(clock: FakeClock) -> None:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    reporter = instrument.Reporter(every=None, sinks=[instrument.sinks.Console(stream)])
    with instrument.timed("a"), instrument.timed("b"):
        clock.advance(0.001)
    reporter.flush()
    assert "`-- b" in raw.getvalue().decode("ascii")
