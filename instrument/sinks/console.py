"""Console: the text tree to a stream (stdout by default)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from instrument import checks
from instrument.report import Report
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.tree import render_text

if TYPE_CHECKING:
    from instrument.diagnosis import RunSummary


def supports_unicode(stream: TextIO) -> bool:
    """True when the stream's encoding can print the box-drawing tree lines."""
    encoding = getattr(stream, "encoding", None)
    if encoding is None:  # an in-memory text stream (StringIO) holds any str
        return True
    try:
        "├└│─·".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class Console(Sink):
    """Print each report's tree.

    Args:
        stream: Where to write; ``None`` means ``sys.stdout`` at write time.
        unicode: Box-drawing lines; ``None`` decides from the stream's encoding.
        only_ranks: Which ranks print: rank 0 by default, "all", a rank, or several.
        fold: Fold rows under 1 % of the step and rows more than 3 levels deep (the largest
            child of a largest row stays) into ``… N more`` lines; ``False`` prints every row.

    Each tree after the first notes a step time that moved by 1.5x or more since the
    report this sink printed before it.

    When the reporter closes, the run's summary follows (see :meth:`write_summary`).

    Distributed: construct it on every rank (the reporter's flush may be collective); only
    the ranks in ``only_ranks`` print. With ``Reporter(ranks="minmax")`` rank 0's tree already shows
    every rank's min, max and slowest rank.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        unicode: bool | None = None,
        only_ranks: RankFilter = 0,
        ranks: RankFilter | None = None,
        fold: bool = True,
    ) -> None:
        self.stream = checks.check_writable_stream("Console stream", stream)
        self.unicode = checks.check_optional_bool("Console unicode", unicode)
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.fold = checks.check_bool("Console fold", fold)
        self._previous: Report | None = None

    def write(self, report: Report) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        unicode = supports_unicode(stream) if self.unicode is None else self.unicode
        previous = self._previous
        if previous is not None and previous.index >= report.index:
            previous = None  # another reporter's, or a new run's: nothing to compare
        text = render_text(report, unicode=unicode, fold=self.fold, previous=previous)
        self._previous = report
        if not unicode:
            text = text.replace("·", "-")
        stream.write(text + "\n")
        stream.flush()

    def write_summary(self, summary: RunSummary) -> None:
        """Print the run's summary (its verdict and findings) when the run made two reports
        or more (with one, its report already said it all)."""
        if summary.reports < 2:
            return
        stream = self.stream if self.stream is not None else sys.stdout
        text = summary.render()
        unicode = supports_unicode(stream) if self.unicode is None else self.unicode
        if not unicode:
            text = text.replace("·", "-")
        stream.write(text + "\n")
        stream.flush()

    def __repr__(self) -> str:
        return f"Console(stream={self.stream!r}, fold={self.fold!r})"
