"""``python -m instrument show | diff | plot`` on JSONL files made with exact fake times."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import instrument
from instrument import cli, reading
from instrument.reading import ReportFileError, locate, read_file
from instrument.sinks.jsonl import JSONL
from instrument.testing import FakeClock, use_clock

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
A = {"forward": 0.010, "backward": 0.020, "old": 0.002}  # + 1 ms untimed: 33 ms per step
B = {"forward": 0.015, "backward": 0.019, "data": 0.001}  # + 1 ms untimed: 36 ms per step


def write_run(
    path: Path,
    regions: Mapping[str, float],
    *,
    reports: int = 3,
    steps: int = 2,
    normalizer: float | str = "steps",
    warmup: Mapping[str, float] | None = None,
    tail: Mapping[str, float] | None = None,
) -> list[instrument.Report]:
    """``reports`` reports of ``steps`` steps each; every step runs ``regions`` (seconds)
    one after the other, then 1 ms outside any region. The first report runs ``warmup``;
    ``tail`` runs after the last step (flushed at close, without steps)."""
    clock = FakeClock()
    flushed = []
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None, sinks=[JSONL(path)], normalizer=normalizer, memory=False
        )
        for index in range(reports):
            for _ in range(steps):
                for name, seconds in ((warmup or regions) if index == 0 else regions).items():
                    with instrument.timed(name):
                        clock.advance(seconds)
                clock.advance(0.001)
                instrument.step()
            flushed.append(reporter.flush())
        for name, seconds in (tail or {}).items():
            with instrument.timed(name):
                clock.advance(seconds)
        last = reporter.close()  # flushes the tail: a report without steps
        if last is not None:
            flushed.append(last)
    return flushed


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def tree_row(out: str, label: str) -> list[str]:
    """The figures of the tree line whose label (tree lines stripped) is ``label``."""
    for line in out.splitlines():
        name = line.lstrip("├└│─|`- ")
        if name.startswith(label + "  "):
            return name[len(label) :].split()
    raise AssertionError(f"no line {label!r} in:\n{out}")


def table(out: str) -> dict[str, list[str]]:
    """The diff's rows by region, in printed order: A, B, delta ms, delta %."""
    return {region: cells[:4] for region, cells in full_table(out).items()}


def full_table(out: str) -> dict[str, list[str]]:
    """The diff's rows by region with every column (the interval's cells joined)."""
    body = out.split("\n\n")[1].splitlines()[1:]
    rows = {}
    for line in body:
        region, rest = line.split(None, 1)
        cells = rest.split()
        if "[" in rest:  # "+50.0% [+50.0, +50.0]"
            start = next(i for i, cell in enumerate(cells) if cell.startswith("["))
            cells[start - 1 : start + 2] = [" ".join(cells[start - 1 : start + 2])]
        rows[region] = cells
    return rows


# -- show ---------------------------------------------------------------------------------


def test_show_prints_the_last_report_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "run.jsonl", A, warmup={"forward": 0.1})
    code, out, err = run_cli(capsys, "show", tmp_path / "run.jsonl")
    assert (code, err) == (0, "")
    assert out.startswith("instrument report #3 · 2 steps · ")
    assert tree_row(out, "step (2 steps)")[:2] == ["33.000", "100.0"]
    assert tree_row(out, "forward")[0] == "10.000"  # the last report, not the warm-up
    assert "├── backward" in out
    assert "└── (other)" in out


def test_show_picks_a_step_or_every_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "run.jsonl", A, warmup={"forward": 0.1})
    code, out, _ = run_cli(capsys, "show", tmp_path / "run.jsonl", "--step", "2", "--ascii")
    assert code == 0
    assert out.startswith("instrument report #1 - 2 steps")
    assert "|-- forward " in out  # ASCII lines
    assert tree_row(out, "forward")[0] == "100.000"  # the warm-up report
    code, out, _ = run_cli(capsys, "show", tmp_path / "run.jsonl", "--all")
    assert code == 0
    assert [line.split(" · ")[0] for line in out.splitlines() if "#" in line] == [
        "instrument report #1",
        "instrument report #2",
        "instrument report #3",
    ]


