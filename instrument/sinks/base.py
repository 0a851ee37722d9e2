"""The sink interface: ``write(report)`` required, ``flush()`` / ``close()`` optional."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from instrument.report import Report

if TYPE_CHECKING:
    from instrument.diagnosis import RunSummary

RankFilter = int | Collection[int] | str


def check_rank_filter(ranks: object) -> RankFilter:
    """Validate a sink's ``ranks``: "all", one rank (int >= 0), or a collection of ranks."""
    if ranks == "all":
        return "all"
    if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 0:
        return ranks
    if (
        isinstance(ranks, Collection)
        and not isinstance(ranks, str)
        and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)
    ):
        return frozenset(ranks)
    raise ValueError(
        f"unknown ranks {ranks!r} for a sink; expected 'all', a rank (int >= 0) or a "
        "collection of ranks"
    )


def single_rank(ranks: RankFilter) -> bool:
    """Whether a rank filter lets at most one rank through."""
    return isinstance(ranks, int) or (not isinstance(ranks, str) and len(ranks) <= 1)


class Sink:
    """Base class for sinks. Only :meth:`write` must be overridden.

    A sink never reaches back into the registry: it gets a frozen report. If ``write``
    raises, the reporter logs it once and carries on with the other sinks.

    ``ranks`` says which ranks' reports the sink receives: "all" (the default here), one
    rank, or a collection of ranks (the reporter checks ``report.rank``). Without a process
    group every report is rank 0's.
    """

    ranks: RankFilter = "all"

    def wants(self, rank: int) -> bool:
        """Whether this sink receives the reports of ``rank``."""
        ranks = self.ranks
        if ranks == "all":
            return True
        if isinstance(ranks, int):
            return rank == ranks
        return rank in ranks

    def write(self, report: Report) -> None:
        """Receive one report."""
        raise NotImplementedError(f"{type(self).__name__} must implement write(report)")

    def write_summary(self, summary: RunSummary) -> None:
        """Receive the run's summary, once, when the reporter closes (no-op by default)."""

    def flush(self) -> None:
        """Push buffered output out (no-op by default)."""

    def close(self) -> None:
        """Release resources (no-op by default)."""
