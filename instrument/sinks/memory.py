"""InMemory: keeps every report in a list — for tests and notebooks."""

from __future__ import annotations

from instrument.report import Report
from instrument.sinks.base import Sink


class InMemory(Sink):
    """Collects reports in ``self.reports`` (oldest first)."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def write(self, report: Report) -> None:
        self.reports.append(report)

    @property
    def last(self) -> Report:
        """The latest report; ``IndexError`` if none arrived yet."""
        if not self.reports:
            raise IndexError("no report has been written to this sink yet")
        return self.reports[-1]

    def clear(self) -> None:
        """Forget the stored reports."""
        self.reports.clear()