def test_show_folds_small_rows_unless_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=[JSONL(tmp_path / "run.jsonl")])
        for _ in range(2):
            with instrument.timed("optimizer"):
                clock.advance(0.030)
                for name in ("log", "save"):
                    with instrument.timed(name):
                        clock.advance(0.0001)
            instrument.step()
        reporter.close()
    code, out, _ = run_cli(capsys, "show", tmp_path / "run.jsonl")
    assert code == 0
    assert tree_row(out, "… 2 more under 1 %")[:2] == ["0.200", "0.7"]
    assert "log" not in out
    assert out.endswith("every row: Console(fold=False) or instrument show --full\n")
    code, out, _ = run_cli(capsys, "show", tmp_path / "run.jsonl", "--full")
    assert code == 0
    assert tree_row(out, "log")[:2] == ["0.100", "0.3"]
    assert "more under" not in out
    assert "folded" not in out


def test_show_reads_the_per_rank_files_of_a_missing_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank, forward in ((0, 0.010), (1, 0.020)):
        last = write_run(tmp_path / f"src{rank}.jsonl", {"forward": forward})[-1]
        report = dataclasses.replace(last, rank=rank, world_size=2)
        JSONL(tmp_path / "run.jsonl").write(report)  # world_size 2: run.rank<R>.jsonl
        JSONL(tmp_path / "r{rank}.jsonl").write(report)
    assert locate(tmp_path / "run.jsonl") == tmp_path / "run.rank0.jsonl"
    code, out, _ = run_cli(capsys, "show", tmp_path / "run.jsonl", "--rank", "1")
    assert code == 0
    assert out.startswith("instrument report #3 · rank 1/2")
    assert tree_row(out, "forward")[0] == "20.000"
    assert locate(tmp_path / "r{rank}.jsonl") == tmp_path / "r0.jsonl"
    code, out, _ = run_cli(capsys, "show", tmp_path / "r{rank}.jsonl", "--rank", "1")
    assert code == 0
    assert tree_row(out, "forward")[0] == "20.000"
    code, _, err = run_cli(capsys, "show", tmp_path / "run.jsonl", "--rank", "5")
    assert code == 2
    assert "run.jsonl: no file for rank 5; found run.rank0.jsonl, run.rank1.jsonl" in err


# -- diff ---------------------------------------------------------------------------------


def test_diff_lists_every_region_by_impact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", A, warmup={"forward": 0.5})  # skipped as warm-up
    write_run(tmp_path / "b.jsonl", B)
    code, out, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert (code, err) == (0, "")
    assert "(rank 0, 3 reports, first 1 skipped as warm-up, 4 steps)" in out
    assert out.split("\n\n")[1].splitlines()[0].split() == [
        "region", "A", "ms/step", "B", "ms/step", "delta", "ms", "delta", "%",
        "median", "%", "[95%", "CI]", "verdict",
    ]  # fmt: skip
    rows = table(out)
    assert list(rows) == ["(step)", "forward", "old", "backward", "data", "(other)"]
    assert rows["(step)"] == ["33.000", "36.000", "+3.000", "+9.1%"]
    assert rows["forward"] == ["10.000", "15.000", "+5.000", "+50.0%"]
    assert rows["old"] == ["2.000", "-", "-2.000", "removed"]
    assert rows["backward"] == ["20.000", "19.000", "-1.000", "-5.0%"]
    assert rows["data"] == ["-", "1.000", "+1.000", "new"]
    assert rows["(other)"] == ["1.000", "1.000", "+0.000", "+0.0%"]
    full = full_table(out)  # exact times: a zero-width interval, so every change is certain
    assert full["forward"][4:] == ["+50.0% [+50.0, +50.0]", "slower"]
    assert full["backward"][4] == "-5.0% [-5.0, -5.0]"
    assert full["(other)"][4:] == ["+0.0% [+0.0, +0.0]", "noise"]
    assert full["old"][4:] == ["-"]  # in one run only: no interval
    assert "verdict: whole interval beyond 5% and a change of at least 0.660 ms/step" in out
    assert "note: 2 report(s) after warm-up in one run: too few to measure its noise" in out


