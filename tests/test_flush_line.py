"""The flush's own time is a line of the tree, ``(instrument flush)``, not ``(other)``.

A flush due at a step runs after that step's tick, so its time falls in the next step: it
read as ``(other)`` ("in no region": your code) although it was the reporter collecting,
gathering and writing the last report.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from distributed_helpers import run_ranks

import instrument
from instrument import cli
from instrument.html import _interval
from instrument.integrations.figures import figures
from instrument.reading import ReportFileError, read_file
from instrument.report import FLUSH_ROW, Report
from instrument.sinks import ChromeTrace
from instrument.sinks.scalars import scalars
from instrument.testing import FakeClock

FLUSH = 0.030  # what each flush costs: its sink moves the fake clock
WORK = 0.010  # the "work" region of a step
LOOSE = 0.002  # untimed work of a step: the real (other)


def costly_sink(clock: FakeClock, reports: list[Report]) -> Callable[[Report], None]:
    """A sink that keeps the reports and takes :data:`FLUSH` seconds."""

    def write(report: Report) -> None:
        reports.append(report)
        clock.advance(FLUSH)

    return write


def run_steps(clock: FakeClock, steps: int) -> None:
    for _ in range(steps):
        with instrument.timed("work"):
            clock.advance(WORK)
        clock.advance(LOOSE)
        instrument.step()


def test_the_previous_flush_is_its_own_line_and_not_other(clock: FakeClock) -> None:
    reports: list[Report] = []
    reporter = instrument.Reporter(every=2, sinks=[costly_sink(clock, reports)], memory=False)
    run_steps(clock, 6)
    reporter.close()
    first, second, third = reports[:3]
    assert first.flush_time == 0.0  # no flush before it
    assert first.other == pytest.approx(2 * LOOSE)
    for report in (second, third):
        assert report.self_cost is not None
        assert report.self_cost.flush_seconds == pytest.approx(FLUSH)
        assert report.flush_time == pytest.approx(FLUSH)
        assert report.other == pytest.approx(2 * LOOSE)  # it held the flush as well: 34 ms
        assert report.step_time is not None
        assert report.step_time.total == pytest.approx(2 * (WORK + LOOSE) + FLUSH)
    lines = second.render().splitlines()
    flush_line = next(line for line in lines if FLUSH_ROW in line)
    assert flush_line.split()[-2:] == ["15.000", "55.6"]  # ms per step, % of the step
    assert lines[-1].split()[-3:] == ["(other)", "2.000", "7.4"]
    assert lines.index(flush_line) == len(lines) - 2  # after the regions, before (other)


def test_normalized_per_step_like_the_regions(clock: FakeClock) -> None:
    reports: list[Report] = []
    reporter = instrument.Reporter(
        every=2, sinks=[costly_sink(clock, reports)], memory=False, normalizer="steps"
    )
    run_steps(clock, 4)
    reporter.close()
    second = reports[1]
    assert second.flush_time == pytest.approx(FLUSH / 2)
    assert second.other == pytest.approx(LOOSE)
    assert second["work"].total == pytest.approx(WORK)


def test_the_line_is_drawn_last_but_one_or_last(clock: FakeClock) -> None:
    """Without (other), the flush line closes the tree with an elbow."""
    reports: list[Report] = []
    reporter = instrument.Reporter(every=1, sinks=[costly_sink(clock, reports)], memory=False)
    for _ in range(2):
        with instrument.timed("work"):
            clock.advance(WORK)
        instrument.step()
    reporter.close()
    assert reports[1].other == 0.0
    assert reports[1].render().splitlines()[-1].startswith(f"└── {FLUSH_ROW}")
    assert reports[1].render(unicode=False).splitlines()[-2].startswith("|-- work")


def test_a_flush_inside_a_region_stays_in_that_region(clock: FakeClock) -> None:
    """Stepping inside ``with timed("train")``: the flush's time is train's, as measured."""
    reports: list[Report] = []
    reporter = instrument.Reporter(every=2, sinks=[costly_sink(clock, reports)], memory=False)
    with instrument.timed("train"):
        run_steps(clock, 4)
    reporter.close()
    second = reports[1]
    assert second.flush_time == 0.0
    assert second["train"].total == pytest.approx(2 * (WORK + LOOSE) + FLUSH)
    assert FLUSH_ROW not in second.render()


def test_a_flush_from_another_thread_is_not_in_the_steps(clock: FakeClock) -> None:
    """The steps' thread did not wait for it: its time is no part of their (other)."""
    reports: list[Report] = []
    reporter = instrument.Reporter(every=None, sinks=[costly_sink(clock, reports)], memory=False)
    run_steps(clock, 2)
    helper = threading.Thread(target=reporter.flush)
    helper.start()
    helper.join()
    run_steps(clock, 2)
    reporter.flush()
    assert [r.flush_time for r in reports] == [0.0, 0.0]
    assert reports[1].other == pytest.approx(2 * LOOSE + FLUSH)  # the clock moved: untimed


