"""What the timing itself cost, in every report: exact arithmetic under a fake clock."""

from __future__ import annotations

import pytest

import instrument
from instrument import selfcost
from instrument.report import Report, SelfCost
from instrument.sinks.scalars import scalars
from instrument.testing import FakeClock, capture_reports, use_clock


class _SlowSink:
    """A sink that takes 10 ms of the fake clock: the flush's own time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def write(self, report: Report) -> None:
        self.clock.advance(0.010)


def test_self_cost_is_regions_times_their_cost_plus_the_last_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(selfcost, "_region_ns", 500.0)
    clock = FakeClock()
    with use_clock(clock), capture_reports(sinks=[_SlowSink(clock)]) as reports:
        reporter = instrument.reporter.live_reporters()[-1]
        for _ in range(4000):
            with instrument.timed("a"):
                pass
        clock.advance(2.0)
        first = reporter.flush()  # 4000 x 500 ns = 2 ms of 2 s; no flush before it
        clock.advance(1.0)
        with instrument.timed("b"):
            clock.advance(1.0)
        second = reporter.flush()  # 1 region, plus the first flush's 10 ms, of 2.01 s
    assert first.self_cost == SelfCost(4000, 500.0, 0.0, 2.0)
    assert first.self_cost.share == pytest.approx(0.001)
    assert second.self_cost == SelfCost(1, 500.0, 0.010, 2.010)
    assert second.self_cost.seconds == pytest.approx(0.0100005)
    assert second.self_cost.share == pytest.approx(0.0100005 / 2.010)
    assert reports[0].render().splitlines()[1] == (
        "instrument: 0.1 % of the interval (4000 regions x 500 ns + last flush 0.00 ms)"
    )
    assert Report.from_dict(second.to_dict()) == second
    tags = scalars(second)
    assert tags["instrument/share"] == second.self_cost.share
    assert tags["instrument/flush_ms"] == pytest.approx(10.0)
    assert tags["instrument/regions"] == 1.0


def test_a_report_not_made_by_a_flush_has_no_self_cost_line() -> None:
    report = Report()
    assert report.self_cost is None
    assert "instrument:" not in report.render()
    assert Report.from_dict(report.to_dict()) == report
    assert not [tag for tag in scalars(report) if tag.startswith("instrument/")]


def test_the_calibration_measures_a_region_and_leaves_the_tree_alone() -> None:
    from instrument import registry

    before = set(registry.ROOT.children) - {"calibrated-inside"}
    with instrument.timed("calibrated-inside"):
        cost = selfcost._calibrate()
        assert instrument.current_path() == "calibrated-inside"
    assert 0.0 < cost < 1e6  # ns: far below a millisecond on any machine
    assert set(registry.ROOT.children) - before == {"calibrated-inside"}
    assert not registry.ROOT.children["calibrated-inside"].children
