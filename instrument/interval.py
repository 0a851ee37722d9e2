"""One interval's report: the collected accumulators of the registry → a normalized, frozen
:class:`~instrument.report.Report` (self times, level filter, normalizer). Pure: no I/O,
no process group, no sink."""

from __future__ import annotations

from collections.abc import Mapping

from instrument import registry
from instrument.report import Node, Report
from instrument.sinks.files import rank_and_world
from instrument.stats import Accumulator, Stats
from instrument.throughput import Throughput


def build_report(
    collected: list[registry.Collected],
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
) -> Report:
    """Turn one interval's collected accumulators (in tree order, as
    :func:`registry.collect` gives them) into a normalized :class:`Report`."""
    kept = [item for item in collected if level is None or not _above_level(item.node, level)]

    def frozen(acc: Accumulator, adjust_ns: int) -> Stats:
        return acc.to_stats(adjust_ns)

    def scale(stats: Stats) -> Stats:
        if normalizer == "steps":
            if not steps:
                return stats
            per_step = 1.0 / steps
            return Stats(stats.count, stats.total * per_step, *_per_call(stats))
        return stats if normalizer == 1.0 else stats.scaled(1.0 / float(normalizer))

    host: dict[str, Stats] = {}
    device: dict[str, Stats | None] = {}
    for item in kept:
        host[item.node.path] = scale(frozen(item.host, item.adjust_ns))
        device[item.node.path] = (
            None if item.device is None else scale(frozen(item.device, item.adjust_ns))
        )

    child_total: dict[str, float] = {}
    for item in kept:
        node = item.node
        if node in registry.concurrent:
            continue
        if node.parent is not None and node.parent.path in host:
            primary = device[node.path] or host[node.path]
            child_total[node.parent.path] = child_total.get(node.parent.path, 0.0) + primary.total

    nodes = []
    for item in kept:
        path = item.node.path
        primary = device[path] or host[path]
        nodes.append(
            Node(
                path=path,
                host=host[path],
                device=device[path],
                self_time=max(primary.total - child_total.get(path, 0.0), 0.0),
                clock="cuda" if device[path] is not None else item.node.mode,
                level=item.node.level,
                bytes=item.bytes,
                concurrent=item.node in registry.concurrent,
                open=item.open,
            )
        )

    step_time = None
    if steps:
        acc = Accumulator()
        acc.add_batch(step_ns)
        step_time = scale(acc.to_stats())
    rank, world = rank_and_world()
    return Report(
        nodes=tuple(nodes),
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
    )


def _per_call(stats: Stats) -> tuple[float, ...]:
    return (stats.mean, stats.min, stats.max, stats.std, stats.p50, stats.p90, stats.p99)


def _above_level(node: registry.PathNode | None, level: int) -> bool:
    """True if ``node`` or one of its ancestors is more detailed than ``level``."""
    while node is not None:
        if node.level > level:
            return True
        node = node.parent
    return False
