"""The live view's loop: read what the run appended, draw a frame, until the run ends."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from instrument.diagnosis.summary import RunSummary
from instrument.reading import ReportFileError
from instrument.sinks.console import supports_unicode
from instrument.watch.follow import Track, watched_files
from instrument.watch.frame import frame
from instrument.watch.screen import Screen, open_screen


def watch(
    paths: Sequence[str | os.PathLike[str]],
    *,
    interval: float = 1.0,
    idle: float | None = None,
    once: bool = False,
    top: int = 8,
    plain: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Follow the run's JSONL files (``paths``: one or several ranks' files, or a plain
    name whose per-rank files are found as they appear) and redraw its live view every
    ``interval`` seconds until the run ends; returns the exit code (0).

    The run has ended when every followed file's summary (``summary.json`` beside it) is
    written for it, or — with ``idle`` — when no file got a report for ``idle`` seconds.
    ``once`` draws one frame of what is there now and returns. Ctrl-C (or SIGTERM) ends
    the view too, with the terminal restored. A path that does not exist is waited for,
    except with ``once`` (then :class:`ReportFileError`); a file that is not a report file
    raises :class:`ReportFileError` too.
    """
    out = sys.stdout if stream is None else stream
    names = [Path(os.fspath(p)) for p in paths]
    tracks: dict[Path, Track] = {}
    if once:
        for name in names:
            if not watched_files(name):
                raise ReportFileError(f"{name}: no such file")
    started = time.monotonic()
    drawn: tuple[int, int] | None = None  # what the last frame showed: lines read, tracks
    with _terminated_as_interrupt():
        screen: Screen | None = None
        try:
            while True:
                more = _update(names, tracks)
                summary = _summary(tracks.values())
                now = time.monotonic()
                quiet = _quiet_for(tracks.values(), started, now)
                ended = once or summary is not None or (idle is not None and quiet >= idle)
                if more and not once:
                    ended = False
                if screen is None:
                    screen = open_screen(out, plain=plain or once)
                lines = frame(
                    list(tracks.values()),
                    _status(names, tracks, summary, quiet, idle, once),
                    top=top,
                    unicode=supports_unicode(out),
                    summary=summary,
                )
                seen = (sum(t.tail.line for t in tracks.values()), len(tracks))
                if screen.live or ended or seen != drawn:  # a log gets new frames only
                    screen.draw(lines)
                    drawn = seen
                if ended:
                    return 0
                if not more:
                    time.sleep(interval)
        except KeyboardInterrupt:
            return 0
        finally:
            if screen is not None:
                screen.close()


def _update(names: Sequence[Path], tracks: dict[Path, Track]) -> bool:
    """Read every followed file; True when one has more lines waiting."""
    more = False
    for name in names:
        for path in watched_files(name):
            track = tracks.get(path)
            if track is None:
                track = tracks[path] = Track(path)
            more = track.update()[1] or more
    return more


def _summary(tracks: Iterable[Track]) -> RunSummary | None:
    """The run's summary once every followed file has one, merged across ranks."""
    found = list(tracks)
    if not found:
        return None
    summaries = [track.summary() for track in found]
    if any(s is None for s in summaries):
        return None
    return RunSummary.merge(s for s in summaries if s is not None)


def _quiet_for(tracks: Iterable[Track], started: float, now: float) -> float:
    """Seconds since the last report arrived in any file (since the start without one)."""
    arrived = [t.arrived for t in tracks if t.arrived is not None]
    return now - max(arrived, default=started)


def _status(
    names: Sequence[Path],
    tracks: dict[Path, Track],
    summary: RunSummary | None,
    quiet: float,
    idle: float | None,
    once: bool,
) -> str:
    if summary is not None:
        return "ended (summary written)"
    if not tracks:
        return "waiting for " + ", ".join(map(str, names))
    if all(track.last is None for track in tracks.values()):
        return "waiting for the first report"
    if once:
        return "running or stopped (no summary yet)"
    if idle is not None and quiet >= idle:
        return f"ended: no new report for {quiet:.0f} s (--idle {idle:g})"
    return f"running, last report {quiet:.0f} s ago"


@contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the view as Ctrl-C does (terminal restored, exit code 0); only in the
    main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