def test_diff_skip_first_and_min_ms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "a.jsonl", A, warmup={**A, "forward": 0.100})
    write_run(tmp_path / "b.jsonl", B)
    code, out, _ = run_cli(
        capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--skip-first", "0",
        "--min-ms", "1.5",
    )  # fmt: skip
    assert code == 0
    rows = table(out)
    assert rows["forward"][0] == "40.000"  # (100 + 10 + 10) / 3 ms: the warm-up counted
    assert set(rows) == {"(step)", "forward", "backward", "old"}  # data, (other) < 1.5 ms


def test_diff_compares_per_step_whatever_the_normalizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", A, normalizer="steps")
    write_run(tmp_path / "b.jsonl", A, normalizer=1.0, steps=3)
    write_run(tmp_path / "c.jsonl", A, normalizer=1000.0, steps=4)  # Megatron-style ms
    for other in ("b.jsonl", "c.jsonl"):
        code, out, _ = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / other)
        assert code == 0
        rows = table(out)
        assert rows["(step)"] == ["33.000", "33.000", "+0.000", "+0.0%"]
        assert rows["backward"] == ["20.000", "20.000", "+0.000", "+0.0%"]


def test_diff_leaves_out_a_report_without_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = write_run(tmp_path / "a.jsonl", A, tail={"save": 5.0, "forward": 1.0})
    assert [r.steps for r in reports] == [2, 2, 2, 0]
    write_run(tmp_path / "b.jsonl", A)
    code, out, _ = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert code == 0
    assert "A: " + str(tmp_path / "a.jsonl") + " (rank 0, 3 reports, first 1 skipped" in out
    rows = table(out)
    assert "save" not in rows
    assert rows["forward"] == ["10.000", "10.000", "+0.000", "+0.0%"]


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (["--fail-above", "60"], 0),
        (["--fail-above", "40"], 1),  # forward +50 %
        (["--fail-above", "5"], 1),  # forward, (step) +9.1 %
        (["--fail-above", "40", "--min-ms", "16"], 0),  # forward hidden
    ],
)
def test_fail_above_exits_1_naming_the_slower_regions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], code: int
) -> None:
    write_run(tmp_path / "a.jsonl", A)
    write_run(tmp_path / "b.jsonl", B)
    found, out, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl", *options)
    assert found == code
    assert ("forward" in out) == ("--min-ms" not in options)
    if code:
        threshold = options[1]
        assert err.startswith(
            f"instrument: {2 if threshold == '5' else 1} region(s) slowed significantly by"
        )
        assert f"more than {threshold}%: " in err
        assert "forward (+50.0%)" in err
        assert ("(step) (+9.1%)" in err) == (threshold == "5")
        assert "backward" not in err  # faster
        assert "data" not in err  # new
    else:
        assert err == ""


def test_diff_refuses_a_run_without_steps_against_one_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", A)
    JSONL(tmp_path / "b.jsonl").write(instrument.Report(index=1))
    code, _, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert code == 2
    assert "cannot compare" in err
    assert "b.jsonl (no step marked: time per report)" in err
    code, _, err = run_cli(
        capsys, "diff", tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--skip-first", "3"
    )
    assert code == 2
    assert "a.jsonl: --skip-first 3 leaves none of its 3 reports" in err


# -- plot ---------------------------------------------------------------------------------


def test_series_stacks_up_to_the_step_time(tmp_path: Path) -> None:
    regions = {"a": 0.001, "b": 0.004, "c": 0.002, "d": 0.003}
    reports = write_run(tmp_path / "run.jsonl", regions, reports=2, steps=5)
    data = cli.series(reports, top=2)
    assert data.x == [5.0, 10.0]
    assert data.widths == [5.0, 5.0]
    assert list(data.layers) == ["b", "d", "other regions", "(other)"]
    assert data.layers["other regions"] == pytest.approx([3.0, 3.0])  # a + c, in ms
    assert data.step_ms == pytest.approx([11.0, 11.0])
    stacked = [sum(layer[i] for layer in data.layers.values()) for i in range(2)]
    assert stacked == pytest.approx(data.step_ms)


