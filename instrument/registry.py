"""Where durations land: one tree of path nodes, recorded into without locks.

With the C accelerator (``instrument._speedups``) a region's exit updates its node's
statistics in place — count, sums, min/max, histogram — in one step that the GIL makes
indivisible, so any number of threads can record into the same path at once and
``collect()`` takes whole records only.

In pure Python a region's exit appends its duration (integer ns) to the node's ``buf``
list, also atomic under the GIL; a buffer grown to ``CHUNK`` entries is folded into the
node's accumulator (under the lock, once per ``CHUNK`` calls), which bounds memory by the
number of paths. ``collect()`` swaps every buffer out under the lock and folds it. A thread
that had already read a buffer when it was swapped may still append to it: each
swapped-out buffer is kept ("retired") and its tail is read at the next swap, so a record
lands in this report or the next, never nowhere.

A region still open at a flush in the flushing thread (an ``epoch`` or ``train`` region
around the loop) is reported for its time inside the interval, marked open; the time
reported for each such call is *carried* (``_carried``), and the interval in which the call
finally closes gets its full duration minus that carry. Nothing is registered on enter:
the flush reads the open calls from the flushing context's frame stack.

Device (CUDA event) timings wait in ``pending`` until the flush resolves them in one pass.
Collectives also count the bytes they moved (``add_bytes``, off the region hot path), and a
path timed *concurrently* with its siblings — an async collective, DDP's gradient
all-reduce — is marked so that the report does not subtract it from its parent's self time;
the host intervals of those calls wait in ``spans`` and the flush unites them per parent
(how much of the parent they cover, overlaps counted once).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from instrument import _fields, clocks, overlap
from instrument._native import speedups
from instrument._warn import warn_once
from instrument.stats import Accumulator, Summary

CHUNK = 4096

#: Guards the tree's shape and the swaps of a flush. Re-entrant: a signal handler that
#: flushes may run while its thread holds it (making a path, folding a buffer) and must
#: not wait for itself; a collect inside a collect is refused instead (:func:`collect`).
_lock = threading.RLock()
#: The threads whose :func:`collect` is running.
_collecting: set[int] = set()


def held_here() -> bool:
    """True when this thread holds the registry lock (a signal handler that interrupted
    it, say): another thread waiting for the lock would wait for this one to go on."""
    return bool(_lock._is_owned())  # type: ignore[attr-defined]


class _PyNodeBase:
    """Statistics of one path in pure Python: a buffer of ns durations plus an accumulator.

    The C accelerator's ``NodeBase`` has the same fields and methods, and updates the
    statistics in place (one indivisible step under the GIL, no buffer).
    """

    __slots__ = (
        "acc",
        "buf",
        "children",
        "idle",
        "level",
        "mode",
        "name",
        "parent",
        "path",
        "retired",
        "retired_len",
    )

    name: str
    path: str
    parent: PathNode | None
    children: dict[str, PathNode]
    level: int
    mode: str
    idle: int  # flushes in a row without a record

    def __init__(self) -> None:
        self.idle = 0
        self.buf: list[int] = []
        self.acc = Accumulator()
        self.retired: list[int] | None = None
        self.retired_len = 0

    def add(self, duration_ns: int) -> None:
        """Record one duration (ns)."""
        buf = self.buf
        buf.append(duration_ns)
        if len(buf) >= CHUNK:
            fold(self)

    def take(self) -> Summary | None:
        """The :data:`~instrument.stats.Summary` of what was recorded since the last take,
        and reset; ``None`` if nothing was recorded. The caller holds ``_lock``."""
        _drain(self)
        if not self.acc.count:
            return None
        summary = self.acc.summary()
        self.acc = Accumulator()
        return summary

    def drain_into(self, readers: list[Any] | tuple[Any, ...]) -> tuple[int, int] | None:
        """Add what was recorded since the last take to each node of ``readers`` (a list or
        tuple of other nodes) and reset; ``(count, total ns)`` of it, or ``None``. The caller
        holds ``_lock``."""
        if not isinstance(readers, (list, tuple)):
            raise TypeError(
                f"drain_into: readers must be a list or tuple of path nodes, got {readers!r}"
            )
        for reader in readers:
            if not isinstance(reader, _PyNodeBase) or reader is self:
                raise TypeError(
                    f"drain_into: each reader must be another path node, got {reader!r}"
                )
        _drain(self)
        acc = self.acc
        if not acc.count:
            return None
        for reader in readers:
            reader.acc.merge(acc)
        self.acc = Accumulator()
        return acc.count, acc.total

    def clear_stats(self) -> None:
        """Forget what was recorded."""
        self.buf = []
        self.acc = Accumulator()
        self.retired = None
        self.retired_len = 0

    def has_records(self) -> bool:
        """True if anything was recorded since the last take."""
        return bool(self.buf) or self.acc.count > 0

    if not TYPE_CHECKING:  # the C NodeBase's typed fields (instrument/_fields.py)

        def __setattr__(self, name: str, value: Any) -> None:
            _fields.check("path node", _fields.NODE, name, value, _PyNodeBase)
            object.__setattr__(self, name, value)

        def __delattr__(self, name: str) -> None:
            _fields.check_delete("path node", _fields.NODE, name)
            object.__delattr__(self, name)


if TYPE_CHECKING or speedups is None:  # noqa: SIM108 - mypy needs the plain class here
    NodeBase = _PyNodeBase
else:
    NodeBase = speedups.NodeBase


#: Bounds on the tree (``instrument.configure(max_depth=..., max_paths=...)``): a path
#: deeper than ``max_depth`` regions, or a new path beyond ``max_paths`` live ones, is
#: counted in the one ``(overflow)`` path instead (warned once per cap).
MAX_DEPTH = 64
MAX_PATHS = 10_000
max_depth = MAX_DEPTH
max_paths = MAX_PATHS

#: A path with no record in this many consecutive flushes is released (its memory freed;
#: it comes back, empty, when it is entered again) unless something still holds it: an
#: open region, a hook's cached node, a pending device event.
idle_flushes = 8

OVERFLOW = "(overflow)"


class PathNode(NodeBase):
    """One path of the timing tree ("step/forward"), shared by every thread."""

    __slots__ = ("depth",)
    depth: int  # regions from the root (top-level paths: 1)

    def __init__(self, name: str, parent: PathNode | None, level: int = 0) -> None:
        super().__init__()
        self.name = name
        self.parent = parent
        self.path = f"{parent.path}/{name}" if parent is not None and parent.path else name
        self.level = level
        self.mode = "cpu"
        self.children = {}
        self.depth = 0 if parent is None else parent.depth + 1

    def child(self, name: str, level: int, mode: str) -> PathNode:
        """The child called ``name``, created on first use (the only locked step of a region);
        the ``(overflow)`` path beyond the caps (and below it)."""
        global _live_paths
        with _lock:
            node = self.children.get(name)
            if node is None:
                if self.name == OVERFLOW and self.parent is ROOT:
                    return self
                if self.depth >= max_depth or _live_paths >= max_paths:
                    return _overflow(self.depth >= max_depth)
                node = PathNode(name, self, level)
                node.mode = mode
                self.children[name] = node
                _live_paths += 1
                if self is ROOT and threading.get_ident() != stepping_ident():
                    concurrent.add(node)  # another thread's work overlaps the steps
            elif mode != "cpu":
                node.mode = mode
            return node

    def __repr__(self) -> str:
        return f"<PathNode {self.path!r}>"


ROOT = PathNode("", None)

#: Paths in the tree (every node but the root); only changed under ``_lock``.
_live_paths = 0


def _overflow(too_deep: bool) -> PathNode:
    """The ``(overflow)`` top-level path, created on first use; warns once per cap. The
    caller holds ``_lock``."""
    global _live_paths
    cap, value = ("max_depth", max_depth) if too_deep else ("max_paths", max_paths)
    what = f"deeper than {value} regions" if too_deep else f"beyond {value} distinct paths"
    warn_once(
        f"registry:{cap}",
        f"instrument: region paths {what} are counted in the one path {OVERFLOW!r} "
        f"(a generator that keeps a region open across yield, deep recursion, or names "
        f"made per call?); raise the cap with instrument.configure({cap}=...)",
        stacklevel=5,
    )
    node = ROOT.children.get(OVERFLOW)
    if node is None:
        node = ROOT.children[OVERFLOW] = PathNode(OVERFLOW, ROOT, 0)
        _live_paths += 1
    return node


#: Bytes moved per path since the last collect (collectives); written under ``_lock``.
_bytes: dict[PathNode, int] = {}

#: Paths whose time overlaps their siblings' (async work timed until it completes, and the
#: top-level regions of threads other than the one that ends the steps).
concurrent: set[PathNode] = set()

#: The thread that last ended a step (``Reporter.step``); None: the main thread.
stepping_thread: int | None = None


def stepping_ident() -> int | None:
    """The thread that ends the steps: the last one that did, else the main thread."""
    return stepping_thread if stepping_thread is not None else threading.main_thread().ident


def steps_own(name: str) -> PathNode:
    """The top-level path ``name`` as the steps' own (never concurrent), made if missing —
    also when another thread asks for it (autograd's, for ``backward``)."""
    node = ROOT.children.get(name)
    if node is None:
        node = ROOT.child(name, 0, "cpu")
        concurrent.discard(node)
    return node


def add_bytes(node: PathNode, nbytes: int) -> None:
    """Count ``nbytes`` moved by one call of ``node`` (a collective; not the region hot path)."""
    with _lock:
        _bytes[node] = _bytes.get(node, 0) + nbytes


def mark_concurrent(node: PathNode) -> None:
    """Say that ``node``'s time overlaps its siblings' (it is not part of the parent's self)."""
    concurrent.add(node)


#: Pending pairs that make the list look for completed ones (see :class:`_Pending`).
PENDING_BOUND = 4096


class _Pending(list[tuple[PathNode, Any, Any, int]]):
    """The pending device event pairs: a list that, past ``bound`` pairs, folds those that
    have completed, so it stays bounded by how far the device lags, flush or no flush."""

    bound = PENDING_BOUND

    def append(self, item: tuple[PathNode, Any, Any, int]) -> None:
        super().append(item)
        if len(self) >= self.bound:
            _fold_completed()


#: (node, start event, end event, device index) for device-clock regions, resolved at flush.
pending: _Pending = _Pending()
_pending_retired: list[tuple[PathNode, Any, Any, int]] | None = None
_pending_retired_len = 0


#: Ended spans that make the list unite its intervals (see :class:`_Spans`).
SPANS_BOUND = 4096

#: One ended concurrent call: (its parent's node, start ns, end ns) on the host clock.
Interval = tuple[PathNode, int, int]


class _Spans(list[Interval]):
    """The intervals of concurrent calls that ended since the last flush: a list that, past
    ``bound`` entries, unites them per parent into :data:`_united` (a union of unions is the
    union: nothing is lost), so it stays bounded between flushes. Appended to from any
    thread (one ``append``, atomic under the GIL); swapped out at the flush."""

    bound = SPANS_BOUND

    def append(self, item: Interval) -> None:
        super().append(item)
        if len(self) >= self.bound:
            _unite_spans()


#: Intervals of the concurrent calls (:class:`~instrument.regions.span.Span`) ended since
#: the last flush or the last time the list was united.
spans: _Spans = _Spans()
_spans_retired: list[Interval] | None = None
_spans_retired_len = 0

#: Per parent, the union of the intervals united since the last flush.
_united: dict[PathNode, overlap.Union] = {}


def _swap_spans() -> list[Interval]:
    """Take every ended span's interval, including those appended to the list swapped out
    last time by a thread that had already read it. The caller holds ``_lock``."""
    global spans, _spans_retired, _spans_retired_len
    ended = spans
    retired, seen = _spans_retired, _spans_retired_len
    if not ended and (retired is None or len(retired) <= seen):
        return []
    spans = _Spans()
    late = retired[seen:] if retired is not None and len(retired) > seen else []
    batch = late + ended[:]
    _spans_retired, _spans_retired_len = ended, len(batch) - len(late)
    return batch


def _unite(batch: list[Interval], into: dict[PathNode, overlap.Union]) -> None:
    """Add ``batch``'s intervals to their parents' unions in ``into``."""
    by_parent: dict[PathNode, list[tuple[int, int]]] = {}
    for parent, start, end in batch:
        by_parent.setdefault(parent, []).append((start, end))
    for parent, intervals in by_parent.items():
        union = into.get(parent)
        if union is None:
            union = into[parent] = overlap.Union()
        union.add(intervals)


def _unite_spans() -> None:
    """Unite the ended spans' intervals per parent (the list grew past its bound)."""
    with _lock:
        _unite(_swap_spans(), _united)


def _drain(node: _PyNodeBase) -> None:
    """Move ``node.buf`` (and a late tail of the buffer retired before it) into ``node.acc``.

    The caller holds ``_lock``.
    """
    buf = node.buf
    node.buf = []
    retired = node.retired
    if retired is not None and len(retired) > node.retired_len:
        node.acc.add_batch(retired[node.retired_len :])
    snapshot = buf[:]
    node.acc.add_batch(snapshot)
    node.retired = buf
    node.retired_len = len(snapshot)


def fold(node: _PyNodeBase) -> None:
    """Fold a full buffer (called from the hot path once per ``CHUNK`` records)."""
    with _lock:
        if len(node.buf) >= CHUNK:
            _drain(node)


def walk(node: PathNode = ROOT) -> Iterator[PathNode]:
    """Every node below ``node``, parents before children, in creation order."""
    stack = list(reversed(tuple(node.children.values())))
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(tuple(current.children.values())))


