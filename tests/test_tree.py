"""The console tree on a fake clock: one meaning per column whatever the normalizer, rows
in a stable order, folding, and the note on a step time that moved."""

from __future__ import annotations

import io

import pytest

import instrument
from instrument.report import Node, RankStats, Report
from instrument.sinks import Console
from instrument.stats import Stats
from instrument.testing import FakeClock, capture_reports
from instrument.tree import rows


def train(clock: FakeClock, steps: int, layers: tuple[float, ...] = (0.002, 0.003)) -> None:
    """``steps`` steps: data, forward (an encoder of ``layers``), backward, optimizer (with
    two tiny regions), zero_grad from the second step on, and 0.9 ms outside any region."""
    for i in range(steps):
        if i:
            with instrument.timed("zero_grad"):
                clock.advance(0.001)
        with instrument.timed("data"):
            clock.advance(0.001)
        with instrument.timed("forward"):
            clock.advance(0.001)
            with instrument.timed("encoder"):
                for n, seconds in enumerate(layers):
                    with instrument.timed(f"layers.{n}"):
                        clock.advance(seconds)
        with instrument.timed("backward"):
            clock.advance(0.010)
        with instrument.timed("optimizer"):
            clock.advance(0.002)
            for name in ("log", "save"):
                with instrument.timed(name):
                    clock.advance(0.00005)
        clock.advance(0.0009)
        instrument.step()


def table(report: Report, **options: bool) -> str:
    """The tree from its header line down (the lines above hold wall and own-cost times)."""
    lines = report.render(**options).splitlines()
    return "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("region")) :])


PER_STEP = """\
region                      ms/step  % of step  calls/step  ms/call  max ms/call
step (10 steps)              20.900      100.0           1   20.900       21.000
├── data                      1.000        4.8           1    1.000        1.000
├── forward                   6.000       28.7           1    6.000        6.000
│   └── encoder               5.000       23.9           1    5.000        5.000
│       ├── layers.0          2.000        9.6           1    2.000        2.000
│       └── layers.1          3.000       14.4           1    3.000        3.000
├── backward                 10.000       47.8           1   10.000       10.000
├── optimizer                 2.100       10.0           1    2.100        2.100
│   └── … 2 more under 1 %    0.100        0.5
├── zero_grad                 0.900        4.3         0.9    1.000        1.000
└── (other)                   0.900        4.3
2 rows folded (under 1 % of the step or more than 3 levels deep); every row: \
Console(fold=False) or instrument show --full"""


@pytest.mark.parametrize("normalizer", ["steps", 1.0, 4.0])
def test_the_columns_mean_the_same_whatever_the_normalizer(
    clock: FakeClock, normalizer: float | str
) -> None:
    with capture_reports(normalizer=normalizer, memory=False) as reports:
        train(clock, 10)
    assert table(reports[0]) == PER_STEP


def test_without_steps_the_columns_say_interval_totals(clock: FakeClock) -> None:
    with capture_reports(normalizer="steps", memory=False) as reports:
        for _ in range(4):
            with instrument.timed("load"):
                clock.advance(0.003)
        with instrument.timed("store"):
            clock.advance(0.001)
    report = reports[0]
    assert (
        report.render()
        .splitlines()[0]
        .startswith("instrument report #1 · no steps marked: interval totals")
    )
    assert table(report) == (
        "region  total ms  % of total  calls  ms/call  max ms/call\n"
        "load      12.000        92.3      4    3.000        3.000\n"
        "store      1.000         7.7      1    1.000        1.000"
    )


def test_two_reports_of_a_run_keep_their_rows_in_order(clock: FakeClock) -> None:
    with capture_reports(every=5, memory=False) as reports:
        train(clock, 5, layers=(0.004, 0.001, 0.002))  # layers.0 the slowest...
        train(clock, 5, layers=(0.001, 0.004, 0.003))  # ...then layers.1
    first, second = reports[:2]
    assert [row.path for row in rows(first)] == [row.path for row in rows(second)]
    labels = [line.split()[0] for line in table(first).splitlines()]
    assert labels == [line.split()[0] for line in table(second).splitlines()]
    assert [row.path for row in rows(first) if row.path and "layers" in row.path] == [
        "forward/encoder/layers.0",
        "forward/encoder/layers.1",
        "forward/encoder/layers.2",
    ]


def deep_model(clock: FakeClock, layers: int = 12) -> None:
    """One step of a ``layers``-layer model, each layer an attention and an MLP (plus a
    norm under 1 %); layer 7 is the slowest, its attention the largest part of it."""
    with instrument.timed("forward"):
        with instrument.timed("encoder"):
            for n in range(layers):
                with instrument.timed(f"layers.{n}"):
                    with instrument.timed("attn"):
                        clock.advance(0.004 if n == 7 else 0.002)
                        with instrument.timed("softmax"):
                            clock.advance(0.002)
                    with instrument.timed("mlp"):
                        clock.advance(0.002)
                    with instrument.timed("norm"):
                        clock.advance(0.00001)
        with instrument.timed("head"):
            clock.advance(0.003)
    with instrument.timed("backward"):
        clock.advance(0.080)
    instrument.step()


