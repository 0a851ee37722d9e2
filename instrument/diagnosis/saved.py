"""The summary of a saved run: its JSONL files read back and diagnosed as the live run was."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from instrument.diagnosis.engine import diagnose
from instrument.diagnosis.summary import RunSummary
from instrument.diagnosis.thresholds import Thresholds
from instrument.reading import ReportFileError, rank_files, read_file
from instrument.report import Report


def files_of(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself when it exists, else its per-rank files (``run.rank<R>.jsonl``)."""
    plain = Path(path)
    if plain.exists():
        return [plain]
    found = list(rank_files(plain).values())
    if not found:
        raise ReportFileError(f"{os.fspath(path)}: no such file")
    return found


def last_run(reports: Sequence[Report]) -> tuple[list[Report], int]:
    """The reports of the last run in a file that several runs appended to (a run starts
    again where the report index does not grow), and how many earlier reports were left."""
    start = 0
    for i in range(1, len(reports)):
        if reports[i].index <= reports[i - 1].index:
            start = i
    return list(reports[start:]), start


def summarize(
    paths: Sequence[str | os.PathLike[str]], thresholds: Thresholds | None = None
) -> RunSummary:
    """The run's summary from its JSONL files (one or several ranks': each rank's reports
    are diagnosed in order, as its reporter did live, then the ranks' summaries merged)."""
    by_rank: dict[int, list[Report]] = {}
    for path in paths:
        for file in files_of(path):
            for report in read_file(file).reports:
                by_rank.setdefault(report.rank, []).append(report)
    summaries = []
    for rank in sorted(by_rank):
        reports, skipped = last_run(by_rank[rank])
        if skipped:
            print(
                f"instrument: note: rank {rank}: {skipped} reports of an earlier run in the "
                "same file were left out",
                file=sys.stderr,
            )
        summaries.append(diagnose(reports, thresholds))
    return RunSummary.merge(summaries)
