"""TensorBoard: each report as scalars in an event file, for ``tensorboard --logdir``."""

from __future__ import annotations

import numbers
import os
from typing import Any

from instrument.lifecycle import ForkSafeLock
from instrument.report import Report
from instrument.sinks import extras
from instrument.sinks.base import RankFilter, Sink, only_ranks_option, single_rank
from instrument.sinks.scalars import TOP, check_top, global_step, scalars

INSTALL_HINT = 'TensorBoard sink needs tensorboard: pip install "torch-instrument[tensorboard]"'


def _summary_writer_type() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, imported when the sink is made (never in a
    flush: a fork during an import would leave the child a held import lock)."""
    return extras.load("torch.utils.tensorboard", "tensorboard", INSTALL_HINT).SummaryWriter


def _check_log_dir(log_dir: object) -> str:
    text = os.fspath(log_dir) if isinstance(log_dir, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise TypeError(f"TensorBoard log_dir must be a text path, got {log_dir!r}")
    if not text:
        raise ValueError("TensorBoard log_dir must be a directory, got an empty string")
    return text


def _check_flush_secs(flush_secs: object) -> float:
    if isinstance(flush_secs, bool) or not isinstance(flush_secs, numbers.Real):
        raise TypeError(f"flush_secs must be a number of seconds, got {flush_secs!r}")
    if not 0 < float(flush_secs) < float("inf"):
        raise ValueError(f"flush_secs must be > 0, got {flush_secs!r}")
    return float(flush_secs)


class TensorBoard(Sink):
    """Write each report as TensorBoard scalars: one per region and statistic.

    The tags are those of :func:`instrument.sinks.scalars.scalars` (``time/<path>/mean_ms``,
    ``time_host/...``, ``time_device/...``, ``step_time/...``, ``throughput/...``,
    ``memory/...``, ``across/...``, ``diagnosis/...``), all at the report's step (the steps
    seen so far, or the report's index when no step was marked) and the report's wall time.
    Regions get tags for the top level and the ``top`` deeper regions with the most time.

    Args:
        log_dir: The directory for a ``SummaryWriter`` that the sink creates on the first
            report (nothing is created before). A ``{rank}`` placeholder is filled in.
        writer: A ``SummaryWriter`` (or any object with ``add_scalar(tag, value,
            global_step=, walltime=)``) to write to instead; the sink flushes it but never
            closes it. Pass exactly one of ``log_dir`` and ``writer``.
        only_ranks: Which ranks write: rank 0 by default (one run per job), "all", a rank, or a
            collection of ranks.
        flush_secs: How often the created writer pushes events to disk.
        top: How many regions below the top level get tags in each report (those with
            the most time; default 10); ``None`` writes every region.

    Distributed: construct it on every rank; it calls no collective. Only the ranks in
    ``only_ranks`` write. With ``only_ranks="all"`` give ``log_dir`` a ``{rank}`` placeholder
    (``"runs/exp/rank{rank}"``); without one, ranks that share ``log_dir`` write to
    ``<log_dir>/rank<R>``, so each rank is its own TensorBoard run.

    :meth:`flush` pushes buffered events to disk; :meth:`close` closes the writer it created
    (a later report opens a new event file in the same directory).

    Example:
        >>> reporter = instrument.Reporter(every=50, sinks=[TensorBoard("runs/exp")])
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        writer: Any = None,
        only_ranks: RankFilter = 0,
        ranks: RankFilter | None = None,
        flush_secs: float = 30.0,
        top: int | None = TOP,
    ) -> None:
        if (log_dir is None) == (writer is None):
            given = "both" if writer is not None else "neither"
            raise ValueError(f"TensorBoard needs exactly one of log_dir or writer, got {given}")
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                f"TensorBoard writer must have add_scalar(tag, value, global_step), got {writer!r}"
            )
        self.log_dir = None if log_dir is None else _check_log_dir(log_dir)
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.flush_secs = _check_flush_secs(flush_secs)
        self.top = check_top(top)
        self._writer_type: Any = None
        if self.log_dir is not None:
            extras.require("tensorboard", INSTALL_HINT)
            self._writer_type = _summary_writer_type()
        self._given: Any = writer
        self._created: Any = None
        self._lock = ForkSafeLock()

    @property
    def writer(self) -> Any:
        """The writer in use: the one passed in, or the created one (``None`` until then)."""
        return self._given if self._given is not None else self._created

    def write(self, report: Report) -> None:
        values = scalars(report, self.top)
        step = global_step(report)
        walltime = report.end_time or None
        with self._lock:
            writer = self.writer
            if writer is None:
                writer = self._created = self._writer_type(
                    log_dir=self._dir(report), flush_secs=self.flush_secs
                )
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=step, walltime=walltime)

    def _dir(self, report: Report) -> str:
        """The created writer's directory for ``report``'s rank."""
        log_dir = self.log_dir or ""
        if "{rank}" in log_dir:
            return log_dir.replace("{rank}", str(report.rank))
        if report.world_size > 1 and not single_rank(self.only_ranks):
            return os.path.join(log_dir, f"rank{report.rank}")
        return log_dir

    def flush(self) -> None:
        with self._lock:
            writer = self.writer
            if writer is not None and callable(getattr(writer, "flush", None)):
                writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._created is not None:
                self._created.close()
                self._created = None
            elif self._given is not None and callable(getattr(self._given, "flush", None)):
                self._given.flush()

    def __repr__(self) -> str:
        if self.log_dir is not None:
            return f"TensorBoard({self.log_dir!r})"
        return f"TensorBoard(writer={self._given!r})"