def test_deep_rows_fold_but_the_largest_child_of_the_largest_row_stays(
    clock: FakeClock,
) -> None:
    with capture_reports(memory=False) as reports:
        deep_model(clock)
    lines = table(reports[0]).splitlines()
    assert len(lines) <= 40
    assert lines[10:15] == [
        "│   │   ├── layers.6 (+3)      6.010        3.8           1    6.010        6.010",
        "│   │   ├── layers.7           8.010        5.1           1    8.010        8.010",
        "│   │   │   ├── attn           6.000        3.8           1    6.000        6.000",
        "│   │   │   │   └── softmax    2.000        1.3           1    2.000        2.000",
        "│   │   │   └── … 2 more       2.010        1.3",
    ]
    assert sum(1 for line in lines if " (+3) " in line) == 11  # each other layer's 3 parts
    assert lines[-1].startswith("46 rows folded (under 1 % of the step")
    every = table(reports[0], fold=False).splitlines()
    assert len(every) == len(lines) - 2 + 46  # less the fold line and the note, plus 46 rows
    assert not any("more" in line or "(+" in line for line in every)


def slow_step(clock: FakeClock, seconds: float) -> None:
    with instrument.timed("forward"):
        clock.advance(seconds)
    instrument.step()


def test_the_console_notes_a_step_time_that_moved(clock: FakeClock) -> None:
    stream = io.StringIO()
    with capture_reports(every=2, memory=False, sinks=[Console(stream)]):
        for seconds in (0.084, 0.084, 0.177, 0.177, 0.200, 0.200, 0.080, 0.080):
            slow_step(clock, seconds)
    trees = stream.getvalue().split("instrument report #")[1:]
    notes = [[line for line in tree.splitlines() if line.startswith("step time")] for tree in trees]
    assert notes == [
        [],  # the first report: nothing to compare with
        ["step time 2.1x the last report's (84 ms → 177 ms)"],
        [],  # 1.13x: within the usual swing
        ["step time 0.4x the last report's (200 ms → 80 ms)"],
    ]
    second = trees[1].splitlines()
    note = second.index(notes[1][0])
    assert second[1].startswith("verdict: ")  # the verdict and findings first, then the note
    assert all(line.startswith(("verdict: ", "  ")) for line in second[1:note])
    assert second[note + 1].startswith("instrument's own cost: ")


def test_a_new_run_on_the_same_console_is_not_compared(clock: FakeClock) -> None:
    console, stream = Console(io.StringIO()), io.StringIO()
    console.stream = stream
    for seconds in (0.010, 0.100):
        with capture_reports(memory=False, sinks=[console]):  # each its report #1
            slow_step(clock, seconds)
    assert "step time" not in stream.getvalue()


def test_device_bytes_and_rank_columns_are_named_per_step() -> None:
    host = Stats(4, 0.008, 0.004, 0.003, 0.005, 0.0, 0.004, 0.004, 0.004)
    device = Stats(4, 0.006, 0.003, 0.002, 0.004, 0.0, 0.003, 0.003, 0.003)
    ranks = RankStats(0.005, 0.007, 0.006, 1, 0, 2, slowest=1)
    node = Node("all_reduce", host, device, 0.006, "cuda", bytes=4000, ranks=ranks)
    report = Report(nodes=(node,), steps=2, step_time=host, normalizer="steps")
    header, _, row, _ = table(report).splitlines()
    assert header.endswith(
        "ms/call  max ms/call  host ms/step  bytes/step  rank min ms/step  rank max ms/step"
        "  slowest rank"
    )
    assert row.split()[2:] == [
        *("6.000", "75.0", "2", "3.000", "4.000"),  # device time first; 4 calls in 2 steps
        *("8.000", "2.0", "KB", "5.000", "7.000", "1"),
    ]
    alone = table(Report(nodes=(node,), normalizer="steps")).splitlines()
    assert alone[0].endswith(
        "calls  ms/call  max ms/call  host total ms   bytes  rank min total ms"
        "  rank max total ms  slowest rank"
    )
    assert alone[1].split()[1:4] == ["6.000", "100.0", "4"]


def test_console_fold_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="Console fold must be True or False, got 'no'"):
        Console(fold="no")  # type: ignore[arg-type]


def test_a_very_long_name_is_cut_for_display_and_kept_whole_in_the_report() -> None:
    """A 1 MiB name made every console report megabytes (rows padded to the longest name)."""
    host = Stats(1, 0.001, 0.001, 0.001, 0.001, 0.0, 0.001, 0.001, 0.001)
    name = "x" * 2**20
    report = Report(nodes=(Node(name, host, None, 0.001, "cpu"),), normalizer=1.0)
    text = report.render()
    assert len(text) < 1000
    assert "x" * 79 + "…" in text
    assert "x" * 77 + "..." in table(report, unicode=False)
    assert report.nodes[0].path == name
