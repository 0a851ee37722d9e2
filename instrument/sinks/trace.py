"""ChromeTrace: the regions as a timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from instrument import observe
from instrument.report import Report
from instrument.sinks.base import RankFilter, Sink, check_rank_filter
from instrument.sinks.files import rank_and_world, rank_path


class ChromeTrace(Sink):
    """Write every region of the run as a complete ("X") trace event.

    While the sink is open, each region's enter and exit (host clock) is kept in a ring of
    the most recent ``max_events`` events (default 200,000, about 20 MB): memory stays
    bounded on any run, and what fell out of the ring is counted in the file's
    ``otherData.dropped_events``. At every report and on :meth:`close` the file is rewritten
    (atomically) with what the ring holds, so it always opens.

    Events are named by the region's own name with the full path in ``args.path``; ``pid``
    is the rank, ``tid`` the OS thread id, ``ts``/``dur`` in microseconds on the wall clock,
    so the files of several ranks line up when opened together. Regions nest as they ran.

    Args:
        path: The trace file (``.json``). With several ranks each rank writes its own: a
            ``{rank}`` placeholder is filled in, else ``.rank<R>`` goes before the suffix.
        max_events: Capacity of the ring.
        ranks: Which ranks write a file ("all" by default).

    Only host times are traced; device (CUDA event) times are in the reports. While a trace
    sink is open, regions take the generic path (1 to 2 µs more per region).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_events: int = observe.TRACE_CAPACITY,
        ranks: RankFilter = "all",
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"ChromeTrace needs a file path, got {path!r}")
        if not isinstance(max_events, int) or isinstance(max_events, bool) or max_events <= 0:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        self.path = Path(path)
        self.max_events = max_events
        self.ranks = check_rank_filter(ranks)
        self.written: Path | None = None  # the file last written
        self._rank, self._world = rank_and_world()
        # perf_counter_ns -> microseconds since the epoch
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._closed = False
        observe.start_trace(self, max_events)

    def write(self, report: Report) -> None:
        self._rank, self._world = report.rank, report.world_size
        self._save()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._save()
        finally:
            observe.stop_trace(self)

    def events(self) -> list[dict[str, Any]]:
        """The trace events the ring holds now, oldest first, with thread names."""
        ring = observe.trace
        recorded = list(ring) if ring is not None else []
        pid, offset = self._rank, self._offset_ns
        out: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"rank {pid}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": pid}},
        ]  # fmt: skip
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        for tid in sorted({event[3] for event in recorded}):
            out.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                 "args": {"name": names.get(tid, f"thread {tid}")}}
            )  # fmt: skip
        for node, t0, t1, tid in recorded:
            out.append(
                {"name": node.name, "cat": "instrument", "ph": "X", "pid": pid, "tid": tid,
                 "ts": (t0 + offset) / 1000, "dur": (t1 - t0) / 1000,
                 "args": {"path": node.path}}
            )  # fmt: skip
        return out

    def _save(self) -> None:
        if not self.wants(self._rank):
            return
        target = rank_path(self.path, self._rank, self._world)
        target.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "traceEvents": self.events(),
            "displayTimeUnit": "ms",
            "otherData": {
                "producer": "instrument",
                "rank": self._rank,
                "max_events": self.max_events,
                "dropped_events": observe.trace_dropped(),
            },
        }
        partial = target.with_name(target.name + ".partial")
        with open(partial, "w", encoding="utf-8") as file:
            json.dump(document, file, separators=(",", ":"))
        os.replace(partial, target)
        self.written = target

    def __repr__(self) -> str:
        return f"ChromeTrace({str(self.path)!r}, max_events={self.max_events})"