class Host(NamedTuple):
    """The host (enter → exit) figures of the rows of a :class:`Collected`: ``counts[i]``
    finished calls (0: the row is there for its device time or an open call only),
    ``totals[i]`` their exact total in ns, and ``figures[7 * i : 7 * i + 7]`` their mean,
    min, max, std, p50, p90 and p99 in seconds."""

    counts: list[int]
    totals: list[int]
    figures: array[float]

    def summary(self, row: int) -> Summary | None:
        """Row ``row`` as a :data:`~instrument.stats.Summary` (``None``: no finished call)."""
        count = self.counts[row]
        if not count:
            return None
        f, at = self.figures, 7 * row
        return (
            count,
            self.totals[row],
            f[at],
            f[at + 1],
            f[at + 2],
            f[at + 3],
            f[at + 4],
            f[at + 5],
            f[at + 6],
        )


#: Below this many sparse keys :meth:`Collected.rows_of` searches the node list; above it,
#: it indexes it once.
_FEW = 8


class Collected:
    """What every path recorded in one interval, as columns: row ``i`` is the path
    ``nodes[i]`` (``paths[i]``, clock mode ``modes[i]``), in tree order (parents first,
    siblings by creation), with its host figures in ``host`` and ``links[3 * i : 3 * i + 3]``
    = the row of its parent (-1: none), its level, and the highest level on its path.
    A path is a row if it recorded something, has device time, or has a call open at the
    flush. ``regions`` is the number of region calls that ended in the interval.

    The rest is sparse, by node: ``device`` (device-clock durations), ``bytes`` (moved by
    collectives), ``adjust_ns`` (added to the path's total, host and device: the time inside
    this interval of its calls still open at the flush, minus the time already reported for
    calls that were open at an earlier flush and closed in this one), ``open`` (a call
    of the path was still open at the flush) and ``covered_ns`` (the host time that the
    concurrent calls below the path that ended in the interval cover, overlaps counted
    once).
    """

    __slots__ = (
        "adjust_ns",
        "bytes",
        "covered_ns",
        "device",
        "host",
        "links",
        "modes",
        "nodes",
        "open",
        "paths",
        "regions",
    )

    def __init__(
        self,
        nodes: list[PathNode],
        paths: list[str],
        modes: list[str],
        host: Host,
        links: array[int],
        regions: int,
    ) -> None:
        self.nodes = nodes
        self.paths = paths
        self.modes = modes
        self.host = host
        self.links = links
        self.regions = regions
        self.device: dict[PathNode, Accumulator] = {}
        self.bytes: dict[PathNode, int] = {}
        self.adjust_ns: dict[PathNode, int] = {}
        self.open: set[PathNode] = set()
        self.covered_ns: dict[PathNode, int] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def calls(self) -> Iterator[tuple[PathNode, int]]:
        """``(node, calls ended in the interval)`` for every row."""
        return zip(self.nodes, self.host.counts, strict=True)

    def rows_of(self, keys: Iterable[PathNode]) -> dict[PathNode, int]:
        """The row of each of ``keys`` that is one."""
        keys = list(keys)
        nodes = self.nodes
        if len(keys) > _FEW:
            index = dict(zip(nodes, range(len(nodes)), strict=True))
            return {key: index[key] for key in keys if key in index}
        found: dict[PathNode, int] = {}
        for key in keys:
            try:
                found[key] = nodes.index(key)
            except ValueError:
                continue
        return found


