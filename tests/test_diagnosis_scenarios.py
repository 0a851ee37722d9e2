"""Real training runs with one problem injected each (``tests/scenarios``): the problem
shows in the reports when it is big and not when it is small, and the diagnosis names it.

One subprocess runs every single-rank scenario, then one two-rank launch (gloo, DDP) runs the
straggler scenarios, once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scenarios import figures, two_ranks
from scenarios.training import EVERY, SINGLE, SIZES, STEPS, TWO_RANKS

from instrument import cli

TESTS = Path(__file__).resolve().parent
#: Seconds each launch may take (10-15 s each on a 2-core machine, one after the other, with
#: a busy process beside them).
LIMIT = 150

#: Every run; the healthy run has no size: its two runs are the same.
RUNS = [(scenario, size) for scenario in (*SINGLE, *TWO_RANKS) for size in SIZES]

Signal = Callable[[list[figures.Figures]], float]

#: The figure that shows each problem in the raw reports (``scenarios.figures``), the
#: least it is when the problem is big, and the most it is when it is small (or absent).
SIGNALS: dict[str, tuple[str, float, float]] = {
    "slow_data": ("data share", 0.6, 0.5),
    "untimed_work": ("(other) share", 0.5, 0.4),
    "heavy_optimizer": ("optimizer share", 0.5, 0.4),
    "checkpoint": ("save stall", 2.5, 1.8),
    "slowdown": ("forward growth", 0.25, 0.2),  # the small one: 0.12-0.15 on a busy machine
    "memory_leak": ("rss growth MB", 40.0, 25.0),  # small: 0-15 MB (torch 2.6 grows), big 60+
    "compute_straggler": ("forward excess", 0.3, 0.25),
    "input_straggler": ("data excess", 0.3, 0.25),
}

#: The verdict ``instrument summary`` gives each big problem: (kind, path, rank). The
#: verdict's path is this one or a region inside it (``forward/2``: the slow module); a
#: path of ``None`` is not checked. Every small problem, and the healthy run, has no
#: finding of severity warning or critical.
EXPECTED: dict[tuple[str, str], tuple[str, str | None, int | None]] = {
    ("slow_data", "big"): ("input_bound", "data", None),
    ("compute_straggler", "big"): ("straggler", "forward", 1),
    ("input_straggler", "big"): ("straggler", "data", 1),
    ("memory_leak", "big"): ("memory_creep", None, None),
    ("untimed_work", "big"): ("residual_heavy", "(other)", None),
    ("heavy_optimizer", "big"): ("compute_bound", "optimizer", None),
    ("checkpoint", "big"): ("stalls", "(other)", None),
    ("slowdown", "big"): ("slowdown", "forward", None),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding every run's JSONL files."""
    outdir = tmp_path_factory.mktemp("scenarios")
    root = str(TESTS.parent)
    paths = [root, os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [root]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # this checkout's instrument
    command = [sys.executable, "-m", "scenarios.single_rank", str(outdir)]
    log = outdir / "single_rank.log"
    start = time.perf_counter()
    with log.open("w") as out:  # one launch after the other: on two cores, running both
        # at once makes every step time a measure of the other launch's load
        single = subprocess.run(
            command, cwd=TESTS, env=env, stdout=out, stderr=out, timeout=LIMIT, check=False
        )
        single_done = time.perf_counter() - start
        two_ranks.run(outdir, timeout=LIMIT)
    assert single.returncode == 0, log.read_text()[-3000:]
    wall = time.perf_counter() - start
    print(f"\nscenarios: {wall:.1f} s (single rank: {single_done:.1f} s)\n{figures.table(outdir)}")
    return outdir


def files(outdir: Path, scenario: str, size: str) -> list[Path]:
    """The run's JSONL files (one per rank, rank 0 first)."""
    folder = outdir / f"{scenario}-{size}"
    single = folder / "run.jsonl"
    return [single] if single.exists() else sorted(folder.glob("run.rank*.jsonl"))


def signals_of(scenario: str) -> dict[str, Signal]:
    return figures.RANK_SIGNALS if scenario in TWO_RANKS else figures.SINGLE_SIGNALS


@pytest.mark.timeout(2 * LIMIT + 30)
@pytest.mark.parametrize(("scenario", "size"), RUNS)
def test_the_problem_shows_in_the_reports_only_when_big(
    runs: Path, scenario: str, size: str
) -> None:
    """A big problem's figure is clearly up, a small one's is not; the healthy run has
    every single-rank figure where a small problem has it."""
    run = figures.run_figures(files(runs, scenario, size)[0])
    assert len(run) == STEPS // EVERY
    if scenario in TWO_RANKS:
        assert all(f.across for f in run)  # rank 0's file holds the cross-rank values
    checked = SIGNALS.values() if scenario == "healthy" else [SIGNALS[scenario]]
    for name, least, most in checked:
        if name not in signals_of(scenario):
            continue  # a two-rank figure, for the healthy single-rank run
        value = signals_of(scenario)[name](run)
        shown = f"{name}: {value:.3g}\n{figures.describe(scenario, run)}"
        if size == "big" and scenario != "healthy":
            assert value >= least, shown
        else:
            assert value <= most, shown


@pytest.mark.timeout(2 * LIMIT + 30)
@pytest.mark.parametrize(("scenario", "line"), [("compute_straggler", "forward"),
                                                ("input_straggler", "data")])  # fmt: skip
def test_rank_1_is_the_slowest_rank_in_its_slow_line(runs: Path, scenario: str, line: str) -> None:
    run = figures.run_figures(files(runs, scenario, "big")[0])
    assert [f.across[line].slowest for f in run[1:]] == [1] * (len(run) - 1)


@pytest.mark.timeout(2 * LIMIT + 30)
@pytest.mark.parametrize(("scenario", "size"), RUNS)
def test_the_summary_names_the_problem(
    runs: Path, scenario: str, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m instrument summary FILES --json`` (in this process: a subprocess per
    run would import torch each time): the big problem is the verdict, at its path and
    rank; a small one, or none, gives no warning."""
    capsys.readouterr()
    code = cli.main(["summary", *map(str, files(runs, scenario, size)), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(out)
    verdict, found = summary["verdict"], summary["findings"]
    expected = EXPECTED.get((scenario, size))
    if expected is None:
        loud = [f for f in found if f["severity"] in ("warning", "critical")]
        if scenario in TWO_RANKS:  # a constant problem cannot grow: on two cores, one rank
            # slowed by the machine reads as the other's backward wait growing (a slowdown)
            loud = [f for f in loud if f["kind"] != "slowdown"]
        assert not loud, json.dumps(summary, indent=1)
        return
    kind, path, rank = expected
    assert verdict["kind"] == kind, json.dumps(summary, indent=1)
    assert verdict["severity"] in ("warning", "critical")
    if path is not None:
        assert f"{verdict['path']}/".startswith(f"{path}/"), json.dumps(summary, indent=1)
    assert verdict["rank"] == rank, json.dumps(summary, indent=1)


@pytest.mark.timeout(2 * LIMIT + 30)
@pytest.mark.parametrize("scenario", ["checkpoint", "slowdown", "input_straggler"])
def test_the_saved_summary_equals_the_live_ones(
    runs: Path, scenario: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each rank's reporter wrote its summary at the end of the run (``summary.json`` beside
    its JSONL file): ``instrument summary`` of that rank's file computes the same."""
    for path in files(runs, scenario, "big"):
        rank = path.suffixes[0].removeprefix(".rank") if len(path.suffixes) > 1 else None
        live = path.parent / ("summary.json" if rank is None else f"summary.rank{rank}.json")
        capsys.readouterr()
        assert cli.main(["summary", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == json.loads(live.read_text())
