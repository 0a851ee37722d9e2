"""Findings from reports made on a fake clock: each rule, its thresholds, its hysteresis, the
run's summary, and what the reporter and its sinks do with them."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import instrument
from instrument import cli
from instrument.diagnosis import Diagnosis, Finding, RunSummary, Thresholds, diagnose
from instrument.diagnosis.summary import Seen
from instrument.diagnosis.trends import POINTS, Series
from instrument.report import Node, RankStats, Report
from instrument.testing import FakeClock

Step = Callable[[FakeClock, int], None]


def run(
    clock: FakeClock, step: Step, steps: int = 60, every: int = 10, **options: object
) -> list[Report]:
    """``steps`` steps of ``step`` with a reporter flushing every ``every``: its reports."""
    reports: list[Report] = []
    reporter = instrument.Reporter(every=every, sinks=[reports.append], memory=False, **options)
    for i in range(steps):
        step(clock, i)
        reporter.step()
    reporter.close()
    return reports


def phases(
    data: float = 0.001, forward: float = 0.004, optimizer: float = 0.001, other: float = 0.0005
) -> Step:
    def step(clock: FakeClock, i: int) -> None:
        with instrument.timed("data"):
            clock.advance(data)
        with instrument.timed("forward"):
            clock.advance(forward)
        with instrument.timed("optimizer"):
            clock.advance(optimizer)
        clock.advance(other)

    return step


def kinds(report: Report) -> dict[str, Finding]:
    return {f.kind: f for f in report.findings}


def warnings(reports: list[Report]) -> list[Finding]:
    return [f for r in reports for f in r.findings if f.severity != "info"]


def test_a_healthy_step_gets_no_warning(clock: FakeClock) -> None:
    reports = run(clock, phases())
    assert warnings(reports) == []
    assert reports[0].verdict is not None
    assert reports[0].verdict.kind == "compute_bound"
    assert reports[0].verdict.path == "forward"


def test_input_bound_names_data_with_its_share(clock: FakeClock) -> None:
    reports = run(clock, phases(data=0.012, forward=0.003))
    verdict = reports[-1].verdict
    assert verdict is not None
    assert (verdict.kind, verdict.severity, verdict.path) == ("input_bound", "critical", "data")
    assert "data took 73 % of the step" in verdict.why
    assert "num_workers" in verdict.next
    assert verdict.evidence["share"] == pytest.approx(0.012 / 0.0165)


def test_input_below_threshold_is_no_finding(clock: FakeClock) -> None:
    reports = run(clock, phases(data=0.0015, forward=0.004))
    assert all("input_bound" not in kinds(r) for r in reports)


def test_compute_bound_names_the_module_that_dominates(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        with instrument.timed("forward"):
            with instrument.timed("encoder"):
                with instrument.timed("layers.0"):
                    clock.advance(0.001)
                with instrument.timed("layers.1"):
                    clock.advance(0.006)
            clock.advance(0.001)
        clock.advance(0.0005)

    found = kinds(run(clock, step, steps=20)[-1])["compute_bound"]
    assert found.severity == "info"
    assert found.path == "forward/encoder/layers.1"
    assert found.evidence["phase"] == "forward"
    assert "most of it in forward/encoder/layers.1" in found.why


def test_a_heavy_optimizer_is_a_warning_on_optimizer(clock: FakeClock) -> None:
    reports = run(clock, phases(forward=0.002, optimizer=0.006))
    verdict = reports[-1].verdict
    assert verdict is not None
    assert (verdict.kind, verdict.severity, verdict.path) == (
        "compute_bound",
        "warning",
        "optimizer",
    )
    assert "fused" in verdict.next


def test_untimed_work_is_residual_heavy_on_other(clock: FakeClock) -> None:
    reports = run(clock, phases(other=0.005))
    verdict = reports[-1].verdict
    assert verdict is not None
    assert (verdict.kind, verdict.path) == ("residual_heavy", "(other)")
    assert "in no region" in verdict.why


def test_a_save_every_20_steps_is_stalls_with_its_period(clock: FakeClock) -> None:
    base = phases()

    def step(clock: FakeClock, i: int) -> None:
        base(clock, i)
        if i % 20 == 19:
            clock.advance(0.2)  # an untimed checkpoint save

    reports = run(clock, step, steps=100)
    stalls = [kinds(r).get("stalls") for r in reports[1:]]
    held = [f for f in stalls if f is not None]
    assert held, [r.findings for r in reports]
    last = held[-1]
    assert last.path == "(other)"
    assert last.evidence["period_steps"] == pytest.approx(20, rel=0.3)
    assert "about every" in last.why
    summary = diagnose(reports)
    assert summary.verdict is not None
    assert summary.verdict.kind == "stalls"
    assert all(f.kind != "residual_heavy" for f in summary.findings)  # explained by the stalls


def every_20_steps(extra: Callable[[FakeClock], None]) -> Step:
    """The healthy phases, and ``extra`` after every 20th step."""
    base = phases()

    def step(clock: FakeClock, i: int) -> None:
        base(clock, i)
        if i % 20 == 19:
            extra(clock)

    return step


def timed_advance(*parts: tuple[str, float]) -> Callable[[FakeClock], None]:
    """Each ``(name, seconds)`` as a region of that name taking that long."""

    def work(clock: FakeClock) -> None:
        for name, seconds in parts:
            with instrument.timed(name):
                clock.advance(seconds)

    return work


def test_a_stall_inside_a_region_names_the_region(clock: FakeClock) -> None:
    reports = run(clock, every_20_steps(timed_advance(("checkpoint", 0.2))), steps=60)
    assert any(
        kinds(r).get("stalls", None) and kinds(r)["stalls"].path == "checkpoint" for r in reports
    )


def test_a_slow_call_of_the_steps_own_work_is_the_machine_not_a_stall(clock: FakeClock) -> None:
    """A busy machine makes a call of forward (which runs every step) 30 times its median
    now and then, or slows calls all over the step: that is said (info), never a warning
    to move a save; the same time in no region, every 20 steps, is a stall."""
    one_place = every_20_steps(timed_advance(("forward", 0.12)))
    scattered = every_20_steps(timed_advance(("data", 0.05), ("optimizer", 0.12)))
    for step in (one_place, scattered):
        found = [kinds(r).get("stalls") for r in run(clock, step, steps=60)]
        said = [f for f in found if f is not None]
        assert said
        assert all(f.severity == "info" for f in said), said
        assert "machine" in said[-1].next


def test_the_first_interval_is_warm_up_not_a_stall(clock: FakeClock) -> None:
    base = phases()

    def step(clock: FakeClock, i: int) -> None:
        base(clock, i)
        if i == 0:
            clock.advance(0.3)  # first-step initialisation

    assert all("stalls" not in kinds(r) for r in run(clock, step))


def test_a_forward_that_grows_is_a_slowdown_naming_it(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        phases(forward=0.003 + 0.0002 * i)(clock, i)

    reports = run(clock, step, steps=80)
    found = kinds(reports[-1]).get("slowdown")
    assert found is not None
    assert found.path == "forward"
    assert found.evidence["growth"] > 0.5
    assert all("slowdown" not in kinds(r) for r in run(clock, phases(), steps=80))


def test_a_jump_that_stays_is_dated_where_it_began_and_named(clock: FakeClock) -> None:
    """At step 100 of 200 a new code path triples forward and stays: a slowdown on forward
    since step 100 (within one report), a jump, not a trend; a warning once the step has
    doubled (a smaller jump is said as info)."""

    def step(clock: FakeClock, i: int) -> None:
        phases(forward=0.004 if i < 100 else 0.012)(clock, i)

    reports = run(clock, step, steps=200)
    found = [kinds(r).get("slowdown") for r in reports]
    assert all(f is None for f in found[:10])  # reports up to step 100
    first = next(f for f in found if f is not None)
    assert found.index(first) <= 11  # the second report at the new level
    assert (first.path, first.severity) == ("forward", "warning")
    assert first.since_step is not None
    assert abs(first.since_step - 100) <= 10
    assert "jumped from 6.5 ms to 14.5 ms" in first.why
    assert "steadily" not in first.why
    summary = diagnose(reports)
    assert summary.verdict is not None
    assert (summary.verdict.kind, summary.verdict.path) == ("slowdown", "forward")

    def smaller(clock: FakeClock, i: int) -> None:  # +46 %: what a busy machine can do
        phases(forward=0.004 if i < 100 else 0.007)(clock, i)

    found = [f for r in run(clock, smaller, steps=200) for f in r.findings]
    jumps = [f for f in found if f.kind == "slowdown"]
    assert jumps
    assert {(f.severity, f.path) for f in jumps} == {("info", "forward")}


def test_a_machine_that_slows_at_once_is_named_as_the_machine(clock: FakeClock) -> None:
    """From step 45 every region takes three times as long (other work on the cores): dated
    at step 45, naming no region, sending the user to the machine; info, since other
    processes starting on a shared machine look the same."""

    def step(clock: FakeClock, i: int) -> None:
        k = 3.0 if i >= 45 else 1.0
        phases(data=0.001 * k, forward=0.004 * k, optimizer=0.001 * k, other=0.0005 * k)(clock, i)

    reports = run(clock, step, steps=100)
    found = [f for r in reports for f in r.findings if f.kind == "slowdown"]
    assert found
    assert {(f.severity, f.path) for f in found} == {("info", None)}
    assert found[0].since_step is not None
    assert abs(found[0].since_step - 45) <= 10
    assert "look at the machine" in found[0].next


def test_a_steady_drift_is_a_trend_not_a_jump(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        phases(forward=0.004 + 0.0001 * i)(clock, i)

    found = [f for r in run(clock, step, steps=120) for f in r.findings if f.kind == "slowdown"]
    assert found
    assert all("steadily" in f.why and "jumped" not in f.why for f in found)


def _with_memory(reports: list[Report], values: list[int], **more: int) -> list[Report]:
    return [
        dataclasses.replace(r, memory={"host_rss": v, **more})
        for r, v in zip(reports, values, strict=True)
    ]


def test_rss_growing_steadily_is_memory_creep(clock: FakeClock) -> None:
    reports = run(clock, phases(), steps=80)
    mib = 1 << 20
    leaking = _with_memory(
        reports, [500 * mib + i * 10 * mib for i in range(len(reports))], host_total=2000 * mib
    )
    summary = diagnose(leaking)
    creep = next(f for f in summary.findings if f.kind == "memory_creep")
    assert creep.evidence["bytes_per_step"] == pytest.approx(mib, rel=0.01)
    assert "run out in" in creep.why
    assert "loss.item()" in creep.next
    flat = _with_memory(reports, [500 * mib + (i % 2) * 8 * mib for i in range(len(reports))])
    assert all(f.kind != "memory_creep" for f in diagnose(flat).findings)
    small = _with_memory(reports, [500 * mib + i * 100_000 for i in range(len(reports))])
    assert all(f.kind != "memory_creep" for f in diagnose(small).findings)


def test_memory_creep_claims_no_more_growth_than_the_values_show(clock: FakeClock) -> None:
    """RSS that rises 28 MiB and levels off: the fitted line would grow 40 MiB, over the
    32 MiB threshold, but the values themselves span less, so it is no memory creep."""
    reports = run(clock, phases(), steps=120)
    mib = 1 << 20
    levels = [0, 0, 0, 0, 0, 1, 2, 3, 4, 6, 7, 7]  # the first report's is not a trend point
    summary = diagnose(_with_memory(reports, [500 * mib + 4 * mib * k for k in levels]))
    assert all(f.kind != "memory_creep" for f in summary.findings)
    steeper = _with_memory(reports, [500 * mib + 5 * mib * k for k in levels])
    assert any(f.kind == "memory_creep" for f in diagnose(steeper).findings)


def test_memory_that_levels_off_is_no_creep(clock: FakeClock) -> None:
    """RSS 456 -> 487 -> 514 -> 539 MB, then flat for five reports: a steady rise of 83 MB
    that stopped (a cache filled once, the allocator's high-water mark) is no creep; the
    same rise still going at the end is."""
    reports = run(clock, phases(), steps=100)
    mb = 1_000_000
    plateau = [456, 456, 487, 514, 539.3, 539.4, 539.4, 539.3, 539.4, 539.4]
    flat = _with_memory(reports, [int(v * mb) for v in plateau])
    diagnosis = Diagnosis()
    creeps = [kinds(Report(findings=diagnosis.add(r))).get("memory_creep") for r in flat]
    assert creeps == [None] * len(flat)
    assert all(f.kind != "memory_creep" for f in diagnosis.summary().findings)
    rising = [456, 456, 470, 487, 500, 514, 527, 539, 552, 566]
    found = diagnose(_with_memory(reports, [v * mb for v in rising])).findings
    assert any(f.kind == "memory_creep" for f in found)


def test_a_trend_the_run_no_longer_shows_is_not_the_runs() -> None:
    """A memory creep held in one report of the run but in neither of its last two is
    listed briefly; a finding held only briefly is still the verdict when nothing held
    longer."""
    creep = Finding("memory_creep", "warning", "grew", "look", since_step=10)
    seen = Seen(creep, 50)
    summary = RunSummary.of([seen], reports=10, first_step=0, last_step=100)
    assert summary.findings[0].kind == "memory_creep"  # the verdict, only as the lone one
    stalls = Seen(Finding("stalls", "warning", "w", "n", since_step=0), 20)
    stalls.reports = 5
    summary = RunSummary.of([seen, stalls], reports=10, first_step=0, last_step=100)
    assert summary.verdict is not None
    assert [f.kind for f in summary.transient] == ["memory_creep"]
    held = Seen(creep, 100)
    assert RunSummary.of([held], reports=10, first_step=0, last_step=100).transient == ()
    late = Seen(creep, 90)  # held at the second last report: one noisy last point is not enough
    kept = RunSummary.of([late, stalls], reports=10, first_step=0, last_step=100, recent_step=90)
    assert kept.transient == ()


def test_incomplete_is_never_the_verdict_beside_another_finding(clock: FakeClock) -> None:
    """The README's plain auto loop has no data line: that is a footnote under the verdict,
    in every report and in the run's summary."""

    def step(clock: FakeClock, i: int) -> None:
        with instrument.timed("forward"):
            clock.advance(0.002)
        with instrument.timed("backward"):
            clock.advance(0.002)
        clock.advance(0.001)

    reports = run(clock, step, steps=40)
    assert all(r.verdict is not None and r.verdict.kind != "incomplete" for r in reports)
    assert all(any(f.kind == "incomplete" for f in r.findings) for r in reports)
    summary = diagnose(reports)
    assert summary.verdict is not None
    assert summary.verdict.kind == "balanced"


def test_a_report_of_no_steps_at_exit_is_no_report_of_the_run(clock: FakeClock) -> None:
    """``auto`` left on to the end: the zero_grad after the last step makes a report of no
    steps at exit. It does not count toward how many reports a finding held in."""
    reports = run(clock, phases(), steps=40)
    closing = dataclasses.replace(reports[-1], steps=0, step_time=None, index=len(reports) + 1)
    summary = diagnose([*reports, closing])
    assert summary.reports == len(reports)
    assert summary.verdict is not None
    assert summary.verdict.evidence["reports_held"] == len(reports)


def test_a_findings_share_is_the_trees(clock: FakeClock) -> None:
    """forward is 77 % of the mean step in the tree; a usual step shows 67 % (what the rule
    judges, so that one slow call does not make a phase dominate): the sentence and the
    evidence's share are the tree's 77 %, the judged share is evidence of its own."""

    def step(clock: FakeClock, i: int) -> None:
        with instrument.timed("data"):
            clock.advance(0.001)
        with instrument.timed("forward"):
            clock.advance(0.004 if i % 10 else 0.03)
        clock.advance(0.001)

    report = run(clock, step, steps=20)[-1]
    row = next(line for line in report.render().splitlines() if "── forward" in line)
    tree_share = round(float(row.split()[3]))
    found = kinds(report)["compute_bound"]
    assert found.why.startswith(f"forward took {tree_share} % of the step (6.6 ms of 8.6 ms)")
    assert round(100 * found.evidence["share"]) == tree_share
    assert round(100 * found.evidence["judged_share"]) == 67  # a usual step's, judged


def test_hysteresis_keeps_a_finding_but_never_raises_its_severity(clock: FakeClock) -> None:
    """data at 55 % (warning), then 60 %: below input_critical (70 %), though above its
    relaxed form (56 %): still a warning."""

    def step(clock: FakeClock, i: int) -> None:
        share = 0.55 if i < 20 else 0.60
        phases(data=0.01 * share, forward=0.01 * (1 - share), optimizer=0.0, other=0.0)(clock, i)

    severities = [kinds(r)["input_bound"].severity for r in run(clock, step, steps=40)]
    assert severities == ["warning"] * 4

    def dropping(clock: FakeClock, i: int) -> None:  # 66 %, then 60 %
        share = 0.66 if i < 20 else 0.60
        phases(data=0.01 * share, forward=0.01 * (1 - share), optimizer=0.0, other=0.0)(clock, i)

    # a warning from 65 %: 60 % is kept by the relaxed 52 %, over the relaxed critical 56 %
    close = Thresholds(input_share=0.65, input_critical=0.7)
    kept = [kinds(r).get("input_bound") for r in run(clock, dropping, steps=40, diagnose=close)]
    assert [f.severity if f else None for f in kept] == ["warning"] * 4


def test_a_plain_optimizer_share_is_no_warning(clock: FakeClock) -> None:
    """AdamW on a small model takes 35-40 % of a healthy step: no finding calls it a
    problem; 76 % is a warning."""
    reports = run(clock, phases(data=0.0005, forward=0.0028, optimizer=0.0019, other=0.0003))
    assert warnings(reports) == []
    heavy = run(clock, phases(forward=0.001, optimizer=0.0076, data=0.001, other=0.0004))
    assert heavy[-1].verdict is not None
    assert (heavy[-1].verdict.kind, heavy[-1].verdict.severity) == ("compute_bound", "warning")


def test_the_flush_is_never_a_stall(clock: FakeClock) -> None:
    """The step that carried the flush (here 35 ms of flush on a 5 ms step, or the wait
    for a missing rank) is not the user's stall: the tree shows it as (instrument flush)."""
    reports = run(clock, phases(), steps=40)
    flushed = []
    for r in reports:
        assert r.step_time is not None
        step = dataclasses.replace(
            r.step_time, max=r.step_time.p50 + 0.035, total=r.step_time.total + 0.035
        )
        flushed.append(dataclasses.replace(r, step_time=step, flush_time=0.035))
    diagnosis = Diagnosis()
    found = [f for r in flushed for f in diagnosis.add(r) if f.kind in ("stalls", "residual_heavy")]
    assert found == []
    unflushed = [dataclasses.replace(r, flush_time=0.0) for r in flushed]
    assert any(f.kind == "stalls" for r in unflushed[1:] for f in Diagnosis().add(r))


def test_memory_near_capacity_is_memory_pressure(clock: FakeClock) -> None:
    reports = run(clock, phases(), steps=20)
    gib = 1 << 30
    full = dataclasses.replace(
        reports[-1],
        memory={
            "device_reserved": 76 * gib,
            "device_peak_reserved": 79 * gib,
            "device_total": 80 * gib,
        },
    )
    found = kinds(Report(findings=Diagnosis().add(full)))
    assert found["memory_pressure"].severity == "warning"
    ooms = dataclasses.replace(reports[-1], memory={"device_ooms": 2})
    assert kinds(Report(findings=Diagnosis().add(ooms)))["memory_pressure"].severity == "critical"


def test_a_missing_data_line_is_said_not_guessed(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        with instrument.timed("forward"):
            clock.advance(0.004)

    found = kinds(run(clock, step, steps=10)[-1])
    assert found["incomplete"].evidence["missing"] == ["data", "memory"]
    assert "dataloader=" in found["incomplete"].next
    assert "input_bound" not in found


def test_a_finding_does_not_flap_around_its_threshold(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        share = 0.53 if (i // 10) % 2 == 0 else 0.45  # 53 %, 45 %, 53 %, ... of the step
        phases(data=0.01 * share, forward=0.01 * (1 - share), optimizer=0.0, other=0.0)(clock, i)

    held = ["input_bound" in kinds(r) for r in run(clock, step)]
    assert held == [True] * 6
    first = run(clock, phases(data=0.0053, forward=0.0047, optimizer=0.0, other=0.0), steps=10)
    assert "input_bound" in kinds(first[-1])
    assert [kinds(r)["input_bound"].since_step for r in run(clock, step)] == [0] * 6


STEP = instrument.report.Stats(10, 0.030, 0.030, 0.029, 0.031, 0.0, 0.030, 0.030, 0.030)


def two_ranks(low: float, high: float, slow: int) -> RankStats:
    return RankStats(low, high, (low + high) / 2, 1 - slow, slow, 2, None, slow)


def ranked(
    path: str, total: float, r: RankStats, concurrent: bool = False, std: float = 0.0
) -> Node:
    host = dataclasses.replace(STEP, total=total, std=std)
    return Node(path=path, host=host, self_time=total, ranks=r, concurrent=concurrent)


def straggling(step: int = 20, forward_std: float = 0.0, **more: object) -> Report:
    """A 2-rank report: rank 1 is 14 ms slower in forward, rank 0 waits in DDP's all-reduce."""
    return Report(
        nodes=(
            ranked("data", 0.002, two_ranks(0.002, 0.002, 0)),
            ranked("forward", 0.018, two_ranks(0.004, 0.018, 1), std=forward_std),
            ranked("backward", 0.009, two_ranks(0.004, 0.018, 0)),
            # rank 0 waited longest there; rank 1 arrived last (the collective's slowest)
            ranked(
                "backward/ddp_all_reduce",
                0.014,
                RankStats(0.001, 0.014, 0.0075, 1, 0, 2, None, 1),
                concurrent=True,
            ),
        ),
        steps=10,
        step_time=STEP,
        normalizer="steps",
        step=step,
        world_size=2,
        ranks="minmax",
        **more,  # type: ignore[arg-type]
    )


def straggler_of(reports: list[Report]) -> list[Finding | None]:
    diagnosis = Diagnosis()
    return [kinds(Report(findings=diagnosis.add(r))).get("straggler") for r in reports]


def test_straggler_names_culprit_phase_and_victim() -> None:
    found = straggler_of([straggling(20), straggling(30)])[-1]
    assert found is not None
    assert (found.rank, found.path, found.severity) == (1, "forward", "warning")
    assert found.evidence["waiting_rank"] == 0
    assert found.evidence["waiting_in"] == "backward/ddp_all_reduce"
    assert found.evidence["excess_s"] == pytest.approx(0.014)
    assert "rank 0 waits for it in backward/ddp_all_reduce" in found.why


def test_a_straggler_must_hold_in_two_reports_after_the_warm_up() -> None:
    """One slow interval is a busy machine, not a straggler; the first interval is warm-up."""
    assert straggler_of([straggling(20)]) == [None]
    assert straggler_of([straggling(10), straggling(20)])[0] is None  # warm-up: not judged
    assert [f is not None for f in straggler_of([straggling(s) for s in (20, 30, 40)])] == [
        False,
        True,
        True,
    ]


def test_an_excess_within_the_step_to_step_spread_is_no_straggler() -> None:
    """Rank 1's forward is 14 ms slower on average, but forward moves by 20 ms from step
    to step (the largest spread over the ranks, gathered): that is noise."""
    spread = {"noise.forward": RankStats(0.005, 0.020, 0.0125, 0, 1, 2, None, 1)}
    assert straggler_of([straggling(s, across=spread) for s in (20, 30)]) == [None, None]
    assert straggler_of([straggling(s, forward_std=0.02) for s in (20, 30)]) == [None, None]
    calm = {"noise.forward": RankStats(0.001, 0.002, 0.0015, 0, 1, 2, None, 1)}
    assert straggler_of([straggling(s, across=calm) for s in (20, 30)])[-1] is not None


def test_a_collective_is_never_the_straggler() -> None:
    """A hand-written all_reduce after rank 1 computes more: rank 0 waits 28 ms in it. The
    waiting rank is no culprit: the finding names rank 1 in its compute, and the time in
    the collective is no warning of its own (the waiting is for rank 1)."""

    def report(step: int) -> Report:
        return Report(
            nodes=(
                ranked("forward", 0.020, two_ranks(0.005, 0.020, 1)),
                ranked("all_reduce", 0.030, RankStats(0.002, 0.030, 0.016, 1, 0, 2, None, 1)),
            ),
            steps=10,
            step_time=dataclasses.replace(STEP, total=0.040),
            normalizer="steps",
            step=step,
            world_size=2,
            ranks="minmax",
        )

    found = straggler_of([report(20), report(30)])[-1]
    assert found is not None
    assert (found.rank, found.path) == (1, "forward")
    assert "rank 0 waits for it in all_reduce" in found.why
    wait = kinds(Report(findings=Diagnosis().add(report(20))))["collective_wait"]
    assert wait.severity == "info"  # rank 1 arrives last: the waiting is for it
    assert "rank 1 spends 2 ms there against 30 ms on rank 0" in wait.why


def test_a_straggler_reads_the_same_on_every_rank() -> None:
    """Each rank's own step differs (rank 0 waited, rank 1 computed), but the severity is
    judged on the slowest rank's step, which every rank holds: both say warning."""
    rate = {"throughput.steps_per_sec": RankStats(25.0, 40.0, 32.5, 1, 0, 2, None, 1)}
    severities = []
    for rank, seconds in ((0, 0.025), (1, 0.040)):
        step = dataclasses.replace(STEP, total=seconds, p50=seconds, mean=seconds)
        reports = [
            dataclasses.replace(straggling(s, across=rate), step_time=step, rank=rank)
            for s in (20, 30)
        ]
        found = straggler_of(reports)[-1]
        assert found is not None
        severities.append((found.rank, found.severity, found.evidence["step_s"]))
    assert severities == [(1, "warning", pytest.approx(0.04))] * 2


def test_findings_round_trip_and_refuse_bad_values() -> None:
    finding = Finding(
        "stalls",
        "warning",
        "why",
        "next",
        path="(other)",
        rank=1,
        evidence={"a": 1.5, "b": [1, 2], "c": "x"},
        since_step=20,
    )
    assert Finding.from_dict(json.loads(json.dumps(finding.to_dict()))) == finding
    with pytest.raises(ValueError, match="unknown finding kind 'slow'"):
        Finding("slow", "warning", "w", "n")
    with pytest.raises(ValueError, match="unknown severity 'bad'"):
        Finding("stalls", "bad", "w", "n")
    with pytest.raises(ValueError, match="evidence 'x' must be a finite number"):
        Finding("stalls", "info", "w", "n", evidence={"x": float("nan")})
    with pytest.raises(ValueError, match="rank must be an int"):
        Finding.from_dict({**finding.to_dict(), "rank": "1"})


def test_thresholds_are_checked_and_parsed() -> None:
    assert Thresholds.parse(["input_share=0.4", "trend_reports=5"]) == Thresholds(
        input_share=0.4, trend_reports=5
    )
    with pytest.raises(ValueError, match="unknown threshold 'nope=1'"):
        Thresholds.parse(["nope=1"])
    with pytest.raises(ValueError, match="input_share must be a finite number >= 0"):
        Thresholds(input_share=-1)
    with pytest.raises(ValueError, match="hysteresis must be in"):
        Thresholds(hysteresis=0)
    relaxed = Thresholds().relaxed()
    assert relaxed.input_share == pytest.approx(0.4)
    assert relaxed.stall_ratio == pytest.approx(1 + 4 * 0.8)
    with pytest.raises(ValueError, match="diagnose must be True, False or a Thresholds"):
        instrument.Reporter(diagnose="yes")  # type: ignore[arg-type]


def test_thresholds_override_the_rules(clock: FakeClock) -> None:
    reports = run(
        clock,
        phases(data=0.007, forward=0.004),
        diagnose=Thresholds(input_share=0.6, input_critical=0.9),
    )
    assert all("input_bound" not in kinds(r) for r in reports)


def test_no_diagnosis_when_turned_off(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, diagnose=False)
    phases()(clock, 0)
    reporter.step()
    assert reporter.flush().findings == ()
    assert reporter.summary() is None
    reporter.close()


def test_a_failing_diagnosis_leaves_the_report(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Diagnosis, report: Report) -> tuple[Finding, ...]:
        raise RuntimeError("boom")

    monkeypatch.setattr(Diagnosis, "add", broken)
    with caplog.at_level(logging.ERROR, logger="instrument"):
        reports = run(clock, phases(), steps=20)
    assert len(reports) == 2
    assert all(r.findings == () for r in reports)
    assert caplog.text.count("the diagnosis failed") == 1


def test_series_stay_bounded_and_trends_are_robust() -> None:
    series = Series()
    for i in range(1000):
        series.add(i, 2.0 * i)
    assert len(series.points) <= POINTS
    found = series.trend()
    assert found is not None
    assert found.tau == 1.0
    assert found.slope == pytest.approx(2.0)
    noisy = Series()
    for i in range(10):
        noisy.add(float(i), 1.0 + (5.0 if i == 5 else 0.0))
    flat = noisy.trend()
    assert flat is not None
    assert flat.slope == 0.0


def _reference_trend(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Kendall's tau and the Theil-Sen slope of ``points``, pair by pair."""
    pairs = list(itertools.combinations(points, 2))
    score = sum((b[1] > a[1]) - (b[1] < a[1]) for a, b in pairs)
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in pairs if b[0] != a[0]]
    return score / len(pairs), statistics.median(slopes)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=6), min_size=3, max_size=3 * POINTS),
    st.sets(st.integers(min_value=3, max_value=3 * POINTS)),
)
def test_a_series_trend_is_the_pairwise_one(values: list[int], asked: set[int]) -> None:
    """The kept score and the slopes sorted in as trends are asked (ties, merges of
    neighbours, trends asked at any points) equal tau and the slope taken pair by pair; the
    spread is the values' range."""
    series = Series()
    for i, value in enumerate(values, 1):
        series.add(float(i), float(value))
        if i in asked or i == len(values):
            found = series.trend()
            assert found is not None
            tau, slope = _reference_trend(series.points)
            assert (found.tau, found.slope) == (pytest.approx(tau), pytest.approx(slope))
            ys = [y for _, y in series.points]
            assert series.spread == max(ys) - min(ys)


def test_console_puts_the_verdict_first_and_the_summary_at_close(clock: FakeClock) -> None:
    out = io.StringIO()
    reporter = instrument.Reporter(every=10, sinks=[instrument.sinks.Console(out)], memory=False)
    for i in range(30):
        phases(data=0.012, forward=0.003)(clock, i)
        reporter.step()
    reporter.close()
    text = out.getvalue().splitlines()
    assert text[0].startswith("instrument report #1")
    assert text[1].startswith("verdict: INPUT-BOUND (critical) on data: data took")
    assert text[2].startswith("  next: raise the DataLoader's num_workers")
    summary = text.index(next(line for line in text if line.startswith("instrument run summary")))
    assert text[summary + 1].startswith("verdict: INPUT-BOUND (critical) on data since step 0")


def test_the_saved_summary_equals_the_live_one(
    clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = instrument.sinks.JSONL(tmp_path / "run.jsonl")
    reporter = instrument.Reporter(every=10, sinks=[sink], memory=False)
    base = phases(other=0.002)
    for i in range(100):
        base(clock, i)
        if i % 20 == 19:
            clock.advance(0.2)
        reporter.step()
    reporter.close()
    live = reporter.summary()
    assert live is not None
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == live.to_dict()
    assert RunSummary.from_dict(written) == live
    assert cli.main(["summary", str(tmp_path / "run.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == written
    assert cli.main(["summary", str(tmp_path / "run.jsonl")]) == 0
    assert "verdict: STALLS (warning) on (other)" in capsys.readouterr().out
    assert cli.main(["summary", str(tmp_path / "run.jsonl"), "--threshold", "bad=1"]) == 2
    assert "unknown threshold 'bad=1'" in capsys.readouterr().err


def test_every_sink_sees_the_findings(clock: FakeClock, tmp_path: Path) -> None:
    from instrument import html
    from instrument.reading import read_file
    from instrument.sinks.scalars import scalars

    sink = instrument.sinks.JSONL(tmp_path / "run.jsonl")
    reporter = instrument.Reporter(every=10, sinks=[sink], memory=False)
    for i in range(30):
        phases(data=0.012, forward=0.003)(clock, i)
        reporter.step()
    reporter.close()
    saved = read_file(tmp_path / "run.jsonl").reports
    assert [f.kind for f in saved[-1].findings][:1] == ["input_bound"]
    values = scalars(saved[-1])
    assert values["diagnosis/input_bound"] == 3.0  # critical
    assert values["diagnosis/verdict"] == 3.0
    assert values["diagnosis/stalls"] == 0.0
    page = html.page_data(saved, title="t", run_name="run", rank=0)
    assert page["verdict"]["verdict"]["kind"] == "input_bound"
    assert "data took" in page["verdict"]["verdict"]["why"]


KILLED = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the default action, also under nohup
import instrument

reporter = instrument.Reporter(
    every=5, sinks=[instrument.sinks.Console(), instrument.sinks.JSONL(sys.argv[1])]
)
for step in range(10**6):
    with instrument.timed("data"):
        time.sleep(0.003)
    with instrument.timed("forward"):
        time.sleep(0.001)
    instrument.step()
    if step == 14:
        print("ready", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_job_ended_by_sigterm_still_gets_its_summary(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-c", KILLED, str(tmp_path / "run.jsonl")]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        while child.stdout.readline() not in ("ready\n", ""):
            pass  # the reports printed before
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGTERM
    assert "instrument run summary" in out
    assert "verdict: INPUT-BOUND" in out.split("instrument run summary", 1)[1]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["verdict"]["kind"] == "input_bound"
    assert written["reports"] >= 3


def test_collective_wait_counts_overlapping_async_collectives_once() -> None:
    step = instrument.report.Stats(10, 0.012, 0.012, 0.012, 0.012, 0.0, 0.012, 0.012, 0.012)

    def node(path: str, total: float, **more: object) -> Node:
        return Node(path=path, host=dataclasses.replace(step, total=total), **more)  # type: ignore[arg-type]

    report = Report(
        nodes=(
            node("forward", 0.002),
            node("backward", 0.0095, concurrent_time=0.009),
            node("backward/ddp_all_reduce", 0.007, concurrent=True),
            node("backward/all_reduce (async)", 0.006, concurrent=True),
        ),
        steps=10,
        step_time=step,
        normalizer="steps",
        step=20,
    )
    found = kinds(Report(findings=Diagnosis().add(report)))["collective_wait"]
    assert found.evidence["collective_s"] == pytest.approx(0.009)  # their union, not 0.013
    assert found.path == "backward/ddp_all_reduce"


#: Slow steps from the machine's other work: interval -> (steps slowed, how much).
HICCUPS = {1: (3, 6.0), 3: (4, 5.0), 4: (1, 8.0), 6: (3, 6.0)}


def test_a_growing_forward_is_found_through_hiccups_that_move_the_mean_step(
    clock: FakeClock,
) -> None:
    """A few steps of some intervals several times slower (the machine's other work) make
    the mean step jump about; the median step still rises steadily: a slowdown, named."""

    def step(clock: FakeClock, i: int) -> None:
        slowed, factor = HICCUPS.get(i // 10, (0, 1.0))
        k = factor if i % 10 < slowed else 1.0
        phases(data=0.002 * k, forward=(0.002 + 0.0001 * i) * k, optimizer=0.002 * k)(clock, i)

    reports = run(clock, step, steps=80)
    means = [r.step_time.mean for r in reports[1:] if r.step_time is not None]
    assert any(b < a for a, b in itertools.pairwise(means))  # the mean jumps about
    found = kinds(reports[-1]).get("slowdown")
    assert found is not None, [f.why for f in reports[-1].findings]
    assert (found.severity, found.path) == ("warning", "forward")


def test_a_share_that_rises_because_the_rest_got_faster_is_no_slowdown(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        phases(data=0.006 - 0.00006 * i, forward=0.003)(clock, i)  # the loader warms up

    assert all("slowdown" not in kinds(r) for r in run(clock, step, steps=80))


def test_a_whole_step_that_slows_alike_is_only_info(clock: FakeClock) -> None:
    def step(clock: FakeClock, i: int) -> None:
        k = 1 + 0.02 * i  # every region 2 % slower each step: the machine, not a region
        phases(data=0.001 * k, forward=0.004 * k, optimizer=0.001 * k, other=0.0005 * k)(clock, i)

    found = kinds(run(clock, step, steps=80)[-1]).get("slowdown")
    assert found is not None
    assert (found.severity, found.path) == ("info", None)
    assert "every region slowed alike" in found.why
    assert "the machine" in found.next


def test_a_region_that_holds_under_half_of_the_growth_is_named_only_as_info(
    clock: FakeClock,
) -> None:
    """Every region slows 2 % a step and ``data`` grows from nothing: its share of the step
    grows steadily (15 % to 28 %), but its own growth is under half of the step's
    (``slowdown_explains``), so the finding names it as info and sends the user to the
    machine first."""

    def step(clock: FakeClock, i: int) -> None:
        k = 1 + 0.02 * i
        phases(data=0.00007 * i, forward=0.0035 * k, optimizer=0.0015 * k, other=0.000625 * k)(
            clock, i
        )

    found = kinds(run(clock, step, steps=80)[-1]).get("slowdown")
    assert found is not None
    assert (found.severity, found.path) == ("info", "data")
    region, whole = found.evidence["region_growth_s"], found.evidence["last_s"]
    assert 0 < region < 0.5 * (whole - found.evidence["first_s"])
    assert "look at the machine" in found.next
    strict = kinds(run(clock, step, steps=80, diagnose=Thresholds(slowdown_explains=0.3))[-1])
    assert strict["slowdown"].severity != "info"
    assert strict["slowdown"].path == "data"


def test_the_thresholds_table_of_the_docs_is_the_code() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "diagnosis.md").read_text()
    table = docs[docs.index("| threshold | default |") :].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", table, re.M))
    defaults = {f.name: getattr(Thresholds(), f.name) for f in dataclasses.fields(Thresholds)}
    assert {name: float(value) for name, value in rows.items()} == defaults
