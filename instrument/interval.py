"""One interval's report: the collected accumulators of the registry → a normalized, frozen
:class:`~instrument.report.Report` (self times, level filter, normalizer). Pure: no I/O,
no process group, no sink."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from instrument import registry
from instrument.rank import rank_and_world
from instrument.registry import PathNode
from instrument.report import Node, Report, SelfCost
from instrument.stats import Stats, Summary, stats_of
from instrument.throughput import Throughput


def build_report(
    collected: list[registry.Collected],
    *,
    steps: int,
    step_time: Summary | None,
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
    """Turn one interval's collected accumulators (in tree order, as
    :func:`registry.collect` gives them) into a normalized :class:`Report`; ``step_time``
    summarizes the interval's step times (``NodeBase.take()``)."""
    kept = (
        collected
        if level is None
        else [item for item in collected if not _above_level(item.node, level)]
    )
    scale = _scaler(normalizer, steps)
    concurrent = registry.concurrent
    host: dict[PathNode, Stats] = {}
    primary: dict[PathNode, Stats] = {}
    for item in kept:
        node = item.node
        stats = stats_of(item.host, item.adjust_ns)
        host[node] = stats = stats if scale is _same else scale(stats)
        if item.device is not None:
            stats = scale(item.device.to_stats(item.adjust_ns))
        primary[node] = stats

    child_total: dict[PathNode, float] = {}
    for node, stats in primary.items():
        parent = node.parent
        if parent in primary and node not in concurrent:
            child_total[parent] = child_total.get(parent, 0.0) + stats.total

    nodes = []
    for item in kept:
        node = item.node
        stats = primary[node]
        measured = stats is not host[node]
        nodes.append(
            Node.of(
                node.path,
                host[node],
                stats if measured else None,
                max(stats.total - child_total.get(node, 0.0), 0.0),
                "cuda" if measured else node.mode,
                node.level,
                item.bytes,
                node in concurrent,
                item.open,
            )
        )

    step_stats = None if not steps or step_time is None else scale(stats_of(step_time))
    rank, world = rank_and_world()
    return Report(
        nodes=tuple(nodes),
        steps=steps,
        step_time=step_stats,
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


def _above_level(node: registry.PathNode | None, level: int) -> bool:
    """True if ``node`` or one of its ancestors is more detailed than ``level``."""
    while node is not None:
        if node.level > level:
            return True
        node = node.parent
    return False
