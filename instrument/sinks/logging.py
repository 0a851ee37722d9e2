"""Logging: one record per report on a standard ``logging`` logger."""

from __future__ import annotations

import logging

from instrument.report import Report
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.tree import render_text


class Logging(Sink):
    """Log each report's tree as one record.

    The record carries the report as ``record.instrument_report`` (a ``Report``), so a
    handler can format it differently.

    Args:
        logger: A logger or its name (default ``"instrument"``).
        level: The record's level (default ``logging.INFO``).
        only_ranks: Which ranks log: rank 0 by default, "all", a rank, or several.

    Distributed: construct it on every rank; only the ranks in ``only_ranks`` log (``"all"``
    when each rank writes its own log file).
    """

    def __init__(
        self,
        logger: logging.Logger | str = "instrument",
        level: int = logging.INFO,
        *,
        only_ranks: RankFilter = 0,
        ranks: RankFilter | None = None,
    ) -> None:
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        if not isinstance(logger, str) and not all(
            callable(getattr(logger, method, None)) for method in ("log", "isEnabledFor")
        ):
            raise TypeError(
                f"Logging logger must be a logging.Logger (or LoggerAdapter) or a logger's "
                f"name, got {logger!r}"
            )
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(
                f"Logging level must be a logging level int (e.g. logging.INFO), got {level!r}"
            )
        self.level = level

    def write(self, report: Report) -> None:
        if self.logger.isEnabledFor(self.level):
            self.logger.log(
                self.level,
                "%s",
                render_text(report, unicode=True),
                extra={"instrument_report": report},
            )

    def __repr__(self) -> str:
        return f"Logging(logger={self.logger.name!r}, level={logging.getLevelName(self.level)})"
