"""Following a run's JSONL files while they are written: the reports as they arrive.

A :class:`Tail` reads only what was appended since its last read, and only complete lines
(a line still being written is read once its newline is there). A :class:`Track` turns one
file's new lines into the state the live view shows: the latest report, the step times so
far, and whether the run has ended (its summary written).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from instrument.diagnosis.summary import RunSummary
from instrument.diagnosis.trends import Series
from instrument.diagnosis.view import View
from instrument.reading import (
    ReportFileError,
    open_report_file,
    parse_line,
    rank_files,
    report_lines,
)
from instrument.report import Report
from instrument.sinks.files import summary_path

#: Lines read from one file per refresh at most: a long file is caught up over a few
#: refreshes, each drawn, rather than in one silent pause.
LINES_PER_READ = 500


class Tail:
    """The complete lines appended to ``path`` since the last :meth:`read`.

    It keeps its byte offset and never reads a line twice. A file that shrank (truncated)
    or was replaced (another file at the path) is read again from its start, and
    :meth:`read` says so; a file that does not exist (yet, or any more) reads as nothing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.line = 0  # complete lines read so far
        self._identity: tuple[int, int] | None = None

    def read(self, limit: int = LINES_PER_READ) -> tuple[list[tuple[int, bytes]], bool]:
        """The new complete lines (line number, bytes), at most ``limit``, and whether the
        file started over (truncated or replaced) since the last read."""
        try:
            with open_report_file(self.path) as file:
                stat = os.fstat(file.fileno())
                identity = (stat.st_dev, stat.st_ino)
                restarted = self._identity is not None and (
                    identity != self._identity or stat.st_size < self.offset
                )
                if restarted or self._identity is None:
                    self.offset, self.line, self._identity = 0, 0, identity
                file.seek(self.offset)
                lines: list[tuple[int, bytes]] = []
                for _, raw in report_lines(file, str(self.path), self.line + 1):
                    if not raw.endswith(b"\n") or len(lines) >= limit:
                        break
                    self.offset += len(raw)
                    self.line += 1
                    lines.append((self.line, raw))
                return lines, restarted
        except (FileNotFoundError, NotADirectoryError):
            return [], False
        except IsADirectoryError:
            raise ReportFileError(f"{self.path}: is a directory, not a report file") from None
        except OSError as exc:
            raise ReportFileError(f"{self.path}: cannot read it ({exc.strerror or exc})") from None


@dataclass
class Track:
    """What the live view knows of one file: the latest report of the run it holds, the
    step time of each report so far (``steps``: step count, seconds per step), how many
    reports, when the last one came (``time.monotonic()``) and the last line skipped."""

    path: Path
    tail: Tail = field(init=False)
    last: Report | None = None
    reports: int = 0
    steps: Series = field(default_factory=Series)
    arrived: float | None = None
    skipped: str = ""
    is_report_file: bool = False  # a report was read from it

    def __post_init__(self) -> None:
        self.tail = Tail(self.path)

    def update(self) -> tuple[bool, bool]:
        """Read what was appended; returns (a new report came, more lines are waiting).

        A line that is not a report raises :class:`ReportFileError` while the file has
        shown no report (it is not a report file); after that it is skipped and named in
        ``skipped`` (a writer killed mid-line, then a new run appending to the file).
        A file started over, or a report whose index does not follow the last one (a new
        run appending to the same file), starts the history again.
        """
        lines, restarted = self.tail.read()
        if restarted:
            self._start_over()
        new = False
        for number, raw in lines:
            if not raw.strip():
                continue
            try:
                report = parse_line(raw, f"{self.path}:{number}")
            except ReportFileError as exc:
                if not self.is_report_file:
                    raise
                self.skipped = str(exc)
                continue
            if self.last is not None and report.index <= self.last.index:
                self._start_over()
            self._add(report)
            new = True
        return new, len(lines) >= LINES_PER_READ

    def _start_over(self) -> None:
        self.last, self.reports, self.steps = None, 0, Series()

    def _add(self, report: Report) -> None:
        self.last = report
        self.is_report_file = True
        self.reports += 1
        self.arrived = time.monotonic()
        view = View(report)
        if view.has_steps:
            self.steps.add(float(report.step), view.step)

    def summary(self) -> RunSummary | None:
        """The run's summary when its reporter has closed: the ``summary.json`` (or
        ``summary.rank<R>.json``) beside the file, written after the file's last line and
        ending at the same step as its last report; else ``None``."""
        last = self.last
        if last is None:
            return None
        target = summary_path(self.path, last.rank, last.world_size)
        try:
            if target.stat().st_mtime_ns < self.path.stat().st_mtime_ns:
                return None  # an earlier run's
            summary = RunSummary.from_dict(json.loads(target.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            return None  # not there yet, or being replaced
        return summary if summary.last_step == last.step else None


def watched_files(path: Path) -> list[Path]:
    """The files to follow for ``path``: itself when it exists, else its per-rank files
    (``run.rank<R>.jsonl``) found so far, lowest rank first."""
    if path.exists():
        return [path]
    return list(rank_files(path).values())
