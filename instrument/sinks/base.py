"""The sink interface: ``write(report)`` required, ``flush()`` / ``close()`` optional."""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Iterable
from typing import Any, TextIO, cast

from instrument.report import Report

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

    def flush(self) -> None:
        """Push buffered output out (no-op by default)."""

    def close(self) -> None:
        """Release resources (no-op by default)."""


class CallableSink(Sink):
    """Adapts a plain function ``fn(report)`` to a sink."""

    def __init__(self, fn: Callable[[Report], Any]) -> None:
        self.fn = fn

    def write(self, report: Report) -> None:
        self.fn(report)

    def __repr__(self) -> str:
        return f"CallableSink({self.fn!r})"


class _Duck(Sink):
    """Adapts an object with ``write`` (and maybe ``flush``/``close``) not derived from Sink."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.ranks = check_rank_filter(getattr(target, "ranks", "all"))

    def write(self, report: Report) -> None:
        self.target.write(report)

    def flush(self) -> None:
        if hasattr(self.target, "flush"):
            self.target.flush()

    def close(self) -> None:
        if hasattr(self.target, "close"):
            self.target.close()

    def __repr__(self) -> str:
        return repr(self.target)


def as_sink(obj: Any) -> Sink:
    """A :class:`Sink` for ``obj``: a Sink, an object with ``write(report)``, or a callable."""
    if isinstance(obj, Sink):
        return obj
    if isinstance(obj, type):
        raise TypeError(
            f"not a sink: the class {obj.__name__}; pass an instance, e.g. {obj.__name__}()"
        )
    if isinstance(obj, io.TextIOBase):  # sys.stdout, an open text file: print the tree there
        from instrument.sinks.console import Console

        return Console(cast(TextIO, obj))
    if callable(getattr(obj, "write", None)):
        return _Duck(obj)
    if callable(obj):
        return CallableSink(obj)
    raise TypeError(
        f"not a sink: {obj!r}; pass an object with write(report) or a function taking a report"
    )


def as_sinks(sinks: object) -> tuple[Sink, ...]:
    """The sinks for ``Reporter(sinks=...)``: ``None`` (none), a list (any iterable) of
    sinks, or one sink on its own (a Sink, an object with ``write(report)``, a function).
    A string is refused: it is neither (``sinks="console"`` means ``[Console()]``)."""
    if sinks is None:
        return ()
    if isinstance(sinks, str | bytes):
        raise TypeError(
            f"sinks must be a list of sinks, e.g. [instrument.sinks.Console()]; got {sinks!r}"
        )
    if isinstance(sinks, Sink | io.TextIOBase) or callable(getattr(sinks, "write", None)):
        return (as_sink(sinks),)
    if callable(sinks) and not isinstance(sinks, type):
        return (as_sink(sinks),)
    try:
        items = list(cast(Iterable[Any], sinks))
    except TypeError:
        raise TypeError(
            "sinks must be a list of sinks (objects with write(report) or functions taking "
            f"a report), e.g. [instrument.sinks.Console()]; got {sinks!r}"
        ) from None
    adapted = []
    for i, item in enumerate(items):
        try:
            adapted.append(as_sink(item))
        except TypeError as exc:
            raise TypeError(f"sinks[{i}]: {exc}") from None
    return tuple(adapted)