#: One call open at a flush: (path node, start ns, the flush's time on the region's clock).
OpenCall = tuple[PathNode, int, int]

#: Host time (ns) already reported for calls open at an earlier flush, by
#: (token of the flushing thread, node, start ns). Only touched by collect() and clear().
_carried: dict[tuple[object, PathNode, int], int] = {}

_thread_token = threading.local()


def _flusher_token() -> object:
    """An object standing for the calling thread for as long as anything refers to it: unlike
    ``threading.get_ident()``, never handed on to a thread started after this one ended."""
    token = getattr(_thread_token, "token", None)
    if token is None:
        token = _thread_token.token = object()
    return token


#: (node, start ns) of calls closed from another thread or task while their frame stays on
#: the stack of the context that opened them (a manual timer stopped elsewhere): not open.
_closed_elsewhere: set[tuple[PathNode, int]] = set()


def closed_elsewhere(node: PathNode, t0: int) -> None:
    """Say that the call of ``node`` started at ``t0`` ended, although its frame stays on the
    stack of the context that opened it (so flushes there never report it as open)."""
    _closed_elsewhere.add((node, t0))


def open_calls(top: Any) -> list[OpenCall]:
    """The calls open in a context, innermost first, from its top frame
    ``(node, t0, parent_frame, owner, event)`` (``instrument.regions.frames``' stack), each
    with the current time of its region's clock. Frames that time nothing (an anchor that
    only sets a parent path) and calls already closed elsewhere are left out."""
    out: list[OpenCall] = []
    frame = top
    while frame is not None and frame.parent is not None:  # the root frame has no parent
        now = getattr(frame.owner, "_now", None)
        if now is not None and (frame.node, frame.t0) not in _closed_elsewhere:
            out.append((frame.node, frame.t0, now()))
        frame = frame.parent
    return out


