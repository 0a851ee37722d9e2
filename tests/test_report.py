"""Report: lookup, round trip, rendering."""

from __future__ import annotations

import dataclasses
import json

import pytest

import instrument
from instrument.report import RankStats
from instrument.testing import FakeClock, capture_reports


def _sample(clock: FakeClock) -> instrument.Report:
    with capture_reports(memory=False) as reports:  # the exact layout: no memory line
        for _ in range(2):
            with instrument.timed("step"):
                clock.advance(0.001)
                with instrument.timed("forward"):
                    clock.advance(0.004)
                    with instrument.timed("encoder"):
                        clock.advance(0.003)
                with instrument.timed("backward"):
                    clock.advance(0.008)
            instrument.step()
    return reports[-1]


def test_round_trip_through_json_is_exact(clock: FakeClock) -> None:
    report = _sample(clock)
    again = instrument.Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert again.render() == report.render()


def test_getitem_and_missing_path_hint(clock: FakeClock) -> None:
    report = _sample(clock)
    node = report["step/forward/encoder"]
    assert (node.name, node.parent, node.count) == ("encoder", "step/forward", 2)
    assert node.total == pytest.approx(0.006)
    assert report["step/forward"].self == pytest.approx(0.008)
    with pytest.raises(
        KeyError, match="no region 'step/forwrd' in this report; did you mean 'step/forward'"
    ):
        report["step/forwrd"]
    assert report.get("nope") is None
    assert [n.path for n in report.children("step")] == ["step/forward", "step/backward"]


def test_render_is_a_tree_with_aligned_columns(clock: FakeClock) -> None:
    text = _sample(clock).render()
    lines = text.splitlines()
    assert lines[0].startswith("instrument report #1")
    assert lines[1].startswith("verdict: ")  # the findings, the verdict first
    assert lines[2].startswith("  next: ")
    lines = [line for line in lines[3:] if not line.startswith("  also: ")]
    assert lines[0].startswith("instrument's own cost: ")  # what the timing itself cost
    header = lines[1]
    assert header.split() == [
        "region",
        "ms/step",
        *("%", "of", "step"),
        "calls/step",
        "ms/call",
        *("max", "ms/call"),
    ]
    labels = [line[: header.index("ms/step") - 2].rstrip() for line in lines[2:]]
    assert labels == [  # first seen first
        "step (2 steps)",
        "└── step",
        "    ├── forward",
        "    │   └── encoder",
        "    └── backward",
    ]
    widths = {len(line) for line in lines[1:]}
    assert len(widths) == 1  # every figure column is right-aligned to the same edge
    assert "16.000" in lines[3] or "32.000" in lines[3]


def test_from_dict_rejects_non_reports() -> None:
    with pytest.raises(ValueError, match="not an instrument report"):
        instrument.Report.from_dict({"foo": 1})
    with pytest.raises(ValueError, match="unsupported report version 99"):
        instrument.Report.from_dict({"nodes": [], "version": 99})
    with pytest.raises(ValueError, match="unknown normalizer 'nan'; expected a number or 'steps'"):
        instrument.Report.from_dict({"nodes": [], "normalizer": "nan"})  # a CLI fuzz case
    assert instrument.Report.from_dict({"nodes": [], "normalizer": 2}).normalizer == 2.0


def test_empty_report_renders() -> None:
    assert "(no regions recorded)" in instrument.Report().render()


def test_rank_stats_to_dict_has_every_field_in_order() -> None:
    stats = RankStats(1.0, 2.0, 1.5, 0, 1, 2, per_rank=(1.0, None), slowest=1)
    expected = dataclasses.asdict(stats)
    expected["per_rank"] = [1.0, None]
    assert stats.to_dict() == expected
    assert list(stats.to_dict()) == [f.name for f in dataclasses.fields(RankStats)]
    assert RankStats.from_dict(stats.to_dict()) == stats


def test_unchecked_makes_what_the_dataclass_makes() -> None:
    """A flush makes its Report and SelfCost without the frozen __init__: the same object,
    every default (a fresh dict per factory field), and a clear error for a wrong field."""
    from dataclasses import fields

    from instrument._frozen import unchecked
    from instrument.report import Report, SelfCost

    fast, slow = unchecked(Report, steps=3, rank=1), Report(steps=3, rank=1)
    assert fast == slow
    assert fast.__dict__ == slow.__dict__
    assert [f.name for f in fields(Report)] == list(slow.__dict__)
    assert sorted(fast.__dict__) == sorted(slow.__dict__)
    assert fast.memory is not unchecked(Report).memory
    assert fast.across is not unchecked(Report).across
    cost = unchecked(SelfCost, regions=1, region_ns=2.0, flush_seconds=0.5, interval_seconds=4.0)
    assert cost == SelfCost(1, 2.0, 0.5, 4.0)
    assert cost.to_dict() == SelfCost(1, 2.0, 0.5, 4.0).to_dict()
    with pytest.raises(TypeError, match="SelfCost"):
        unchecked(SelfCost, regions=1)
    with pytest.raises(TypeError, match="Report"):
        unchecked(Report, stepz=1)


def test_replaced_is_dataclasses_replace_keeping_lazy_nodes(clock: FakeClock) -> None:
    """A diagnosed report and a held finding are copied without the frozen __init__: equal
    to ``dataclasses.replace``, a flush's nodes still unbuilt, and a clear error for a wrong
    field."""
    from instrument._frozen import replaced
    from instrument.findings import Finding
    from instrument.report import LazyNodes

    reporter = instrument.Reporter(every=None, sinks=[], diagnose=False)
    with instrument.timed("a"):
        clock.advance(0.001)
    report = reporter.flush()
    reporter.close(flush=False)
    finding = Finding("balanced", "info", "why", "next", evidence={"step_s": 0.5})
    copy = replaced(report, findings=(finding,))
    assert isinstance(copy.__dict__["nodes"], LazyNodes)  # not built by the copy
    assert copy == dataclasses.replace(report, findings=(finding,))
    assert copy.findings == (finding,)
    assert report.findings == ()
    assert replaced(finding, since_step=7) == dataclasses.replace(finding, since_step=7)
    with pytest.raises(TypeError, match="Finding"):
        replaced(finding, sinc_step=7)
