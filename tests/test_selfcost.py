"""What the timing itself cost, in every report: exact arithmetic under a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import instrument
from instrument import registry, selfcost
from instrument.hooks import cost as hook_cost
from instrument.report import Report, SelfCost
from instrument.sinks.memory import InMemory
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
        "instrument's own cost: 0.1 % of the time (4000 timed calls 2 ms)"
    )
    assert second.render().splitlines()[1] == (
        "instrument's own cost: 0.5 % of the time (1 timed call 0.0005 ms, previous flush 10 ms)"
    )
    assert Report.from_dict(second.to_dict()) == second
    tags = scalars(second)
    assert tags["instrument/share"] == second.self_cost.share
    assert tags["instrument/flush_ms"] == pytest.approx(10.0)
    assert tags["instrument/regions"] == 1.0


def test_the_calibrations_count_in_their_flush_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first flush calibrates (about 4 ms with auto's hooks): that is the timing's own
    time too, reported with the flush in the next report, not left in its step time."""
    clock = FakeClock()

    def calibrate(seconds: float, ns: float) -> Callable[[], float]:
        def run() -> float:
            clock.advance(seconds)
            return ns

        return run

    monkeypatch.setattr(selfcost, "_region_ns", None)
    monkeypatch.setattr(selfcost, "_calibrate", calibrate(0.001, 500.0))
    undo = selfcost.count_hooked(["forward"], calibrate(0.003, 900.0))
    try:
        with use_clock(clock), capture_reports(sinks=[]):
            reporter = instrument.reporter.live_reporters()[-1]
            clock.advance(1.0)
            first = reporter.flush()
            clock.advance(0.001)  # an interval shorter than the calibrations
            second = reporter.flush()
            clock.advance(1.0)
            third = reporter.flush()
    finally:
        undo()
    assert first.self_cost is not None
    assert first.self_cost.region_ns == 500.0
    assert second.self_cost is not None
    assert third.self_cost is not None
    assert second.self_cost.flush_seconds == pytest.approx(0.004)  # both calibrations
    # its interval holds the flush it is charged with: 4 of 5 ms, not 400 % of 1 ms
    assert second.self_cost.interval_seconds == pytest.approx(0.005)
    assert second.self_cost.share == pytest.approx(0.8)
    assert third.self_cost.flush_seconds == 0.0  # measured once


def test_a_report_not_made_by_a_flush_has_no_self_cost_line() -> None:
    report = Report()
    assert report.self_cost is None
    assert "instrument:" not in report.render()
    assert Report.from_dict(report.to_dict()) == report
    assert not [tag for tag in scalars(report) if tag.startswith("instrument/")]


@pytest.mark.parametrize(
    "calibrate", [selfcost._calibrate, hook_cost.hook_ns], ids=["region", "hook"]
)
def test_a_calibration_measures_and_leaves_the_tree_alone(calibrate: Callable[[], float]) -> None:
    before = set(registry.ROOT.children) - {"calibrated-inside"}
    with instrument.timed("calibrated-inside"):
        cost = calibrate()
        assert instrument.current_path() == "calibrated-inside"
    assert 0.0 < cost < 1e6  # ns: far below a millisecond on any machine
    assert set(registry.ROOT.children) - before == {"calibrated-inside"}
    assert not registry.ROOT.children["calibrated-inside"].children


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.ones(2, 4)