def _split_open(
    open_now: list[OpenCall], recorded: Callable[[list[PathNode]], dict[PathNode, int]]
) -> dict[PathNode, int]:
    """Per node: ns to add to this interval's total for calls open now or closed since an
    earlier flush (see :class:`Collected`); ``recorded(nodes)`` gives the total ns that those
    of ``nodes`` with a finished call recorded in this interval."""
    global _carried
    if not open_now and not _carried:
        return {}  # nothing open now or at an earlier flush
    thread = _flusher_token()
    adjust: dict[PathNode, int] = {}
    carried: dict[tuple[object, PathNode, int], int] = {}
    for node, t0, now in open_now:
        key = (thread, node, t0)
        span = max(now - t0, 0)
        reported = _carried.pop(key, 0)
        adjust[node] = adjust.get(node, 0) + max(span - reported, 0)
        carried[key] = max(span, reported)
    closed = [key[1] for key in _carried if key[0] == thread]
    totals = recorded(closed) if closed else {}
    for key, reported in _carried.items():
        if key[0] is not thread:  # open in a context this flush cannot see: keep for later
            carried[key] = reported
            continue
        node = key[1]  # closed since: its record holds the full duration
        total = totals.get(node)
        if total is not None:  # (none: abandoned, nothing recorded)
            adjust[node] = adjust.get(node, 0) - min(reported, total)
    _carried = carried
    return adjust


