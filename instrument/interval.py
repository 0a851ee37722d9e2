"""One interval's report: the collected columns of the registry → a normalized, frozen
:class:`~instrument.report.Report` (self times, level filter, normalizer). Pure: no I/O,
no process group, no sink.

The report's nodes are built on first read (:class:`Rows`): a flush only takes the
registry's columns, so its cost per path is the C walk's, whatever reads the report later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from instrument import registry
from instrument.rank import rank_and_world
from instrument.report import LazyNodes, Node, Report, SelfCost
from instrument.stats import Accumulator, Stats, stats_of
from instrument.throughput import Throughput


def build_report(
    collected: registry.Collected,
    *,
    steps: int,
    step_ns: list[int],
    normalizer: float | str,
    level: int | None,
    index: int = 0,
    step: int = 0,
    start_time: float = 0.0,
    end_time: float = 0.0,
    throughput: Throughput | None = None,
    memory: Mapping[str, int] | None = None,
    self_cost: SelfCost | None = None,
) -> Report:
    """Turn one interval's collected columns (:func:`registry.collect`) into a normalized
    :class:`Report`, whose nodes are built when first read."""
    scale = _scaler(normalizer, steps)
    step_time = None
    if steps:
        acc = Accumulator()
        acc.add_batch(step_ns)
        step_time = scale(acc.to_stats())
    rank, world = rank_and_world()
    return Report(
        nodes=Rows(collected, scale, level),
        steps=steps,
        step_time=step_time,
        normalizer=normalizer,
        index=index,
        step=step,
        start_time=start_time,
        end_time=end_time,
        rank=rank,
        world_size=world,
        throughput=throughput,
        memory=dict(memory or {}),
        self_cost=self_cost,
    )


class Rows(LazyNodes):
    """The nodes of one report, kept as the registry's columns until first read: paths,
    modes, host figures and links by row, the sparse figures by row (no path node is held,
    so a kept report does not keep idle paths alive)."""

    __slots__ = (
        "adjust",
        "bytes",
        "concurrent",
        "counts",
        "device",
        "figures",
        "kept",
        "links",
        "modes",
        "open",
        "paths",
        "scale",
        "totals",
    )

    def __init__(
        self, collected: registry.Collected, scale: Callable[[Stats], Stats], level: int | None
    ) -> None:
        host = collected.host
        self.paths = collected.paths
        self.modes = collected.modes
        self.counts = host.counts
        self.totals = host.totals
        self.figures = host.figures
        self.links = collected.links
        self.scale = scale
        links = collected.links
        n = len(collected.paths)
        #: the rows shown: those no more detailed than ``level`` (along their whole path)
        self.kept = (
            range(n) if level is None else [i for i in range(n) if links[3 * i + 2] <= level]
        )
        concurrent = registry.concurrent
        sparse = (collected.device, collected.bytes, collected.adjust_ns, collected.open)
        if any(sparse) or concurrent:
            keys = set(concurrent).union(*sparse)
            rows = collected.rows_of(keys)
        else:
            rows = {}
        self.device = {rows[k]: v for k, v in collected.device.items() if k in rows}
        self.bytes = {rows[k]: v for k, v in collected.bytes.items() if k in rows}
        self.adjust = {rows[k]: v for k, v in collected.adjust_ns.items() if k in rows}
        self.open = {rows[k] for k in collected.open if k in rows}
        self.concurrent = {rows[k] for k in concurrent if k in rows}

    def __len__(self) -> int:
        return len(self.kept)

    def build(self) -> tuple[Node, ...]:
        """The nodes: self times, the normalizer, device times where measured."""
        scale, adjust, device = self.scale, self.adjust, self.device
        counts, totals, figures, links = self.counts, self.totals, self.figures, self.links
        concurrent = self.concurrent
        host: dict[int, Stats] = {}
        primary: dict[int, Stats] = {}
        for i in self.kept:
            extra = adjust.get(i, 0)
            count = counts[i]
            summary = None
            if count:
                at = 7 * i
                summary = (count, totals[i], *figures[at : at + 7])
            stats = stats_of(summary, extra)  # type: ignore[arg-type]
            host[i] = stats = stats if scale is _same else scale(stats)
            acc = device.get(i)
            if acc is not None:
                stats = scale(acc.to_stats(extra))
            primary[i] = stats
        child_total: dict[int, float] = {}
        for i, stats in primary.items():
            parent = links[3 * i]
            if parent in primary and i not in concurrent:
                child_total[parent] = child_total.get(parent, 0.0) + stats.total
        nodes = []
        for i, stats in primary.items():
            measured = stats is not host[i]
            nodes.append(
                Node.of(
                    self.paths[i],
                    host[i],
                    stats if measured else None,
                    max(stats.total - child_total.get(i, 0.0), 0.0),
                    "cuda" if measured else self.modes[i],
                    links[3 * i + 1],
                    self.bytes.get(i, 0),
                    i in concurrent,
                    i in self.open,
                )
            )
        return tuple(nodes)


def _scaler(normalizer: float | str, steps: int) -> Callable[[Stats], Stats]:
    """What the normalizer does to one path's statistics."""
    if normalizer == "steps":
        if not steps:
            return _same
        per_step = 1.0 / steps
        return lambda stats: stats.with_total(stats.total * per_step)
    if normalizer == 1.0:
        return _same
    factor = 1.0 / float(normalizer)
    return lambda stats: stats.scaled(factor)


def _same(stats: Stats) -> Stats:
    return stats
