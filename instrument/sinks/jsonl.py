"""JSONL: one JSON line per report, appended and flushed at once."""

from __future__ import annotations

import json
import logging
import math
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from instrument.lifecycle import ForkSafeLock, inherited
from instrument.report import Report
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.sinks.files import rank_path, summary_path

if TYPE_CHECKING:
    from instrument.diagnosis import RunSummary

logger = logging.getLogger("instrument")


def encode(report: Report) -> str:
    """``report.to_dict()`` as one line of strict JSON (no ``NaN`` or ``Infinity`` tokens).

    A report never holds a non-finite number in practice; if one slips in, it is written as
    ``null`` so that every JSON parser still reads the line.
    """
    data = report.to_dict()
    try:
        return json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(data), allow_nan=False, separators=(",", ":"))


def _finite(value: Any) -> Any:
    """``value`` with every NaN / ±inf float, at any depth, replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class JSONL(Sink):
    """Append each report to a file as one line of JSON (:meth:`Report.to_dict`).

    The file is opened on the first report (parent directories created) in append mode, so
    an existing file keeps its lines. Every line is flushed to the operating system as soon
    as it is written: a crash or a killed job loses nothing already reported (``fsync`` is
    not called, so a power cut may). Read a line back with
    ``Report.from_dict(json.loads(line))``, or view the file with
    ``python -m instrument show | diff | plot``.

    Args:
        path: The file (``str`` or path-like), conventionally ``*.jsonl``.
        only_ranks: Which ranks write: "all" (the default), one rank, or a collection of ranks.

    Distributed: construct it on every rank; it calls no collective. In a single process
    ``path`` is used as is. With several ranks each rank writes its own file: a ``{rank}``
    placeholder in ``path`` is filled in, otherwise ``.rank<R>`` goes before the suffix
    (``run.jsonl`` → ``run.rank1.jsonl``), so ranks never share a file.

    :meth:`close` closes the file; a report written after it opens the file again and
    appends, so one sink may outlive a reporter or be shared by two. A file removed or
    moved while the run writes it (its directory deleted, log rotation) is created again at
    the next report, with a warning the first time (logger ``"instrument"``); a forked
    child opens the file again too.

    When the reporter closes, the run's summary (its verdict and findings, see
    docs/diagnosis.md) goes to ``summary.json`` in the same folder (``summary.rank<R>.json``
    with several ranks); ``python -m instrument summary run.jsonl`` computes the same from
    the file.

    Example:
        >>> reporter = instrument.Reporter(every=50, sinks=[instrument.sinks.JSONL("run.jsonl")])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        only_ranks: RankFilter = "all",
        ranks: RankFilter | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"JSONL needs a file path (str or os.PathLike), got {path!r}")
        text = os.fspath(path)
        if not isinstance(text, str):
            raise TypeError(f"JSONL needs a text path, got the bytes path {text!r}")
        if not text:
            raise ValueError("JSONL needs a file path, got an empty string")
        self.path = text
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.written: Path | None = None  # the file the last report went to
        self._file: TextIO | None = None
        self._lock = ForkSafeLock()
        self._told_gone = False  # the removed-file warning was logged
        _sinks.add(self)

    def write(self, report: Report) -> None:
        line = encode(report) + "\n"
        target = rank_path(self.path, report.rank, report.world_size)
        with self._lock:
            file = self._file
            if file is not None and self.written == target and not _same_file(file, target):
                self._tell_gone(target)  # removed (or its directory), or moved away
                file = None
            if file is None or self.written != target:
                file = self._open(target)
            file.write(line)
            file.flush()

    def _tell_gone(self, target: Path) -> None:
        if not self._told_gone:
            self._told_gone = True
            logger.warning(
                "instrument: JSONL file %s was removed or moved while the run wrote to it "
                "(its directory deleted?); created it again and went on writing there "
                "(reported once per sink)",
                target,
            )

    def _open(self, target: Path) -> TextIO:
        if self._file is not None:
            self._file.close()
            self._file = None
        target.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(target, "a", encoding="utf-8")  # noqa: SIM115 - kept open across writes
        self.written = target
        return self._file

    def write_summary(self, summary: RunSummary) -> None:
        """Write the run's summary as ``summary.json`` beside the file
        (``summary.rank<R>.json`` with several ranks), replacing an older one."""
        target = summary_path(self.path, summary.rank, summary.world_size)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(summary.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(partial, target)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __repr__(self) -> str:
        return f"JSONL({self.path!r})"


def _same_file(file: TextIO, target: Path) -> bool:
    """Whether ``target`` still names the open ``file`` (not removed, renamed or replaced)."""
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(target))
    except OSError:
        return False


_sinks: weakref.WeakSet[JSONL] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child opens the file again on its next report: the inherited file object
    may be locked by a thread of the parent that was writing when it forked."""
    for sink in tuple(_sinks):
        if sink._file is not None:
            inherited.append(sink._file)
            sink._file = None


os.register_at_fork(after_in_child=_after_fork_in_child)