def _recorded_rows(collected: Collected) -> Callable[[list[PathNode]], dict[PathNode, int]]:
    """:func:`_split_open`'s ``recorded`` from a :class:`Collected`'s rows."""

    def recorded(nodes: list[PathNode]) -> dict[PathNode, int]:
        counts, totals = collected.host.counts, collected.host.totals
        return {node: totals[row] for node, row in collected.rows_of(nodes).items() if counts[row]}

    return recorded


#: ``(nodes, paths, modes, counts, totals, figures, links, regions, released)``: what
#: :func:`_take_tree` returns (``figures`` and ``links`` as the bytes of arrays of doubles and
#: of int64).
TakenTree = tuple[list[Any], list[str], list[str], list[int], list[int], bytes, bytes, int, int]


#: Whether reference counts tell what holds a path (not on PyPy): idle paths are released.
_REFCOUNTS = hasattr(sys, "getrefcount")


class Reader:
    """One reader of the registry (a reporter), each with its own intervals: what it has
    not reported yet of what other readers' flushes took while it was live. Made by
    :func:`add_reader` and held weakly here, so a reader that is dropped stops reading.

    With one reader the registry's nodes are its backlog and nothing is copied. With more,
    each flush adds every record since the previous flush (of any reader) to every
    reader's backlog — node statistics merged whole (count, sums, min/max, histogram), so
    each report's figures are those of every record of its interval — and reports its own.
    """

    __slots__ = ("__weakref__", "adjust_ns", "bytes", "covered_ns", "device", "stats")

    def __init__(self) -> None:
        self.stats: dict[PathNode, NodeBase] = {}
        self.device: dict[PathNode, Accumulator] = {}
        self.bytes: dict[PathNode, int] = {}
        self.adjust_ns: dict[PathNode, int] = {}
        self.covered_ns: dict[PathNode, int] = {}

    def holds_records(self) -> bool:
        """True when something waits here to be reported."""
        if self.device or self.bytes or self.adjust_ns or self.covered_ns:
            return True
        return bool(self.stats) and any(node.has_records() for node in self.stats.values())

    def _add(self, delta: _Sparse) -> None:
        """Add an interval's device times, bytes and time adjustments. Under ``_lock``."""
        for node, acc in delta.device.items():
            mine = self.device.get(node)
            if mine is None:
                mine = self.device[node] = Accumulator()
            mine.merge(acc)
        for into, values in (
            (self.bytes, delta.bytes),
            (self.adjust_ns, delta.adjust_ns),
            (self.covered_ns, delta.covered_ns),
        ):
            for node, value in values.items():
                into[node] = into.get(node, 0) + value

    def _take_sparse(self) -> _Sparse:
        """What waits here besides the node statistics, and reset. Under ``_lock``."""
        out = _Sparse(self.device, self.bytes, self.adjust_ns, self.covered_ns)
        self.device, self.bytes, self.adjust_ns, self.covered_ns = {}, {}, {}, {}
        return out


class _Sparse(NamedTuple):
    """An interval's figures kept by node besides the statistics (see :class:`Collected`)."""

    device: dict[PathNode, Accumulator]
    bytes: dict[PathNode, int]
    adjust_ns: dict[PathNode, int]
    covered_ns: dict[PathNode, int]


#: The live readers by ``id``, weakly held: a dropped reporter stops reading (its entry goes
#: with it). Not a ``WeakSet``: iterating one runs ~20 µs of cold Python at each flush.
_readers: dict[int, weakref.ref[Reader]] = {}


def _live_readers(but: Reader | None = None) -> list[Reader]:
    """The readers still live but ``but`` (from a copy of the references: a reader collected
    meanwhile takes its entry out of ``_readers``)."""
    found: list[Reader] = []
    for ref in tuple(_readers.values()):  # (a loop: each flush runs it, its code cold)
        reader = ref()
        if reader is not None and reader is not but:
            found.append(reader)
    return found


def _forget(key: int) -> Callable[[weakref.ref[Reader]], None]:
    def forget(_: weakref.ref[Reader]) -> None:
        _readers.pop(key, None)

    return forget


