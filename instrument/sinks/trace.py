"""ChromeTrace: the regions as a timeline, for Perfetto (ui.perfetto.dev) or chrome://tracing."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from instrument import clocks, observe
from instrument.lifecycle import ForkSafeLock, inherited
from instrument.rank import rank_and_world
from instrument.report import Report
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.sinks.files import rank_path

#: Synthetic thread ids of the device tracks: ``DEVICE_TID + 1000 * device + n``.
DEVICE_TID = 1 << 30

_lock = ForkSafeLock()
#: The open trace sinks, fed by _drain(); weak, so a sink dropped unclosed can be collected.
_sinks: tuple[weakref.ref[ChromeTrace], ...] = ()
_drained = 0  # events taken out of observe.trace since tracing started


def _drain() -> None:
    """Move every event out of the shared ring into each open sink's own queue.

    Events leave the ring from the left while regions append on the right (both atomic
    under the GIL), so nothing is read twice or lost, and the work is proportional to the
    events recorded since the last drain, however full the ring was allowed to get."""
    global _drained
    with _lock:
        ring = observe.trace
        if ring is None:
            return
        pop = ring.popleft
        taken = [pop() for _ in range(len(ring))]
        _drained += len(taken)
        lost = max(observe.trace_recorded - _drained - len(ring), 0)
        for ref in _sinks:
            sink = ref()
            if sink is not None:
                sink._take(taken, lost)


class ChromeTrace(Sink):
    """Write every region of the run as a complete ("X") trace event, incrementally.

    While the sink is open, each region's enter and exit (host clock) goes into a ring of
    at most ``max_events`` events (default 200,000, about 20 MB), so memory stays bounded on
    any run; what overflowed is counted in the file's ``otherData.dropped_events``. At every
    report and on :meth:`close` the events recorded *since the last write* are appended to
    the file: the cost of a write is proportional to the new events, never to the events
    already written. The file is JSON Object Format and valid JSON after every write (the
    closing ``]`` and ``otherData`` are rewritten in place after the new events).

    Events are named by the region's own name with the full path in ``args.path``; ``pid``
    is the rank, ``tid`` the OS thread id, ``ts``/``dur`` in microseconds on the wall clock,
    so the files of several ranks line up when opened together. Regions nest as they ran;
    each flush is an event too, ``(instrument flush)``, written with the next report's.

    **Device tracks.** A region on the ``"cuda"`` clock also records a pair of CUDA timing
    events of its own while a trace is open (recording never waits for the device), and
    appears a second time on a track per device and stream ("cuda:0 stream 7"), at the time
    the GPU ran it: when the sink opens it synchronizes once and records a reference event
    at a known host time, and every device event is placed at that host time plus its
    elapsed time from the reference. Device events are read at the write (waiting only for
    the events of that interval), never on the region's path.

    Args:
        path: The trace file (``.json``). With several ranks each rank writes its own: a
            ``{rank}`` placeholder is filled in, else ``.rank<R>`` goes before the suffix.
        max_events: How many events may wait between two writes (the ring's capacity).
        only_ranks: Which ranks write a file ("all" by default).

    While a trace sink is open, regions take the generic path (1 to 2 µs more per region,
    a few µs more on the "cuda" clock for the device events). Tracing ends when the sink
    is closed (its reporter's ``close()`` does it, and so does the exit flush) or, if it
    never is, when the sink is garbage-collected; events recorded after its last write are
    then lost, the file stays valid JSON. A forked child leaves its parent's trace alone:
    the sink is closed there without writing.

    Distributed: construct it on every rank that should write a file; it calls no
    collective.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_events: int = observe.TRACE_CAPACITY,
        only_ranks: RankFilter = "all",
        ranks: RankFilter | None = None,
    ) -> None:
        global _sinks, _drained
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError(f"ChromeTrace needs a file path, got {path!r}")
        if not isinstance(max_events, int) or isinstance(max_events, bool) or max_events <= 0:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        self.path = Path(path)
        self.max_events = max_events
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.written: Path | None = None  # the file last written
        self.events_written = 0  # trace events ("X") written so far
        self._rank, self._world = rank_and_world()
        # perf_counter_ns -> microseconds since the epoch
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._closed = False
        self._pending: collections.deque[observe.TraceEvent] = collections.deque(maxlen=max_events)
        self._dropped = 0  # overflowed this sink's queue
        self._lost = 0  # overflowed the shared ring
        self._file: IO[str] | None = None
        self._tail_at = 0  # where the closing "]..." starts
        self._threads: set[int] = set()
        self._tracks: dict[tuple[int, int], int] = {}  # (device, stream) -> tid
        self._names: dict[Any, str] = {}  # path node -> its event's name/cat/args JSON
        self._anchors: dict[int, tuple[Any, int]] = {}  # device -> (reference event, host ns)
        self._waiting: list[observe.TraceEvent] = []  # device events not complete yet
        with _lock:
            if observe.trace is None:  # tracing starts afresh (sinks left open by a reset)
                _sinks, _drained = (), 0
            _sinks = (*(ref for ref in _sinks if ref() is not None), weakref.ref(self))
        observe.start_trace(id(self), max_events)
        # Tracing lasts as long as the sink: close() ends it, and so does the sink's
        # collection when it was never closed (regions go back to their fast class).
        self._stop_tracing = weakref.finalize(self, observe.stop_trace, id(self))
        self._stop_tracing.atexit = False  # the exit flush closes what is live
        if clocks.cuda_ready():
            device = torch.cuda.current_device()
            self.anchor(device, *_cuda_anchor(device))

    def write(self, report: Report) -> None:
        self._rank, self._world = report.rank, report.world_size
        self._save()

    def close(self) -> None:
        global _sinks
        if self._closed:
            return
        self._closed = True
        try:
            self._save(final=True)
        finally:
            with _lock:
                _sinks = tuple(ref for ref in _sinks if ref() not in (self, None))
            self._stop_tracing()
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- events ------------------------------------------------------------------------

    def _take(self, events: list[observe.TraceEvent], lost: int) -> None:
        overflow = len(self._pending) + len(events) - self.max_events
        if overflow > 0:
            self._dropped += min(overflow, len(self._pending) + len(events))
        self._pending.extend(events)
        self._lost = lost

    @property
    def dropped_events(self) -> int:
        """Events recorded while this sink was open that never reached the file."""
        return self._dropped + self._lost

    def anchor(self, device: int, reference: Any, host_ns: int) -> None:
        """Place ``device``'s events on the host timeline: ``reference`` is a timing event
        that the device reached at host time ``host_ns`` (perf_counter ns)."""
        self._anchors[device] = (reference, host_ns)

    def _anchor_for(self, device: int) -> tuple[Any, int]:
        found = self._anchors.get(device)
        if found is None:
            found = _cuda_anchor(device)
            self._anchors[device] = found
        return found

    def events(self) -> list[dict[str, Any]]:
        """Take the events recorded since the last write as trace events (dicts), with
        the metadata of threads and device tracks seen for the first time."""
        return [json.loads(line) for line in self._format(final=True)]

    def _format(self, final: bool) -> list[str]:
        """The JSON text of every event recorded since the last call (oldest first); the
        device events not complete yet wait for the next call unless ``final``."""
        _drain()
        pending, self._pending = self._pending, collections.deque(maxlen=self.max_events)
        pid, offset = self._rank, self._offset_ns
        out: list[str] = []
        names = self._names
        device_events: list[observe.TraceEvent] = self._waiting
        self._waiting = []
        for event in pending:
            node, t0, t1, tid = event[0], event[1], event[2], event[3]
            if tid not in self._threads:
                self._threads.add(tid)
                out.append(_thread_name(pid, tid, _thread_label(tid)))
            fragment = names.get(node)
            if fragment is None:
                fragment = names[node] = _fragment(node)
            out.append(
                f'{{{fragment},"ph":"X","pid":{pid},"tid":{tid},'
                f'"ts":{(t0 + offset) / 1000:.3f},"dur":{(t1 - t0) / 1000:.3f}}}'
            )
            if len(event) > 4 and event[4] is not None:
                device_events.append(event)
        for event in device_events:
            start, end, (device, stream) = event[4]
            if not final and not _complete(end):
                self._waiting.append(event)
                continue
            reference, host_ns = self._anchor_for(device)
            end.synchronize()
            t0 = host_ns + round(reference.elapsed_time(start) * 1e6)
            t1 = host_ns + round(reference.elapsed_time(end) * 1e6)
            track = self._tracks.get((device, stream))
            if track is None:
                track = DEVICE_TID + 1000 * device + len(self._tracks)
                self._tracks[(device, stream)] = track
                out.append(_thread_name(pid, track, f"cuda:{device} stream {stream}"))
            fragment = names.get(event[0]) or _fragment(event[0])
            out.append(
                f'{{{fragment[:-1]},"clock":"device"}},"ph":"X","pid":{pid},"tid":{track},'
                f'"ts":{(t0 + offset) / 1000:.3f},"dur":{max(t1 - t0, 0) / 1000:.3f}}}'
            )
        self.events_written += len(pending) + len(device_events) - len(self._waiting)
        return out

    # -- the file ----------------------------------------------------------------------

    def _save(self, final: bool = False) -> None:
        if not self.wants(self._rank):
            self._format(final)  # keep the queue empty
            return
        lines = self._format(final)
        file = self._file
        if file is None:
            target = rank_path(self.path, self._rank, self._world)
            target.parent.mkdir(parents=True, exist_ok=True)
            file = self._file = open(target, "w", encoding="utf-8")  # noqa: SIM115
            self.written = target
            pid = self._rank
            header = [
                json.dumps({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                            "args": {"name": f"rank {pid}"}}, separators=(",", ":")),
                json.dumps({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                            "args": {"sort_index": pid}}, separators=(",", ":")),
            ]  # fmt: skip
            file.write('{"traceEvents":[\n' + ",\n".join(header))
            self._tail_at = file.tell()
        file.seek(self._tail_at)
        if lines:
            file.write(",\n" + ",\n".join(lines))
        self._tail_at = file.tell()
        other = {
            "producer": "instrument",
            "rank": self._rank,
            "max_events": self.max_events,
            "dropped_events": self.dropped_events,
        }
        file.write(
            '\n],"displayTimeUnit":"ms","otherData":' + json.dumps(other, separators=(",", ":"))
            + "}\n"
        )  # fmt: skip
        file.truncate()
        file.flush()

    def __repr__(self) -> str:
        return f"ChromeTrace({str(self.path)!r}, max_events={self.max_events})"


def _fragment(node: Any) -> str:
    """``"name":...,"cat":...,"args":{...}`` of a path node's events (JSON, escaped once)."""
    name = json.dumps(node.name)
    path = json.dumps(node.path)
    return f'"name":{name},"cat":"instrument","args":{{"path":{path}}}'


def _thread_name(pid: int, tid: int, label: str) -> str:
    return json.dumps({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": label}}, separators=(",", ":"))  # fmt: skip


def _thread_label(tid: int) -> str:
    for thread in threading.enumerate():
        if thread.native_id == tid:
            return thread.name
    return f"thread {tid}"


def _complete(event: Any) -> bool:
    query: Callable[[], bool] | None = getattr(event, "query", None)
    return True if query is None else bool(query())


def _cuda_anchor(device: int) -> tuple[Any, int]:
    """A reference event on ``device`` and the host time it completed: synchronize (once
    per device and sink: when it opens, or at the first write with that device's events),
    record, wait."""
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        reference = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        reference.record()
        host_ns = time.perf_counter_ns()
        reference.synchronize()
    return reference, host_ns


def _after_fork_in_child() -> None:
    """A forked child does not write its parent's trace files: its inherited trace sinks
    are closed there without a write (their file objects kept, never used) and tracing
    stops, so the child's regions run on their fast class."""
    global _sinks
    for ref in _sinks:
        sink = ref()
        if sink is not None:
            if sink._file is not None:
                inherited.append(sink._file)
                sink._file = None
            sink._closed = True
            sink._stop_tracing()
    _sinks = ()


os.register_at_fork(after_in_child=_after_fork_in_child)
