"""The figures a scenario's reports show, read back from its JSONL file.

``python -m scenarios.figures OUTDIR`` prints a table of every ``OUTDIR/*.jsonl`` (rank 0's
file for the two-rank scenarios): per run, the median share of the step of each top-level
line and the signals below (reports after the first), then per report the step p50 and
max, the host RSS, and the cross-rank min, max and slowest rank of data, forward, backward.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from instrument import Report
from instrument.report import RankStats
from scenarios.training import EVERY, STEPS

#: The top-level lines whose share of the step the table shows, and the cross-rank ones.
LINES = ("data", "forward", "backward", "optimizer", "(other)")
ACROSS = ("data", "forward", "backward", "backward/ddp_all_reduce")


@dataclass(frozen=True)
class Figures:
    """One report's figures: the mean, median and longest step (seconds), each line's
    share of the mean step and shortest call (seconds; "step": the shortest step), the
    host RSS (bytes) and each line's values across ranks."""

    step: float
    p50: float
    max: float
    shares: dict[str, float]
    fastest: dict[str, float]
    rss: int
    across: dict[str, RankStats]


def read(path: Path) -> list[Report]:
    """The reports of a JSONL file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Report.from_dict(json.loads(line)) for line in lines if line]


def figures(report: Report) -> Figures:
    """The figures of one report (which must have steps)."""
    assert report.step_time is not None
    assert report.other is not None
    step = report.step_time.total
    shares = {path: report[path].total / step for path in LINES[:-1] if path in report}
    shares["(other)"] = report.other / step
    fastest = {path: report[path].min for path in LINES[:-1] if path in report}
    fastest["step"] = report.step_time.min
    across = {
        path: ranks
        for path in ACROSS
        if path in report and (ranks := report[path].ranks) is not None
    }
    return Figures(
        step=step,
        p50=report.step_time.p50,
        max=report.step_time.max,
        shares=shares,
        fastest=fastest,
        rss=report.memory["host_rss"],
        across=across,
    )


def run_figures(path: Path) -> list[Figures]:
    """The figures of every report of a run."""
    return [figures(report) for report in read(path)]


# Signals: one number per run that shows one problem, from the reports after the first
# (the first holds the warm-up steps).


def share(line: str) -> Callable[[list[Figures]], float]:
    """The median share of the step spent in ``line``."""

    def signal(run: list[Figures]) -> float:
        return statistics.median(f.shares.get(line, 0.0) for f in run[1:])

    return signal


#: The reports whose steps include a checkpoint's save (after steps 20 and 40).
SAVES = tuple(step // EVERY for step in range(20, STEPS, 20))


def stall(run: list[Figures]) -> float:
    """The longest step of the reports with a checkpoint's save (the lower of them) over
    the longest step of the other reports after the first: a stall at every save, not a
    passing hiccup of a busy machine."""
    others = [f.max for index, f in enumerate(run) if index and index not in SAVES]
    return min(run[index].max for index in SAVES) / max(others)


def forward_growth(run: list[Figures]) -> float:
    """How much longer the shortest forward is in the last two reports than in the two
    after the first, over the shortest step in those. The shortest call is one that the
    machine's other work did not interrupt: on a busy machine, even the median of ten
    calls can be."""
    early, late = run[1:3], run[-2:]
    forward = [sum(f.fastest["forward"] for f in two) for two in (early, late)]
    return (forward[1] - forward[0]) / sum(f.fastest["step"] for f in early)


def rss_growth(run: list[Figures]) -> float:
    """How much the host RSS grew from the second report to the last, in MB."""
    return (run[-1].rss - run[1].rss) / 2**20


def rank_excess(line: str) -> Callable[[list[Figures]], float]:
    """The median of the slowest rank's extra time in ``line`` (max - min across ranks) as
    a share of the step."""

    def signal(run: list[Figures]) -> float:
        spans = (f.across[line].rank_max - f.across[line].rank_min for f in run[1:])
        return statistics.median(span / f.step for span, f in zip(spans, run[1:], strict=True))

    return signal


SINGLE_SIGNALS: dict[str, Callable[[list[Figures]], float]] = {
    "data share": share("data"),
    "(other) share": share("(other)"),
    "optimizer share": share("optimizer"),
    "save stall": stall,
    "forward growth": forward_growth,
    "rss growth MB": rss_growth,
}
"""The signals of the single-rank problems."""

RANK_SIGNALS: dict[str, Callable[[list[Figures]], float]] = {
    "forward excess": rank_excess("forward"),
    "data excess": rank_excess("data"),
}
"""The signals of the two-rank problems (on rank 0's file)."""


def describe(name: str, run: list[Figures]) -> str:
    """One run's rows of the table."""
    shares = " ".join(f"{share(line)(run):5.0%}" for line in LINES)
    signals = RANK_SIGNALS if run[0].across else SINGLE_SIGNALS
    values = "  ".join(f"{key} {signal(run):.2f}" for key, signal in signals.items())
    p50 = "/".join(f"{f.p50 * 1e3:.1f}" for f in run)
    longest = "/".join(f"{f.max * 1e3:.0f}" for f in run)
    rss = "/".join(f"{f.rss / 2**20:.0f}" for f in run)
    rows = [f"{name:24}{shares}  {values}", f"{'':24}step p50 {p50}  max {longest}  rss {rss}"]
    for line in ACROSS:
        spans = [
            f"{v.rank_min * 1e3:.1f}-{v.rank_max * 1e3:.1f}:{v.slowest}"
            for f in run
            if (v := f.across.get(line)) is not None
        ]
        if spans:
            rows.append(f"{'':24}{line.rpartition('/')[2]} min-max:slowest {' '.join(spans)}")
    return "\n".join(rows)


def table(outdir: Path) -> str:
    """The rows of every run in ``outdir`` (rank 0's file of a multi-rank run)."""
    rows = [f"{'run':24}" + " ".join(f"{line[:5]:>5}" for line in LINES)]
    for path in sorted(outdir.glob("*/*.jsonl")):
        if ".rank" in path.name and not path.name.endswith(".rank0.jsonl"):
            continue
        rows.append(describe(path.parent.name, run_figures(path)))
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