def add_reader(open_now: list[OpenCall] | None = None) -> Reader:
    """A new reader of every record from now on. The readers already live keep what was
    recorded before it (the first reader of all also reports what came before it);
    ``open_now``: the calls open in the calling context, split here likewise."""
    reader = Reader()
    with _lock:
        if _readers:
            ident = threading.get_ident()
            if ident in _collecting:
                raise RuntimeError("instrument: a reader cannot be added during a flush")
            _collecting.add(ident)
            try:
                _collect(open_now or [], None)
            finally:
                _collecting.discard(ident)
        _readers[id(reader)] = weakref.ref(reader, _forget(id(reader)))
    return reader


def remove_reader(reader: Reader) -> None:
    """``reader`` stops reading (a closed reporter); what it had not reported is dropped."""
    with _lock:
        _readers.pop(id(reader), None)
        reader.stats.clear()
        reader._take_sparse()


def readers() -> int:
    """How many readers are live."""
    return len(_readers)


def unread(reader: Reader | None) -> bool:
    """True when something recorded waits for ``reader`` (or for the registry's next flush)."""
    with _lock:
        if reader is not None and reader.holds_records():
            return True
    return any(node.has_records() for node in walk())


def collect(open_now: list[OpenCall] | None = None, reader: Reader | None = None) -> Collected:
    """Snapshot and reset every path; resolve pending device events; split the calls in
    ``open_now`` (:func:`open_calls` of the flushing context) at this flush; release the
    paths idle for :data:`idle_flushes` flushes. With ``reader``, its interval: what other
    readers' flushes took for it since its last one too. With other readers live, what
    they have not reported stays theirs (``reader=None``: taken for them only)."""
    ident = threading.get_ident()
    with _lock:
        if ident in _collecting:  # a signal handler's flush inside this thread's flush
            raise RuntimeError(
                "instrument: a flush started inside another flush of this thread (from a "
                "signal handler); it is skipped, the flush it interrupted goes on"
            )
        _collecting.add(ident)
    try:
        return _collect(open_now or [], reader)
    finally:
        _collecting.discard(ident)


def _collect(open_now: list[OpenCall], reader: Reader | None) -> Collected:
    """:func:`collect`'s work."""
    global _bytes, _early, _live_paths, _united
    opened = {call[0] for call in open_now} if open_now else set()
    with _lock:
        moved, _bytes = _bytes, {}
        batch = _swap_pending()
        early, _early = _early, {}
        ended = _swap_spans()  # (before the walk: an interval here has its duration there)
        united, _united = _united, {}
        others = _live_readers(but=reader)
        shared = bool(others) or (reader is not None and reader.holds_records())
        keep = opened.union([item[0] for item in batch], early) if batch or early else opened
        limit = idle_flushes if _REFCOUNTS else sys.maxsize
        source: dict[PathNode, NodeBase] | None = None
        if shared:  # every record goes to every reader; this one reports its own
            everyone = others if reader is None else [*others, reader]
            drained = _drain_to(everyone)
            adjust = _split_open(open_now, lambda nodes: _totals(drained, nodes))
            if reader is not None:
                source, reader.stats = reader.stats, {}
                keep = keep.union(reader.device, reader.adjust_ns, reader.bytes)
            else:
                source = {}
        if reader is None and shared:
            collected = _empty()
        else:
            nodes, paths, modes, counts, totals, fig, lnk, regions, released = take_tree(
                ROOT, limit, keep or None, concurrent, source
            )
            _live_paths -= released
            figures, links = array("d", fig), array("q", lnk)  # (from bytes: frombytes)
            host = tuple.__new__(Host, (counts, totals, figures))  # (not NamedTuple's __new__)
            collected = Collected(nodes, paths, modes, host, links, regions)
        if not shared:
            adjust = _split_open(open_now, _recorded_rows(collected))
    delta = _Sparse(_resolve(batch, early), moved, adjust, {})
    if ended or united:
        _unite(ended, united)
        delta.covered_ns.update((node, union.length()) for node, union in united.items())
    if shared:
        with _lock:
            for other in others:
                other._add(delta)
            if reader is not None:
                reader._add(delta)
                delta = reader._take_sparse()
    collected.device, collected.bytes = delta.device, delta.bytes
    collected.adjust_ns, collected.covered_ns = delta.adjust_ns, delta.covered_ns
    collected.open = opened
    return collected


def _drain_to(readers: list[Reader]) -> dict[PathNode, tuple[int, int]]:
    """Add every path's records since the last take to each of ``readers``' statistics and
    reset it; ``(count, total ns)`` of each path drained. Under ``_lock``."""
    drained: dict[PathNode, tuple[int, int]] = {}
    for node in walk():
        if not node.has_records():
            continue
        holders = []
        for reader in readers:
            holder = reader.stats.get(node)
            if holder is None:
                holder = reader.stats[node] = NodeBase()
            holders.append(holder)
        taken = node.drain_into(holders)
        if taken is not None:
            drained[node] = taken
    return drained


def _totals(drained: dict[PathNode, tuple[int, int]], nodes: list[PathNode]) -> dict[PathNode, int]:
    """The total ns drained of each of ``nodes`` that had a finished call."""
    return {node: drained[node][1] for node in nodes if node in drained}


