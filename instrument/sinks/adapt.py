"""Anything that takes a report, as a :class:`~instrument.sinks.base.Sink`: a sink as is, a
text stream as a :class:`~instrument.sinks.console.Console`, an object with
``write(report)``, or a plain function."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any, TextIO, cast

from instrument.report import Report
from instrument.sinks.base import Sink, only_ranks_option
from instrument.sinks.console import Console


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
        only = getattr(target, "only_ranks", None)
        if only is None:  # an object with the deprecated ``ranks`` (or neither)
            self.only_ranks = only_ranks_option("all", getattr(target, "ranks", None))
        else:
            self.only_ranks = only_ranks_option(only)

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
