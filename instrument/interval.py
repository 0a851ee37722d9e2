"""One interval's report: the collected columns of the registry → a normalized, frozen
:class:`~instrument.report.Report` (self times, level filter, normalizer). Pure: no I/O,
no process group, no sink.

The report's nodes are built on first read (:class:`Rows`): a flush only takes the
registry's columns, so its cost per path is the C walk's, whatever reads the report later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from instrument import registry
from instrument._frozen import unchecked
from instrument.rank import rank_and_world
from instrument.report import LazyNodes, Node, Report, SelfCost
from instrument.stats import Stats, Summary, from_figures, stats_of
from instrument.throughput import Throughput


def build_report(
    collected: registry.Collected,
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
    flush_ns: int = 0,
) -> Report:
    """Turn one interval's collected columns (:func:`registry.collect`) into a normalized
    :class:`Report`, whose nodes are built when first read; ``step_time`` summarizes the
    interval's step times (``NodeBase.take()``), ``flush_ns`` is the previous flush's time
    inside them and outside every region."""
    scale = _scaler(normalizer, steps)
    step_stats = None if not steps or step_time is None else scale(stats_of(step_time))
    flush_time = 0.0
    if step_stats is not None and flush_ns > 0:
        flush_time = min(scale(Stats.empty().with_total(flush_ns / 1e9)).total, step_stats.total)
    rank, world = rank_and_world()
    return unchecked(
        Report,
        nodes=Rows(collected, scale, level),
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
        flush_time=flush_time,
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
        "covered",
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
        concurrent = set(registry.concurrent)  # (one copy: other threads may add to it)
        covered = collected.covered_ns
        sparse = (collected.device, collected.bytes, collected.adjust_ns, collected.open, covered)
        self.covered: dict[int, int] = {}
        if not (any(sparse) or concurrent):
            self.device, self.bytes, self.adjust, self.open, self.concurrent = (
                {},
                {},
                {},
                set(),
                set(),
            )
            return
        rows = collected.rows_of(concurrent.union(*sparse))
        self.device = {rows[k]: v for k, v in collected.device.items() if k in rows}
        self.bytes = {rows[k]: v for k, v in collected.bytes.items() if k in rows}
        self.adjust = {rows[k]: v for k, v in collected.adjust_ns.items() if k in rows}
        self.open = {rows[k] for k in collected.open if k in rows}
        self.concurrent = {rows[k] for k in concurrent if k in rows}
        self.covered = {rows[k]: v for k, v in covered.items() if k in rows}

    def __len__(self) -> int:
        return len(self.kept)

    def build(self) -> tuple[Node, ...]:
        """The nodes: self times, the normalizer, device times where measured."""
        scale, adjust, device, concurrent = self.scale, self.adjust, self.device, self.concurrent
        counts, totals, figures, links = self.counts, self.totals, self.figures, self.links
        same = scale is _same
        # per step: the host total scaled as it is made (one Stats a path, not two)
        per_step, rescale = 1.0, not same
        if isinstance(scale, _PerStep):
            per_step, rescale = scale.per_step, False
        kept = self.kept
        hosts: list[Stats] = []
        primaries: list[Stats] = []
        child_total: dict[int, float] = {}
        shown: set[int] = set()
        covered = self.covered
        spans_host: dict[int, float] = {}  # per parent: its concurrent children's totals
        spans_primary: dict[int, float] = {}
        for i in kept:
            extra = adjust.get(i, 0) if adjust else 0
            count = counts[i]
            if count:
                host = from_figures(count, totals[i] + extra, figures, 7 * i, per_step)
                if rescale:
                    host = scale(host)
            else:
                host = stats_of(None, extra)
                if not same:
                    host = scale(host)
            acc = device.get(i) if device else None
            primary = host if acc is None else scale(acc.to_stats(extra))
            hosts.append(host)
            primaries.append(primary)
            shown.add(i)
            parent = links[3 * i]
            if parent in shown and i not in concurrent:  # (parents come first)
                child_total[parent] = child_total.get(parent, 0.0) + primary.total
            elif parent in covered and i in concurrent:
                spans_host[parent] = spans_host.get(parent, 0.0) + host.total
                spans_primary[parent] = spans_primary.get(parent, 0.0) + primary.total
        spans = _covered_time(covered, scale, spans_host, spans_primary) if covered else {}
        paths, modes, nbytes, is_open = self.paths, self.modes, self.bytes, self.open
        return tuple(
            Node.of(
                paths[i],
                host,
                None if primary is host else primary,
                max(primary.total - child_total.get(i, 0.0), 0.0),
                modes[i] if primary is host else "cuda",
                links[3 * i + 1],
                nbytes.get(i, 0),
                i in concurrent,
                i in is_open,
                min(spans.get(i, 0.0), primary.total) if spans else 0.0,
            )
            for i, host, primary in zip(kept, hosts, primaries, strict=True)
        )


def _covered_time(
    covered: Mapping[int, int],
    scale: Callable[[Stats], Stats],
    spans_host: Mapping[int, float],
    spans_primary: Mapping[int, float],
) -> dict[int, float]:
    """Per row, the time its concurrent children cover (host ns, overlaps counted once) in
    the units of its ``total``: normalized, and where the children's primary time is the
    device's, scaled by their primary / host totals (the caller clips it to ``total``)."""
    per_second = scale(Stats.empty().with_total(1.0)).total  # (the normalizer is linear)
    out: dict[int, float] = {}
    for row, ns in covered.items():
        host = spans_host.get(row, 0.0)
        ratio = spans_primary.get(row, 0.0) / host if host > 0.0 else 1.0
        out[row] = ns * 1e-9 * per_second * ratio
    return out


def _scaler(normalizer: float | str, steps: int) -> Callable[[Stats], Stats]:
    """What the normalizer does to one path's statistics."""
    if normalizer == "steps":
        if not steps:
            return _same
        return _PerStep(steps)
    if normalizer == 1.0:
        return _same
    factor = 1.0 / float(normalizer)
    return lambda stats: stats.scaled(factor)


def _same(stats: Stats) -> Stats:
    return stats


class _PerStep:
    """The ``"steps"`` normalizer: a path's total per step, its other figures per call."""

    __slots__ = ("per_step",)

    def __init__(self, steps: int) -> None:
        self.per_step = 1.0 / steps

    def __call__(self, stats: Stats) -> Stats:
        return stats.with_total(stats.total * self.per_step)
