"""The sink interface: ``write(report)`` required, ``flush()`` / ``close()`` optional."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from instrument._warn import deprecated
from instrument.report import Report

if TYPE_CHECKING:
    from instrument.diagnosis import RunSummary

RankFilter = int | Collection[int] | str


def only_ranks_option(only_ranks: object, ranks: object = None) -> RankFilter:
    """A sink's ``only_ranks``, checked; ``ranks`` is its deprecated alias (used if given)."""
    if ranks is not None:
        deprecated("a sink's ranks=", "only_ranks= (the same filter)")
        only_ranks = ranks
    return check_rank_filter(only_ranks)


def check_rank_filter(ranks: object) -> RankFilter:
    """Validate a sink's ``only_ranks``: "all", one rank (int >= 0), or a collection of ranks."""
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

    ``only_ranks`` says which ranks' reports the sink receives: "all" (the default here), one
    rank, or a collection of ranks (the reporter checks ``report.rank``). Without a process
    group every report is rank 0's. (``ranks`` is a deprecated alias of ``only_ranks``.)
    """

    only_ranks: RankFilter = "all"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        old = cls.__dict__.get("ranks")
        if old is not None and not isinstance(old, property):  # a class-level ``ranks = 0``
            deprecated(f"{cls.__name__}.ranks", "only_ranks (the same filter)")
            cls.only_ranks = check_rank_filter(old)
            del cls.ranks

    @property
    def ranks(self) -> RankFilter:
        """Deprecated alias of :attr:`only_ranks`."""
        deprecated("Sink.ranks", "Sink.only_ranks (the same filter)")
        return self.only_ranks

    @ranks.setter
    def ranks(self, ranks: RankFilter) -> None:
        deprecated("Sink.ranks", "Sink.only_ranks (the same filter)")
        self.only_ranks = check_rank_filter(ranks)

    def wants(self, rank: int) -> bool:
        """Whether this sink receives the reports of ``rank``."""
        ranks = self.only_ranks
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