def _empty() -> Collected:
    """A :class:`Collected` without rows."""
    host = tuple.__new__(Host, ([], [], array("d")))
    return Collected([], [], [], host, array("q"), 0)


def forget_idle_paths() -> None:
    """Release every path that nothing holds and nothing recorded in (``testing.reset``,
    after :func:`clear`): the paths start again from those a fresh import knows, and so
    does their order of first appearance."""
    global _live_paths
    if not _REFCOUNTS:
        return
    with _lock:
        released = take_tree(ROOT, 0, None, concurrent, None)[-1]
        _live_paths -= released


def _take_tree(
    root: PathNode,
    idle_limit: int,
    keep: AbstractSet[PathNode] | None,
    concurrent: set[Any] | None,
    source: dict[PathNode, Any] | None = None,
) -> TakenTree:
    """Take every path's interval figures in one walk (``_speedups.take_tree`` is the same
    in C): each node below ``root`` with records, or in ``keep``, becomes a row (tree order:
    parents first, siblings by creation); the others count one more idle flush, and the
    leaves idle for ``idle_limit`` flushes that nothing else holds (no open frame, cached
    anchor or pending event: their reference count says so) are released, children before
    parents (and left ``concurrent``). With ``source`` (a reader's statistics, by node) the
    figures are taken from ``source[node]`` instead of the node. The caller holds ``_lock``."""
    if source is not None and not isinstance(source, dict):
        raise TypeError(f"take_tree: source must be a dict or None, got {source!r}")
    for held in () if source is None else source.values():
        if not isinstance(held, NodeBase):
            raise TypeError(f"take_tree: source values must be path nodes, got {held!r}")
    walked = _walk_tree(root)
    taken = _take_rows(walked, keep, source)
    released = _release_idle(walked, idle_limit, concurrent)
    return (*taken, released)


#: Deeper than this, a tree is a cycle (a node among its own descendants).
MAX_WALK_DEPTH = 1 << 16


def _walk_tree(root: PathNode) -> list[tuple[PathNode, int, int]]:
    """``(node, walk index of its parent or -1, highest level on its path)`` for every node
    below ``root``, parents first, siblings by creation."""
    walked: list[tuple[PathNode, int, int]] = []
    stack: list[tuple[Any, Any, int, int]] = [
        (key, child, -1, 1) for key, child in reversed(tuple(root.children.items()))
    ]
    while stack:
        key, node, parent, depth = stack.pop()
        if not isinstance(node, NodeBase):
            raise TypeError(
                f"take_tree: a path node's children must be path nodes, got {node!r} under "
                f"the key {key!r}"
            )
        reach = node.level if parent < 0 else max(node.level, walked[parent][2])
        index = len(walked)
        walked.append((cast(PathNode, node), parent, reach))
        if node.children and depth >= MAX_WALK_DEPTH:
            raise ValueError(
                f"take_tree: the path tree is deeper than {MAX_WALK_DEPTH} nodes below "
                f"{key!r} (a node among its own children?)"
            )
        stack.extend((k, c, index, depth + 1) for k, c in reversed(tuple(node.children.items())))
    return walked


def _take_rows(
    walked: list[tuple[PathNode, int, int]],
    keep: AbstractSet[PathNode] | None,
    source: dict[PathNode, Any] | None,
) -> tuple[list[Any], list[str], list[str], list[int], list[int], bytes, bytes, int]:
    """Take each walked node's figures (counting idle flushes) into the columns of
    :data:`TakenTree`, but ``released``."""
    summaries: list[Summary | None] = []
    for node, _, _ in walked:
        held = node if source is None else source.get(node)
        summary = None if held is None else held.take()
        if summary is not None or (held is not node and node.has_records()):
            node.idle = 0  # (records since its own went to the readers: not idle either)
        else:
            node.idle += 1
        summaries.append(summary)
    rows = [-1] * len(walked)
    nodes: list[Any] = []
    paths: list[str] = []
    modes: list[str] = []
    counts: list[int] = []
    totals: list[int] = []
    figures, links = array("d"), array("q")
    for k, (node, parent, reach) in enumerate(walked):
        summary = summaries[k]
        if summary is None and (keep is None or node not in keep):
            continue
        rows[k] = len(nodes)
        nodes.append(node)
        paths.append(node.path)
        modes.append(node.mode)
        if summary is None:
            counts.append(0)
            totals.append(0)
            figures.extend((0.0,) * 7)
        else:
            counts.append(summary[0])
            totals.append(summary[1])
            figures.extend(summary[2:])
        links.extend((-1 if parent < 0 else rows[parent], node.level, reach))
    return nodes, paths, modes, counts, totals, figures.tobytes(), links.tobytes(), sum(counts)