def test_plot_tells_other_from_other_regions_and_labels_self_time(tmp_path: Path) -> None:
    nested = {"forward": 0.002, "forward/a": 0.001, "forward/b": 0.003, "backward": 0.004}
    clock = FakeClock()
    reports = []
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, memory=False)
        for _ in range(2):
            with instrument.timed("forward"):
                clock.advance(nested["forward"])
                for name in ("a", "b"):
                    with instrument.timed(name):
                        clock.advance(nested[f"forward/{name}"])
            with instrument.timed("backward"):
                clock.advance(nested["backward"])
            clock.advance(0.001)
            instrument.step()
            reports.append(reporter.flush())
    data = cli.series(reports, top=3)
    assert list(data.layers) == ["backward", "forward/b", "forward", "other regions", "(other)"]
    assert data.parents == {"forward"}
    chart = cli.figure(data, "t")
    axes = chart.axes[0]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert sorted(legend) == sorted([
        "step time", "(other): in no region", "other regions (their self time)",
        "forward (self)", "forward/b", "backward",
    ])  # fmt: skip
    bars = {c.get_label(): c for c in axes.containers}
    uncovered, rest = bars["(other): in no region"], bars["other regions (their self time)"]
    assert {bar.get_hatch() for bar in uncovered} == {"///"}  # hatched: never a region
    assert {bar.get_hatch() for bar in rest} == {None}
    assert uncovered[0].get_facecolor() != rest[0].get_facecolor()
    ticks = [t for t in axes.get_xticks() if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]
    assert ticks
    assert all(float(t).is_integer() for t in ticks)  # 2 reports: no 0.5 steps


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "run.jsonl", A, reports=4)
    out = tmp_path / "breakdown.png"
    code, stdout, _ = run_cli(capsys, "plot", tmp_path / "run.jsonl", "-o", out, "--top", "2")
    assert code == 0
    assert stdout == f"wrote {out}\n"
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000


def test_plot_draws_a_long_run_as_an_area(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "run.jsonl", B, reports=45, steps=1)
    out = tmp_path / "long.svg"
    code, _, _ = run_cli(capsys, "plot", tmp_path / "run.jsonl", "-o", out)
    assert code == 0
    svg = out.read_text()
    assert "<svg" in svg
    assert "PolyCollection" in svg or "FillBetweenPolyCollection" in svg  # stackplot areas


def test_plot_without_matplotlib_says_which_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path / "run.jsonl", A)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    code, _, err = run_cli(capsys, "plot", tmp_path / "run.jsonl", "-o", tmp_path / "x.png")
    assert code == 2
    assert err == 'instrument: error: plot needs matplotlib: pip install "torch-instrument[plot]"\n'
    assert not (tmp_path / "x.png").exists()


def test_plot_names_an_output_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "run.jsonl", A)
    code, _, err = run_cli(capsys, "plot", tmp_path / "run.jsonl", "-o", tmp_path / "x.nope")
    assert code == 2
    assert "x.nope: cannot save the plot" in err


# -- errors -------------------------------------------------------------------------------


@pytest.fixture
def broken(tmp_path: Path) -> dict[str, Path]:
    """A file for every way reading can fail."""
    write_run(tmp_path / "good.jsonl", A)
    good = (tmp_path / "good.jsonl").read_text().splitlines()
    files = {
        "empty": "",
        "blank": "\n  \n",
        "not_report": good[0] + '\n{"loss": 1.5}\n',
        "not_json": good[0] + "\n" + good[1][:40] + "\n",
        "array": "[1, 2]\n",
        "bad_node": '{"nodes": [{"path": "x"}]}\n',
    }
    out = {name: tmp_path / f"{name}.jsonl" for name in files}
    for name, text in files.items():
        out[name].write_text(text)
    out["binary"] = tmp_path / "picture.png"
    out["binary"].write_bytes(PNG_MAGIC + bytes(range(256)))
    out["good"] = tmp_path / "good.jsonl"
    return out


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty", "empty.jsonl: empty, no report in it"),
        ("blank", "blank.jsonl: empty, no report in it"),
        (
            "not_report",
            "not_report.jsonl:2: not an instrument report (a JSON object without 'nodes'",
        ),
        ("not_json", "not_json.jsonl:2: not JSON (Expecting value at column 41)"),
        ("array", "array.jsonl:1: not an instrument report (a JSON array;"),
        ("bad_node", "bad_node.jsonl:1: not an instrument report (missing key 'host')"),
        ("binary", "picture.png:1: not UTF-8 text"),
    ],
)
@pytest.mark.parametrize("command", ["show", "diff", "plot"])
def test_unreadable_files_name_the_file_and_line(
    broken: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    name: str,
    message: str,
    command: str,
) -> None:
    argv = {
        "show": ["show", broken[name]],
        "diff": ["diff", broken["good"], broken[name]],
        "plot": ["plot", broken[name], "-o", broken["good"].with_suffix(".png")],
    }[command]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("instrument: error: ")
    assert message in err
    assert str(broken[name]) in err
    assert out == ""


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "show", tmp_path / "nope.jsonl")
    assert code == 2
    assert err == f"instrument: error: {tmp_path / 'nope.jsonl'}: no such file\n"
    code, _, err = run_cli(capsys, "show", tmp_path)
    assert code == 2
    assert "is a directory, not a report file" in err