def test_regions_entered_through_auto_hooks_are_counted_at_the_hook_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(selfcost, "_region_ns", 500.0)
    monkeypatch.setattr(selfcost, "_hook_ns", 2000.0)
    model, opt, x = _mlp()
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=[])
        handle = instrument.auto(model, opt, reporter=reporter)
        for _ in range(3):  # forward, 0, 1, backward, optimizer, zero_grad: 6 hooked a step
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        with instrument.timed("mine"):
            clock.advance(1.0)
        first = reporter.flush()
        model(x).sum().backward()  # 4 more hooked regions, then the hooks come off:
        handle.remove()  # what they recorded still counts at the hook cost
        clock.advance(1.0)
        second = reporter.flush()
        with instrument.timed("forward"):  # a plain region of that name, hooks gone
            clock.advance(1.0)
        third = reporter.flush()
        reporter.close(flush=False)
    assert first.self_cost == SelfCost(1, 500.0, 0.0, 1.0, hooked=18, hooked_ns=2000.0)
    assert first.self_cost.seconds == pytest.approx((500 + 18 * 2000) / 1e9)
    assert first.render().splitlines()[1] == (
        "instrument's own cost: 0.0037 % of the time (19 timed calls 0.036 ms)"
    )
    assert Report.from_dict(first.to_dict()) == first
    assert first.to_dict()["self_cost"]["hooked"] == 18
    tags = scalars(first)
    assert tags["instrument/hooked"] == 18.0
    assert tags["instrument/hooked_ns"] == 2000.0
    assert tags["instrument/share"] == pytest.approx(36_500 / 1e9)
    assert second.self_cost is not None
    assert third.self_cost is not None
    assert (second.self_cost.regions, second.self_cost.hooked) == (0, 4)
    assert (third.self_cost.regions, third.self_cost.hooked) == (1, 0)
    assert third.self_cost.hooked_ns == 0.0  # no hook left: nothing counted at its cost
    assert "(1 timed call 0.0005 ms" in third.render().splitlines()[1]
    assert "instrument/hooked" not in scalars(third)


def test_the_final_report_of_auto_counts_its_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selfcost, "_hook_ns", 2000.0)
    model, opt, x = _mlp()
    sink = InMemory()
    handle = instrument.auto(model, opt, every=None, sinks=[sink])
    model(x).sum().backward()
    opt.step()
    handle.remove()  # takes the hooks off, then closes the reporter auto made: one last report
    (final,) = sink.reports
    assert final.self_cost is not None
    assert (final.self_cost.hooked, final.self_cost.hooked_ns) == (5, 2000.0)


def test_count_splits_plain_and_hooked_calls_by_registered_name() -> None:
    calls: list[int] = []

    def calibrate() -> float:
        calls.append(1)
        return 7.0

    undo = selfcost.count_hooked(["forward", "optimizer"], calibrate)
    for name, n in (("forward", 3), ("mine", 2), ("optimizer", 1)):
        with instrument.timed("step"):
            for _ in range(n):
                with instrument.timed(name):
                    pass
    collected = registry.collect()
    assert selfcost.count(collected) == (3 + 2, 4)  # "step" (3 calls) and "mine" are plain
    assert selfcost.hook_ns() == selfcost.hook_ns() == 7.0
    assert calls == [1]
    undo()
    undo()  # idempotent
    assert selfcost.count(collected) == (5, 4)  # retired names count once more...
    assert selfcost.count(collected) == (9, 0)  # ...then no longer
    assert selfcost.hook_ns() == 0.0


def test_the_kept_names_follow_every_registration_change() -> None:
    """``count`` keeps the union of the registered names between flushes: registering,
    undoing and resetting must each be seen by the next count."""
    with instrument.timed("a"), instrument.timed("b"):
        pass
    collected = registry.collect()  # "a" and "b": one call each
    assert selfcost.count(collected) == (2, 0)
    undo_a = selfcost.count_hooked(["a"], lambda: 1.0)
    assert selfcost.count(collected) == (1, 1)
    undo_b = selfcost.count_hooked(["b"], lambda: 1.0)
    assert selfcost.count(collected) == (0, 2)
    undo_a()
    assert selfcost.count(collected) == (0, 2)  # "a" retired: counted once more
    assert selfcost.count(collected) == (1, 1)
    undo_b()
    assert selfcost.count(collected) == (1, 1)
    assert selfcost.count(collected) == (2, 0)
    selfcost.count_hooked(["a", "b"], lambda: 1.0)
    assert selfcost.count(collected) == (0, 2)
    selfcost.reset()
    assert selfcost.count(collected) == (2, 0)


def test_a_self_cost_written_before_hooks_were_counted_apart_reads_back() -> None:
    older = {"regions": 3, "region_ns": 200.0, "flush_seconds": 0.001, "interval_seconds": 1.0}
    assert SelfCost.from_dict(older) == SelfCost(3, 200.0, 0.001, 1.0, hooked=0, hooked_ns=0.0)