def _release_idle(
    walked: list[tuple[PathNode, int, int]], idle_limit: int, concurrent: set[Any] | None
) -> int:
    """Drop the leaves idle for ``idle_limit`` flushes that nothing else holds, children
    before parents; return how many. The caller holds ``_lock``."""
    if not _REFCOUNTS:  # no reference counts to tell: keep every path
        return 0
    # References to a free leaf: its parent's ``children``, its ``walked`` entry, the loop
    # variable, getrefcount's argument, and the ``parent`` of each child released here
    # (and the key counting them).
    released: dict[PathNode, int] = {}
    count = 0
    for node, _, _ in reversed(walked):
        if node.idle < idle_limit or node.children:
            continue
        in_concurrent = concurrent is not None and node in concurrent
        kids = released.get(node, 0)
        held = 4 + in_concurrent + kids + (kids > 0)
        if sys.getrefcount(node) > held:
            continue
        if node.parent is None:  # (no local for the parent: it would hold it)
            continue
        siblings = node.parent.children
        if siblings.get(node.name) is not node:
            continue
        del siblings[node.name]
        # Another thread may have reached it (and recorded) since the checks above; once
        # out of the tree nothing can reach it any more, so look again and keep it if so.
        if node.has_records() or sys.getrefcount(node) > held - 1:  # (no dict ref now)
            siblings[node.name] = node
            continue
        if in_concurrent and concurrent is not None:
            concurrent.discard(node)
        released[node.parent] = released.get(node.parent, 0) + 1
        count += 1
    return count


take_tree: Callable[
    [PathNode, int, AbstractSet[PathNode] | None, set[Any] | None, dict[PathNode, Any] | None],
    TakenTree,
]
take_tree = _take_tree if speedups is None else speedups.take_tree


def live_paths() -> int:
    """How many paths the tree holds now."""
    return _live_paths


def _swap_pending() -> list[tuple[PathNode, Any, Any, int]]:
    """Take every pending device event pair, including those appended to the list swapped
    out last time by a thread that had already read it. The caller holds ``_lock``."""
    global pending, _pending_retired, _pending_retired_len
    events = pending
    if not events and (_pending_retired is None or len(_pending_retired) <= _pending_retired_len):
        return []  # nothing to take: the empty list stays (appends to it come next time)
    pending = _Pending()
    late: list[tuple[PathNode, Any, Any, int]] = []
    if _pending_retired is not None and len(_pending_retired) > _pending_retired_len:
        late = _pending_retired[_pending_retired_len:]
    batch = late + events[:]
    _pending_retired, _pending_retired_len = events, len(batch) - len(late)
    return batch


def _resolve(
    batch: list[tuple[PathNode, Any, Any, int]], early: dict[PathNode, Accumulator]
) -> dict[PathNode, Accumulator]:
    """Device durations per node: the pairs folded ``early`` (:func:`_fold_completed`) and
    those of ``batch``, waiting only for these events."""
    out = early
    if not batch:
        return out
    durations: dict[PathNode, list[int]] = {}
    for node, start, end, device in batch:
        ms = clocks.pair_ms((start, end, device))
        durations.setdefault(node, []).append(round(ms * 1e6))
    for node, values in durations.items():
        out.setdefault(node, Accumulator()).add_batch(values)
    return out


#: Device durations of the pairs that had completed when the pending list last grew past
#: its bound, per node, until the next flush.
_early: dict[PathNode, Accumulator] = {}


def _fold_completed() -> None:
    """Fold the pending pairs whose end event has completed (``Event.query()``, which never
    waits) into :data:`_early`; keep the others pending."""
    with _lock:
        batch = _swap_pending()
        done: dict[PathNode, list[int]] = {}
        waiting: list[tuple[PathNode, Any, Any, int]] = []
        for item in batch:
            node, start, end, device = item
            if end.query():
                ms = clocks.pair_ms((start, end, device))
                done.setdefault(node, []).append(round(ms * 1e6))
            else:
                waiting.append(item)
        for node, values in done.items():
            _early.setdefault(node, Accumulator()).add_batch(values)
        pending.extend(waiting)
        # the device is far behind: look again once the list has doubled, not at every pair
        pending.bound = max(PENDING_BOUND, 2 * len(waiting))


def clear() -> None:
    """Forget everything recorded (paths stay known)."""
    global pending, _pending_retired, _pending_retired_len, _bytes, _early
    global spans, _spans_retired, _spans_retired_len, _united
    with _lock:
        for node in walk():
            node.clear_stats()
        pending = _Pending()
        _bytes = {}
        _early = {}
        _pending_retired, _pending_retired_len = None, 0
        spans, _spans_retired, _spans_retired_len, _united = _Spans(), None, 0, {}
        _carried.clear()
        for reader in _live_readers():
            reader.stats.clear()
            reader._take_sparse()


#: CUDA objects a forked child inherited: kept, never destroyed there (destroying a CUDA
#: event in a forked child aborts the process), and never used.
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, say) starts with nothing recorded."""
    global _lock, _collecting, _readers
    _lock = threading.RLock()  # the parent may have held it while forking
    _collecting = set()
    _readers = {}  # the parent's reporters read there, not here
    _inherited.extend((clocks.events._free, pending, _pending_retired, _early))
    clocks.events.clear()
    clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
