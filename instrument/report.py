"""The report: pure, frozen data in seconds. Rendering lives in :mod:`instrument.tree`."""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from instrument.findings import Finding
from instrument.stats import Stats
from instrument.throughput import Throughput

FORMAT_VERSION = 1
#: The line that shows a report's ``flush_time`` (trees, tables, charts).
FLUSH_ROW = "(instrument flush)"
#: The line of the step time that no top-level region covered.
OTHER_ROW = "(other)"

#: ``Report.render``'s implementation: :func:`instrument.tree.render_text`, which registers
#: itself when imported (``import instrument`` does), so the model never imports its renderer.
text_renderer: Callable[..., str] | None = None


def _list(value: object, name: str) -> list[Any] | tuple[Any, ...]:
    """``value`` when it is a list (a JSON array), else a ``TypeError`` naming ``name``."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"{name} is a {type(value).__name__}; expected a list")
    return value


@dataclass(frozen=True)
class RankStats:
    """One value (a path's total, a rate) across the ranks of the group; ranks are global,
    ``per_rank`` (``None`` where a rank has no value) is kept with ``ranks="all"``, on the
    group's first rank only (the one that writes).

    ``slowest`` is the rank that holds the others up: the one with the largest time, except
    in a collective, where the others wait for the rank that *arrived last* — the one with
    the shortest time there. ``relative_score`` (fastest rank's time / this rank's) and
    ``individual_score`` (this rank's best interval / this one) are this rank's straggler
    scores, 1.0 = best; ``None`` where the path is not scored (a collective, a region too
    small to matter, a rate).
    """

    rank_min: float
    rank_max: float
    rank_mean: float
    rank_argmin: int
    rank_argmax: int
    ranks_present: int
    per_rank: tuple[float | None, ...] | None = None
    slowest: int | None = None
    relative_score: float | None = None
    individual_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores it exactly."""
        return {
            "rank_min": self.rank_min,
            "rank_max": self.rank_max,
            "rank_mean": self.rank_mean,
            "rank_argmin": self.rank_argmin,
            "rank_argmax": self.rank_argmax,
            "ranks_present": self.ranks_present,
            "per_rank": None if self.per_rank is None else list(self.per_rank),
            "slowest": self.slowest,
            "relative_score": self.relative_score,
            "individual_score": self.individual_score,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankStats:
        """Inverse of :meth:`to_dict`."""
        per_rank = data.get("per_rank")
        slowest = data.get("slowest")
        relative = data.get("relative_score")
        individual = data.get("individual_score")
        return cls(
            rank_min=float(data["rank_min"]),
            rank_max=float(data["rank_max"]),
            rank_mean=float(data["rank_mean"]),
            rank_argmin=int(data["rank_argmin"]),
            rank_argmax=int(data["rank_argmax"]),
            ranks_present=int(data["ranks_present"]),
            per_rank=None
            if per_rank is None
            else tuple(None if v is None else float(v) for v in _list(per_rank, "per_rank")),
            slowest=None if slowest is None else int(slowest),
            relative_score=None if relative is None else float(relative),
            individual_score=None if individual is None else float(individual),
        )


@dataclass(frozen=True)
class Straggler:
    """A rank whose relative score stayed below the threshold for several consecutive
    intervals, with the regions that make it slow (``scores``: its relative score in each,
    this interval) and the length of its longest run of slow intervals."""

    rank: int
    host: str
    regions: tuple[str, ...]
    scores: tuple[float, ...]
    intervals: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores it exactly."""
        return {
            "rank": self.rank,
            "host": self.host,
            "regions": list(self.regions),
            "scores": list(self.scores),
            "intervals": self.intervals,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Straggler:
        """Inverse of :meth:`to_dict`."""
        regions = tuple(str(r) for r in _list(data["regions"], "straggler regions"))
        scores = tuple(float(s) for s in _list(data["scores"], "straggler scores"))
        if len(regions) != len(scores):
            raise ValueError(
                f"a straggler has {len(regions)} regions and {len(scores)} scores; "
                "expected one score per region"
            )
        return cls(
            rank=int(data["rank"]),
            host=str(data["host"]),
            regions=regions,
            scores=scores,
            intervals=int(data["intervals"]),
        )


@dataclass(frozen=True)
class SelfCost:
    """What instrument itself cost in an interval: the ``regions`` that ended in it times
    one region's enter and exit on this machine (``region_ns``, calibrated once), the
    ``hooked`` regions (entered through ``auto``'s hooks) times one hooked region's cost
    (``hooked_ns``, calibrated once), plus the previous flush's own time
    (``flush_seconds``), against the interval's time on the host clock
    (``interval_seconds``)."""

    regions: int
    region_ns: float
    flush_seconds: float
    interval_seconds: float
    hooked: int = 0
    hooked_ns: float = 0.0

    @property
    def seconds(self) -> float:
        """The estimated cost in seconds."""
        return (self.regions * self.region_ns + self.hooked * self.hooked_ns) / 1e9 + (
            self.flush_seconds
        )

    @property
    def share(self) -> float:
        """The cost as a fraction of the interval (0.0 for an empty interval)."""
        if self.interval_seconds <= 0.0:
            return 0.0
        return self.seconds / self.interval_seconds

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores it exactly."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SelfCost:
        """Inverse of :meth:`to_dict`."""
        return cls(
            regions=int(data["regions"]),
            region_ns=float(data["region_ns"]),
            flush_seconds=float(data["flush_seconds"]),
            interval_seconds=float(data["interval_seconds"]),
            hooked=int(data.get("hooked", 0)),
            hooked_ns=float(data.get("hooked_ns", 0.0)),
        )


@dataclass(frozen=True)
class Node:
    """Statistics of one path for one interval, in seconds.

    ``count``, ``total``, ``mean``, ``min``, ``max``, ``std``, ``p50``, ``p90``, ``p99`` and
    ``self`` describe the region's primary time: device time for a region on the "cuda"
    clock, host time otherwise. ``host`` always holds the host-side (enter → exit) time, and
    ``device`` the CUDA-event time when there is one, so both can be compared.

    ``bytes`` counts what a collective moved in the interval (never normalized), and
    ``concurrent`` marks work that overlaps its siblings (an async collective timed until
    its ``wait()``): its time is not subtracted from the parent's ``self``.
    ``concurrent_time`` is the time a node's concurrent children cover, their overlaps
    counted once (DDP's gradient buckets overlap each other and their ``backward``), from
    their host intervals — scaled by their primary / host totals where the primary time is
    the device's, normalized like ``total`` and at most ``total``; 0.0 without concurrent
    children. ``ranks`` holds
    the path's total across ranks (``Reporter(ranks="minmax" | "all")`` in a process
    group); the statistics above stay this rank's (empty where this rank never ran it).

    ``open`` marks a region still running at the flush (an ``epoch`` around the loop): its
    ``total`` and ``self`` are its time inside this interval. A call split over intervals
    adds to ``total`` in each only its time inside that interval, and counts once, in the
    interval where it ends, where ``count``, ``mean``, ``min``, ``max``, ``std`` and the
    percentiles describe whole calls (its full duration). So a region open all interval
    has ``count`` 0, and ``mean`` can exceed ``total`` in the interval where it ends.
    """

    path: str
    host: Stats
    device: Stats | None = None
    self_time: float = 0.0
    clock: str = "cpu"
    level: int = 0
    bytes: int = 0
    concurrent: bool = False
    ranks: RankStats | None = None
    open: bool = False
    concurrent_time: float = 0.0

    @classmethod
    def of(
        cls,
        path: str,
        host: Stats,
        device: Stats | None,
        self_time: float,
        clock: str,
        level: int,
        nbytes: int,
        concurrent: bool,
        is_open: bool,
        concurrent_time: float = 0.0,
    ) -> Node:
        """``Node(...)`` without the frozen dataclass's per-field ``__setattr__`` (the flush
        builds one per path): each field set in turn in the instance's own, key-sharing
        ``__dict__``."""
        node = object.__new__(cls)
        state = node.__dict__  # (in the fields' order; three a line compile without a tuple)
        state["path"], state["host"], state["device"] = path, host, device
        state["self_time"], state["clock"], state["level"] = self_time, clock, level
        state["bytes"], state["concurrent"], state["ranks"] = nbytes, concurrent, None
        state["open"], state["concurrent_time"] = is_open, concurrent_time
        return node

    @property
    def name(self) -> str:
        """The last segment of the path."""
        return self.path.rpartition("/")[2]

    @property
    def parent(self) -> str:
        """The parent's path ("" for a top-level region)."""
        return self.path.rpartition("/")[0]

    @property
    def stats(self) -> Stats:
        """The primary statistics (device if measured, else host). The figures below read
        them the same way without this call: they are read per path, several times a
        report."""
        return self.device if self.device is not None else self.host

    @property
    def count(self) -> int:
        """Number of calls (never normalized)."""
        return (self.host if self.device is None else self.device).count

    @property
    def total(self) -> float:
        """Total time (seconds, normalized)."""
        return (self.host if self.device is None else self.device).total

    @property
    def mean(self) -> float:
        """Mean time per call (seconds)."""
        return (self.host if self.device is None else self.device).mean

    @property
    def min(self) -> float:
        """Shortest call (seconds)."""
        return (self.host if self.device is None else self.device).min

    @property
    def max(self) -> float:
        """Longest call (seconds)."""
        return (self.host if self.device is None else self.device).max

    @property
    def std(self) -> float:
        """Standard deviation of the calls (seconds)."""
        return (self.host if self.device is None else self.device).std

    @property
    def p50(self) -> float:
        """Median call, from the histogram (seconds)."""
        return (self.host if self.device is None else self.device).p50

    @property
    def p90(self) -> float:
        """90th percentile call (seconds)."""
        return (self.host if self.device is None else self.device).p90

    @property
    def p99(self) -> float:
        """99th percentile call (seconds)."""
        return (self.host if self.device is None else self.device).p99

    @property
    def rank_min(self) -> float | None:
        """The smallest total over the ranks that ran this path (None: not gathered)."""
        return None if self.ranks is None else self.ranks.rank_min

    @property
    def rank_max(self) -> float | None:
        """The largest total over the ranks (None: not gathered)."""
        return None if self.ranks is None else self.ranks.rank_max

    @property
    def rank_mean(self) -> float | None:
        """The mean total over the ranks that ran this path (None: not gathered)."""
        return None if self.ranks is None else self.ranks.rank_mean

    @property
    def rank_argmin(self) -> int | None:
        """The fastest rank (None: not gathered)."""
        return None if self.ranks is None else self.ranks.rank_argmin

    @property
    def rank_argmax(self) -> int | None:
        """The slowest rank (None: not gathered)."""
        return None if self.ranks is None else self.ranks.rank_argmax

    @property
    def slowest_rank(self) -> int | None:
        """The rank holding the others up: the slowest, or in a collective the one that
        arrived last (None: not gathered)."""
        if self.ranks is None:
            return None
        return self.ranks.rank_argmax if self.ranks.slowest is None else self.ranks.slowest

    @property
    def relative_score(self) -> float | None:
        """Fastest rank's total / this rank's (1.0 = fastest; None: not scored)."""
        return None if self.ranks is None else self.ranks.relative_score

    @property
    def individual_score(self) -> float | None:
        """This rank's best interval / this interval (1.0 = its best; None: not scored)."""
        return None if self.ranks is None else self.ranks.individual_score

    @property
    def ranks_present(self) -> int | None:
        """How many ranks ran this path (None: not gathered)."""
        return None if self.ranks is None else self.ranks.ranks_present

    @property
    def per_rank(self) -> tuple[float | None, ...] | None:
        """Each rank's total, ``None`` where it never ran the path (``ranks="all"`` only)."""
        return None if self.ranks is None else self.ranks.per_rank

    @property
    def self(self) -> float:
        """Total minus the totals of the children (seconds)."""
        return self.self_time

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores it exactly."""
        return {
            "path": self.path,
            "clock": self.clock,
            "level": self.level,
            "self": self.self_time,
            "host": self.host.to_dict(),
            "device": None if self.device is None else self.device.to_dict(),
            "bytes": self.bytes,
            "concurrent": self.concurrent,
            "concurrent_time": self.concurrent_time,
            "open": self.open,
            "ranks": None if self.ranks is None else self.ranks.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Node:
        """Inverse of :meth:`to_dict`."""
        device = data.get("device")
        return cls(
            path=str(data["path"]),
            host=Stats.from_dict(data["host"]),
            device=None if device is None else Stats.from_dict(device),
            self_time=float(data["self"]),
            clock=str(data.get("clock", "cpu")),
            level=int(data.get("level", 0)),
            bytes=int(data.get("bytes", 0)),
            concurrent=bool(data.get("concurrent", False)),
            ranks=None if data.get("ranks") is None else RankStats.from_dict(data["ranks"]),
            open=bool(data.get("open", False)),
            concurrent_time=float(data.get("concurrent_time", 0.0)),
        )


class LazyNodes(ABC):
    """A report's nodes, built on first read (a flush makes one; most reports are only
    passed to sinks that read a few figures, or kept). Holds plain data, no path node."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def build(self) -> tuple[Node, ...]:
        """The nodes, parents before children."""


class _Nodes:
    """``Report.nodes``: stored as given, a :class:`LazyNodes` built (once) on first read."""

    def __get__(self, report: Report | None, owner: type) -> tuple[Node, ...]:
        if report is None:
            return ()  # the field's default
        nodes = report.__dict__["nodes"]
        if isinstance(nodes, LazyNodes):
            nodes = nodes.build()
            report.__dict__["nodes"] = nodes
        return nodes  # type: ignore[no-any-return]

    def __set__(self, report: Report, nodes: Sequence[Node] | LazyNodes) -> None:
        report.__dict__["nodes"] = nodes


@dataclass(frozen=True)
class Report:
    """One interval's timing tree.

    ``nodes`` are in tree order (parents before children). ``report[path]`` gives a
    :class:`Node`; ``steps`` is the number of ``step()`` ticks in the interval and
    ``step_time`` the measured time between them (normalized like the nodes), or ``None``
    when no step was marked; ``step`` counts every step the reporter has seen up to this
    report (the x axis of TensorBoard, wandb and ``instrument plot``). ``throughput`` holds
    the interval's rates (``None`` without steps) and ``memory`` the memory sampled at the
    flush, in bytes (see :mod:`instrument.memory` for the keys; empty when not sampled).
    With ``ranks`` other than "local" in a process group, each node's ``ranks`` and the
    ``across`` mapping (``"throughput.tokens_per_sec"``, ``"memory.device_peak_allocated"``,
    ..., ``"own.<path>"``: the own time — total less waiting in collectives — of each
    region that holds one, and ``"noise.<path>"``: the spread of a region's time per
    step) hold the values across ranks, ``group_size`` is the number of ranks combined, and
    ``stragglers`` (on the group's first rank) names the ranks that stayed slow (at most
    64, each with its 3 slowest regions; ``stragglers_count`` says how many there are). When a
    cross-rank flush could not run (a rank missing or at another interval), the report is
    this rank's own and ``across_note`` says why, naming the ranks. ``self_cost`` says what
    the timing itself cost in the interval (``None`` in a report not made by a flush).
    ``flush_time`` is the previous flush's time (with its barrier's wait) where it fell
    inside this interval's steps and outside every region (normalized like the nodes): the
    tree shows it as ``(instrument flush)``, and :attr:`other` does not count it.
    ``findings`` say what the report means (:mod:`instrument.diagnosis`, most important
    first; the first is :attr:`verdict`); empty when the reporter does not diagnose.
    A flush's report builds its ``nodes`` the first time they are read (:class:`LazyNodes`);
    ``len(report)`` does not build them.
    """

    nodes: _Nodes = _Nodes()
    steps: int = 0
    step_time: Stats | None = None
    normalizer: float | str = 1.0
    index: int = 0
    step: int = 0
    start_time: float = 0.0
    end_time: float = 0.0
    rank: int = 0
    world_size: int = 1
    throughput: Throughput | None = None
    memory: Mapping[str, int] = field(default_factory=dict)
    ranks: str = "local"
    across: Mapping[str, RankStats] = field(default_factory=dict)
    group_size: int = 0
    stragglers: tuple[Straggler, ...] = ()
    stragglers_count: int = 0
    across_note: str = ""
    self_cost: SelfCost | None = None
    flush_time: float = 0.0
    findings: tuple[Finding, ...] = ()

    @property
    def verdict(self) -> Finding | None:
        """The most important finding, or ``None`` without findings."""
        return self.findings[0] if self.findings else None

    @property
    def _by_path(self) -> dict[str, Node]:
        """The nodes by path, made on first use."""
        by_path: dict[str, Node] | None = self.__dict__.get("_by_path")
        if by_path is None:
            by_path = self.__dict__["_by_path"] = {node.path: node for node in self.nodes}
        return by_path

    def __getstate__(self) -> dict[str, Any]:
        """What pickle and copy keep: the fields (the nodes built)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    def __getitem__(self, path: str) -> Node:
        try:
            return self._by_path[path]
        except KeyError:
            close = difflib.get_close_matches(path, self._by_path, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise KeyError(f"no region {path!r} in this report{hint}") from None

    def __contains__(self, path: object) -> bool:
        return path in self._by_path

    def __len__(self) -> int:
        nodes = self.__dict__["nodes"]  # (a lazy report knows its length unbuilt)
        return len(nodes)

    def get(self, path: str) -> Node | None:
        """The node at ``path``, or ``None``."""
        return self._by_path.get(path)

    def paths(self) -> tuple[str, ...]:
        """Every recorded path, parents before children."""
        return tuple(node.path for node in self.nodes)

    def children(self, path: str = "") -> tuple[Node, ...]:
        """The nodes directly below ``path`` ("" for the top level)."""
        return tuple(node for node in self.nodes if node.parent == path)

    @property
    def other(self) -> float | None:
        """Step time no top-level region covered (seconds), less :attr:`flush_time`, or
        ``None`` without steps. Concurrent regions (async work) cover nothing: they overlap
        the others."""
        if self.step_time is None:
            return None
        covered = sum(node.total for node in self.children("") if not node.concurrent)
        return max(self.step_time.total - covered - self.flush_time, 0.0)

    def render(self, *, unicode: bool = True, width: int | None = None, fold: bool = True) -> str:
        """The text tree (see :func:`instrument.tree.render_text`); ``fold=False`` shows
        every row."""
        assert text_renderer is not None, "instrument.tree registers the renderer at import"
        return text_renderer(self, unicode=unicode, width=width, fold=fold)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores an equal report."""
        return {
            "version": FORMAT_VERSION,
            "index": self.index,
            "step": self.step,
            "steps": self.steps,
            "normalizer": self.normalizer,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "rank": self.rank,
            "world_size": self.world_size,
            "step_time": None if self.step_time is None else self.step_time.to_dict(),
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "memory": dict(self.memory),
            "ranks": self.ranks,
            "across": {key: value.to_dict() for key, value in self.across.items()},
            "group_size": self.group_size,
            "stragglers": [straggler.to_dict() for straggler in self.stragglers],
            "stragglers_count": self.stragglers_count,
            "across_note": self.across_note,
            "self_cost": None if self.self_cost is None else self.self_cost.to_dict(),
            "flush_time": self.flush_time,
            "findings": [finding.to_dict() for finding in self.findings],
            "nodes": [node.to_dict() for node in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` for something that is not one."""
        if not isinstance(data, Mapping) or "nodes" not in data:
            raise ValueError("not an instrument report: expected a mapping with a 'nodes' list")
        version = data.get("version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"unsupported report version {version!r}; this instrument reads {FORMAT_VERSION}"
            )
        step_time = data.get("step_time")
        normalizer = data.get("normalizer", 1.0)
        if isinstance(normalizer, str) and normalizer != "steps":
            raise ValueError(f"unknown normalizer {normalizer!r}; expected a number or 'steps'")
        rates = data.get("throughput")
        cost = data.get("self_cost")
        return cls(
            nodes=tuple(Node.from_dict(node) for node in data["nodes"]),
            steps=int(data.get("steps", 0)),
            step_time=None if step_time is None else Stats.from_dict(step_time),
            normalizer="steps" if normalizer == "steps" else float(normalizer),
            index=int(data.get("index", 0)),
            step=int(data.get("step", 0)),
            start_time=float(data.get("start_time", 0.0)),
            end_time=float(data.get("end_time", 0.0)),
            rank=int(data.get("rank", 0)),
            world_size=int(data.get("world_size", 1)),
            throughput=None if rates is None else Throughput.from_dict(rates),
            memory={str(k): int(v) for k, v in (data.get("memory") or {}).items()},
            ranks=str(data.get("ranks", "local")),
            across={str(k): RankStats.from_dict(v) for k, v in (data.get("across") or {}).items()},
            group_size=int(data.get("group_size", 0)),
            stragglers=tuple(Straggler.from_dict(s) for s in data.get("stragglers") or ()),
            stragglers_count=int(data.get("stragglers_count", 0)),
            across_note=str(data.get("across_note", "")),
            self_cost=None if cost is None else SelfCost.from_dict(cost),
            flush_time=float(data.get("flush_time", 0.0)),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings") or ()),
        )