def test_every_view_of_a_report_shows_it(clock: FakeClock, tmp_path: Path) -> None:
    reports: list[Report] = []
    reporter = instrument.Reporter(every=2, sinks=[costly_sink(clock, reports)], memory=False)
    run_steps(clock, 6)
    reporter.close()
    second = reports[1]
    assert Report.from_dict(json.loads(json.dumps(second.to_dict()))) == second
    tags = scalars(second)
    assert tags["step_time/flush_ms"] == pytest.approx(FLUSH * 1e3)
    assert tags["step_time/other_ms"] == pytest.approx(2 * LOOSE * 1e3)
    assert figures(second)["instrument/flush_ms"] == pytest.approx(FLUSH * 1e3)
    interval = _interval(second, {path: i for i, path in enumerate(second.paths())})
    assert interval["f"] == pytest.approx(FLUSH / 2 * 1e3)  # per step
    assert interval["o"] == pytest.approx(LOOSE * 1e3)
    # the CLI's per-step profile and plot layers
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in reports[:3]))
    run = cli.load(str(path), None)
    means = cli.profile(run, skip_first=0).times
    assert means[FLUSH_ROW] == pytest.approx(2 * FLUSH / 6)  # two flushes in six steps
    assert means["(other)"] == pytest.approx(LOOSE)
    layers = cli.series(run.reports, top=3).layers
    assert list(layers)[-2:] == [FLUSH_ROW, "(other)"]
    assert layers[FLUSH_ROW] == pytest.approx([0.0, FLUSH / 2 * 1e3, FLUSH / 2 * 1e3])


def test_a_report_file_with_a_negative_flush_time_is_refused(tmp_path: Path) -> None:
    data = Report(step_time=None).to_dict()
    data["flush_time"] = -1.0
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(ReportFileError, match=r"flush_time is -1\.0; expected a time >= 0"):
        read_file(path)


def barrier_worker(rank: int, world_size: int) -> list[tuple[float, float, float]]:
    """Rank 1 takes 0.5 s longer before the second flush; rank 0 waits for it there."""
    import torch.distributed as dist

    dist.barrier()  # start together
    reporter = instrument.Reporter(
        every=None, memory=False, barrier=True, barrier_timeout=timedelta(seconds=30)
    )
    out = []
    for interval in range(3):
        with instrument.timed("work"):
            time.sleep(0.01)
        instrument.step()
        if rank == 1 and interval == 1:
            time.sleep(0.5)
        report = reporter.flush()
        assert report.self_cost is not None
        assert report.other is not None
        out.append((report.flush_time, report.self_cost.flush_seconds, report.other))
    reporter.close()
    return out


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_the_reporters_barrier_wait_is_in_the_flush_line_not_other() -> None:
    """``Reporter(barrier=True)``: the wait for the slow rank is the flush's (the self-cost's
    "last flush" leaves it out: it is the other rank's time, not instrument's work)."""
    fast, slow = run_ranks(barrier_worker, 2, timeout=100)
    line, own, other = fast[2]
    assert line >= 0.4  # waited at the barrier for rank 1's 0.5 s
    assert line - own >= 0.4
    assert other < 0.2
    late_line, _, late_other = slow[2]  # (the sleep came after a tick: the next step's)
    assert late_other >= 0.5  # rank 1's sleep: its own untimed work, in its (other)
    assert late_line < 0.3  # rank 1 did not wait at that barrier


def test_the_trace_shows_each_flush_where_it_ran(clock: FakeClock, tmp_path: Path) -> None:
    """The timeline's gap after each reported step is the flush: an event of its own,
    written with the next report's events (the last one's when the sink closes)."""
    reports: list[Report] = []
    trace = ChromeTrace(tmp_path / "trace.json")
    reporter = instrument.Reporter(
        every=2, sinks=[trace, costly_sink(clock, reports)], memory=False
    )
    run_steps(clock, 6)
    reporter.close()
    events = [e for e in json.loads(trace.written.read_text())["traceEvents"] if e["ph"] == "X"]
    flushes = [e for e in events if e["name"] == FLUSH_ROW]
    assert [e["dur"] for e in flushes] == pytest.approx([FLUSH * 1e6] * 3)  # µs
    step, flush = (WORK + LOOSE) * 1e6, FLUSH * 1e6
    starts = [e["ts"] - events[0]["ts"] for e in flushes]
    assert starts == pytest.approx([2 * step, 4 * step + flush, 6 * step + 2 * flush])
    work = [e for e in events if e["name"] == "work"]
    assert work[2]["ts"] == pytest.approx(flushes[0]["ts"] + flushes[0]["dur"])


def test_a_flush_that_raised_leaves_no_stale_line(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first flush's time fell in the interval whose flush raised: the next report,
    of a later interval, does not show it."""
    from instrument import reporter as reporter_module

    reports: list[Report] = []
    reporter = instrument.Reporter(every=None, sinks=[costly_sink(clock, reports)], memory=False)
    run_steps(clock, 2)
    reporter.flush()  # takes FLUSH: in the next interval's steps
    run_steps(clock, 2)
    build = reporter_module.build_report

    def broken(*args: object, **kwargs: object) -> Report:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(reporter_module, "build_report", broken)
    with pytest.raises(RuntimeError, match="broken on purpose"):
        reporter.flush()
    monkeypatch.setattr(reporter_module, "build_report", build)
    run_steps(clock, 2)
    last = reporter.flush()
    assert last.flush_time == 0.0
    assert last.other == pytest.approx(2 * LOOSE)


def test_the_closing_flush_is_in_the_trace_too(clock: FakeClock, tmp_path: Path) -> None:
    """``close()`` flushes the steps left, then closes the sink, which writes that flush."""
    trace = ChromeTrace(tmp_path / "trace.json")
    reports: list[Report] = []
    reporter = instrument.Reporter(
        every=2, sinks=[trace, costly_sink(clock, reports)], memory=False
    )
    run_steps(clock, 3)  # a report at step 2; step 3 left for close()
    reporter.close()
    assert trace.written is not None
    events = json.loads(trace.written.read_text())["traceEvents"]
    flushes = [e for e in events if e.get("name") == FLUSH_ROW]
    assert [r.steps for r in reports] == [2, 1]
    assert len(flushes) == 2