def test_bad_step_and_rank_list_what_is_there(
    broken: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "show", broken["good"], "--step", "5")
    assert code == 2
    assert err.endswith("good.jsonl: no report at step 5; steps present: 2, 4, 6\n")
    code, _, err = run_cli(capsys, "show", broken["good"], "--rank", "3")
    assert code == 2
    assert err.endswith("good.jsonl: no report of rank 3; ranks present: 0\n")


def test_a_line_cut_off_by_a_crash_is_skipped_with_a_note(
    broken: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    text = broken["good"].read_text()
    broken["good"].write_text(text + text.splitlines()[0][:100])  # no newline: cut mid-write
    found = read_file(broken["good"])
    assert (len(found.reports), found.incomplete_line) == (3, 4)
    code, out, err = run_cli(capsys, "show", broken["good"])
    assert code == 0
    assert out.startswith("instrument report #3")
    assert err == f"instrument: note: {broken['good']}:4: skipped a last line cut off mid-write\n"
    broken["good"].write_text(text.splitlines()[0][:100])
    with pytest.raises(ReportFileError, match="only a cut-off line, no report in it"):
        read_file(broken["good"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: command"),
        (["show"], "the following arguments are required: path"),
        (["show", "x", "--step", "-1"], "argument --step: expected an int >= 0, got '-1'"),
        (["show", "x", "--step", "2", "--all"], "not allowed with argument --step"),
        (["diff", "a", "b", "--fail-above", "0"], "expected a number > 0, got '0'"),
        (["diff", "a", "b", "--min-ms", "nan"], "expected a number >= 0, got 'nan'"),
        (["plot", "x"], "the following arguments are required: -o/--output"),
        (["plot", "x", "-o", "y.png", "--top", "0"], "expected an int >= 1, got '0'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert "usage: instrument" in err
    assert message in err
    assert out == ""


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "diff", "--help")
    assert code == 0
    assert "--fail-above PCT" in out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert out == f"instrument {instrument.__version__}\n"


def test_html_without_output_writes_the_page_beside_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.jsonl"
    write_run(run, A, reports=2)
    code, out, err = run_cli(capsys, "html", run)
    page = tmp_path / "run.html"
    assert (code, out, err) == (0, f"wrote {page}\n", "")
    assert page.read_text(encoding="utf-8").lower().startswith("<!doctype html>")
    code, out, err = run_cli(capsys, "html", page)  # never over its input
    assert code == 2
    assert err.startswith(f"instrument: error: {page}: looks like a page, not a JSONL run")


# -- the real entry point -----------------------------------------------------------------

BLOCK_MATPLOTLIB = """
import importlib.abc, runpy, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "matplotlib":
            raise ImportError(f"No module named {name!r} (blocked)")
        return None

sys.meta_path.insert(0, Block())
sys.argv[0] = "instrument"
runpy.run_module("instrument", run_name="__main__", alter_sys=True)
"""


def python(*argv: str | Path, encoding: str = "utf-8") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    return subprocess.run(
        [sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_python_m_instrument_show_and_diff(tmp_path: Path) -> None:
    write_run(tmp_path / "a.jsonl", A)
    write_run(tmp_path / "b.jsonl", B)
    shown = python("-m", "instrument", "show", tmp_path / "a.jsonl", encoding="ascii")
    assert shown.returncode == 0, shown.stderr
    assert "|-- backward" in shown.stdout  # stdout cannot print the box lines
    compared = python("-m", "instrument", "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl",
                      "--fail-above", "40")  # fmt: skip
    assert compared.returncode == 1
    assert list(table(compared.stdout))[:2] == ["(step)", "forward"]
    assert compared.stderr == (
        "instrument: 1 region(s) slowed significantly by more than 40%: forward (+50.0%)\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_python_m_instrument_plot_and_without_matplotlib(tmp_path: Path) -> None:
    write_run(tmp_path / "run.jsonl", A)
    out = tmp_path / "plot.png"
    drawn = python("-m", "instrument", "plot", tmp_path / "run.jsonl", "-o", out)
    assert drawn.returncode == 0, drawn.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC
    missing = python("-c", BLOCK_MATPLOTLIB, "plot", tmp_path / "run.jsonl", "-o", out)
    assert missing.returncode == 2
    assert missing.stderr == (
        'instrument: error: plot needs matplotlib: pip install "torch-instrument[plot]"\n'
    )


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "nope.jsonl: no such file"),
        ("empty", "empty.jsonl: empty, no report in it"),
        ("not_report", "not_report.jsonl:2: not an instrument report"),
        ("bad_step", "good.jsonl: no report at step 7; steps present: 2, 4, 6"),
    ],
)
def test_python_m_instrument_errors(broken: dict[str, Path], case: str, message: str) -> None:
    argv: list[str | Path] = {
        "missing": ["show", broken["good"].with_name("nope.jsonl")],
        "empty": ["show", broken["empty"]],
        "not_report": ["diff", broken["good"], broken["not_report"]],
        "bad_step": ["show", broken["good"], "--step", "7"],
    }[case]
    done = python("-m", "instrument", *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("instrument: error: ")
    assert message in done.stderr


# -- hostile input -----------------------------------------------------------------------


def edit_reports(path: Path, edit: Callable[[int, dict[str, Any]], object]) -> None:
    """Rewrite each report line of ``path`` through ``edit(line index, decoded report)``."""
    lines = path.read_text().splitlines()
    decoded = [json.loads(line) for line in lines]
    for i, data in enumerate(decoded):
        edit(i, data)
    path.write_text("".join(json.dumps(data) + "\n" for data in decoded))


BAD_VALUES = {
    "too_large": ('"count": 2', '"count": 1e999', "the number 1e999 is out of range"),
    "digits": ('"count": 2', '"count": ' + "9" * 5000, "an integer of 5000 digits"),
    "nan": ('"total": 0.01,', '"total": NaN,', "NaN is not a finite number"),
    "infinity": ('"total": 0.01,', '"total": -Infinity,', "-Infinity is not a finite number"),
    "nan_text": ('"total": 0.01,', '"total": "nan",', "nodes[0].host.total is nan"),
    "negative": ('"steps": 2', '"steps": -2', "steps is -2; expected a count >= 0"),
    "normalizer": ('"normalizer": "steps"', '"normalizer": 0', "normalizer is 0.0; expected"),
    "throughput": ('"mfu": null', '"mfu": []', "throughput.mfu must be a number, got []"),
    "empty_path": (
        '{"path": "forward", "clock"',
        '{"path": "forward/", "clock"',
        "nodes[0].path is 'forward/'",
    ),
}


@pytest.mark.parametrize("case", sorted([*BAD_VALUES, "nested"]))
@pytest.mark.parametrize("command", ["show", "diff", "plot", "html"])
def test_values_no_report_holds_name_file_and_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, command: str
) -> None:
    write_run(tmp_path / "good.jsonl", {"forward": 0.01})
    lines = (tmp_path / "good.jsonl").read_text().replace(": ", ":").splitlines()
    lines = [json.dumps(json.loads(line)) for line in lines]  # ", " and ": " as in BAD_VALUES
    if case == "nested":
        lines[1], message = "[" * 100_000, "JSON nested too deeply"
    else:
        old, new, message = BAD_VALUES[case]
        assert old in lines[1]
        lines[1] = lines[1].replace(old, new, 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    argv = {
        "show": ["show", bad],
        "diff": ["diff", tmp_path / "good.jsonl", bad, "--fail-above", "10"],
        "plot": ["plot", bad, "-o", tmp_path / "x.png"],
        "html": ["html", bad, "-o", tmp_path / "x.html"],
    }[command]
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"instrument: error: {bad}:2: not an instrument report (")
    assert message in err


def test_plot_of_reports_with_a_step_time_but_zero_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "run.jsonl", A)
    edit_reports(tmp_path / "run.jsonl", lambda _, data: data.update(steps=0))
    code, out, err = run_cli(capsys, "plot", tmp_path / "run.jsonl", "-o", tmp_path / "x.png")
    assert (code, err) == (0, "")
    assert out.startswith("wrote ")


def test_a_change_without_a_finite_percent_is_never_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline too close to zero gives +inf% (and a NaN interval): --fail-above fails."""
    write_run(tmp_path / "a.jsonl", A, reports=4)
    write_run(tmp_path / "b.jsonl", A, reports=4)

    def tiny(_: int, data: dict[str, Any]) -> None:
        node = next(n for n in data["nodes"] if n["path"] == "forward")
        node["host"]["total"] = node["self"] = 5e-324

    edit_reports(tmp_path / "a.jsonl", tiny)
    code, out, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl",
                             "--fail-above", "10")  # fmt: skip
    assert code == 1
    assert full_table(out)["forward"][3:] == ["+inf%", "+inf% [+nan, +nan]", "slower"]
    assert "forward (+inf%)" in err


def test_times_that_overflow_when_added_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", A, reports=4)
    write_run(tmp_path / "b.jsonl", A, reports=4)

    def huge(_: int, data: dict[str, Any]) -> None:
        data["normalizer"] = 1e10
        next(n for n in data["nodes"] if n["path"] == "forward")["host"]["total"] = 1e308

    edit_reports(tmp_path / "b.jsonl", huge)
    code, out, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl",
                             "--fail-above", "10")  # fmt: skip
    assert (code, out) == (2, "")
    assert err == (
        f"instrument: error: {tmp_path / 'b.jsonl'}:2: the time of 'forward' comes to inf "
        "(its values are too large to add up); cannot compare it\n"
    )


def test_names_with_a_newline_print_escaped_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", {"forward": 0.01})
    write_run(tmp_path / "b.jsonl", {"forward": 0.01})
    rename = {"forward": "for\nward\x00"}
    for name in ("a.jsonl", "b.jsonl"):
        edit_reports(tmp_path / name, lambda _, data: [n.update(path=rename.get(n["path"],
                     n["path"])) for n in data["nodes"]])  # fmt: skip
    code, out, _ = run_cli(capsys, "show", tmp_path / "a.jsonl")
    assert code == 0
    assert tree_row(out, "'for\\nward\\x00'")[:2] == ["10.000", "90.9"]
    code, out, _ = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert code == 0
    assert list(table(out)) == ["(step)", "'for\\nward\\x00'", "(other)"]


def test_regions_named_like_the_diffs_own_rows_stay_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_run(tmp_path / "a.jsonl", {"(step)": 0.010, "other_": 0.002, "'(step)'": 0.004})
    run = tmp_path / "a.jsonl"  # a region named "(other)": refused by timed(), not in a file
    run.write_text(run.read_text().replace('"other_"', '"(other)"'))
    code, out, _ = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "a.jsonl")
    assert code == 0
    rows = table(out)
    assert rows["(step)"][:2] == ["17.000", "17.000"]  # the step: 10 + 2 + 4 + 1 ms
    assert rows["(other)"][:2] == ["1.000", "1.000"]  # time in no region
    assert rows["'(step)'"][:2] == ["10.000", "10.000"]  # the user's regions
    assert rows["'(other)'"][:2] == ["2.000", "2.000"]
    assert rows["\"'(step)'\""][:2] == ["4.000", "4.000"]


def test_a_bug_on_some_input_exits_2_not_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 1 means "slower" to CI: an unexpected exception must never produce it."""
    write_run(tmp_path / "a.jsonl", A)

    def broken(*_: object) -> list[cli.Change]:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(cli, "compare", broken)
    code, out, err = run_cli(capsys, "diff", tmp_path / "a.jsonl", tmp_path / "a.jsonl",
                             "--fail-above", "10")  # fmt: skip
    assert (code, out) == (2, "")
    assert err == (
        "instrument: error: internal error on this input (ZeroDivisionError: float division "
        "by zero); please report it with the file\n"
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("command", [["show"], ["summary"], ["html", "-o", "page.html"],
                                     ["watch", "--once"], ["diff", "/dev/zero"]])  # fmt: skip
def test_special_files_end_in_an_error_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A FIFO nobody writes would block the read forever, /dev/zero would never end a line."""
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device or socket")):
        code, out, err = run_cli(capsys, command[0], path, *command[1:])
        assert (code, out) == (2, "")
        assert err == f"instrument: error: {path}: {kind}, not a regular report file\n"


def test_a_line_too_long_for_a_report_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 2**20)
    run = tmp_path / "run.jsonl"
    run.write_bytes(b"[" + b" " * 2**20 + b"]\n")
    code, out, err = run_cli(capsys, "show", run)
    assert (code, out) == (2, "")
    assert err == f"instrument: error: {run}:1: a line over 1 MiB; not a report file\n"


RANKS = {"rank_min": 0.001, "rank_max": 0.002, "rank_mean": 0.0015, "rank_argmin": 0,
         "rank_argmax": 1, "ranks_present": 2, "per_rank": [0.001, 0.002]}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"stragglers": [{"rank": 1, "host": "h", "regions": ["a"], "scores": [], "intervals": 2}]},
         "a straggler has 1 regions and 0 scores; expected one score per region"),
        ({"stragglers": [{"rank": 1, "host": "h", "regions": "a", "scores": [1], "intervals": 2}]},
         "straggler regions is a str; expected a list"),
        ({"across": {"throughput.mfu": {**RANKS, "per_rank": "xy"}}},
         "per_rank is a str; expected a list"),
        ({"across": {"throughput.mfu": {**RANKS, "per_rank": [0.1, "x"]}}},
         "could not convert string to float: 'x'"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_shape_is_a_file_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], detail: str
) -> None:
    """Malformed but valid JSON, field by field: the documented error at its line, never
    the internal error (each field of a gathered run's report changed in turn)."""
    run = tmp_path / "run.jsonl"
    write_run(run, A)
    lines = run.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), **change})
    run.write_text("\n".join(lines) + "\n")
    for command in ("show", "summary"):
        code, out, err = run_cli(capsys, command, run)
        assert (code, out) == (2, "")
        assert err == f"instrument: error: {run}:2: not an instrument report ({detail})\n"


def test_text_from_a_file_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A note, a straggler's host, a finding and a region name holding escape sequences (a
    file from elsewhere) print escaped, by every command."""
    run = tmp_path / "run.jsonl"
    write_run(run, {"data": 0.002, "forward": 0.004})
    evil = "\x1b[2J\x1b]0;pwned\x07\u202e"
    lines = []
    for line in run.read_text().splitlines():
        data = json.loads(line)
        data["across_note"] = f"note {evil}"
        data["stragglers"] = [{"rank": 1, "host": f"host {evil}", "regions": ["data"],
                               "scores": [0.5], "intervals": 3}]  # fmt: skip
        data["nodes"][0]["path"] = f"data {evil}"
        for finding in data.get("findings", []):
            finding["why"] = f"why {evil}"
        lines.append(json.dumps(data))
    run.write_text("\n".join(lines) + "\n")
    for argv in (["show", run], ["summary", run], ["diff", run, run], ["show", run, "--ascii"]):
        code, out, err = run_cli(capsys, *argv)
        assert code in (0, 2), (argv, err)
        for text in (out, err):
            assert not any(c in text for c in "\x1b\x07\u202e"), (argv, text)
        if argv[0] != "summary":  # summary judges afresh: its text names no such region
            assert "\\x1b" in out + err, argv
