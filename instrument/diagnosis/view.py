"""What the rules read from one report: the step, its phases and their shares, per step."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from instrument.distributed.stragglers import is_collective, step_spread
from instrument.report import OTHER_ROW, Node, RankStats, Report

OTHER = OTHER_ROW
#: A top-level region named like a step (:data:`STEP_NAME`) that covers at least this share
#: of the step is the step itself (a user's ``with timed("train_step")``): its children are
#: the phases.
COVERING = 0.9
STEP_NAME = re.compile(r"(^|[_ .-])(step|iter|iteration|train|training|batch)($|[_ .-])", re.I)


@dataclass(frozen=True)
class Spread:
    """A value across ranks: lowest, highest, the rank that has each, and a typical value
    (the median with ``ranks="all"`` and three ranks or more, else the lowest)."""

    low: float
    high: float
    low_rank: int
    high_rank: int
    typical: float
    ranks: int
    how: str  # "median over 4 ranks", "lowest over 2 ranks"


def spread(stats: RankStats) -> Spread:
    """A :class:`Spread` from a path's (or an ``across`` entry's) values across ranks."""
    values = [v for v in stats.per_rank or () if v is not None]
    if len(values) >= 3:
        typical, how = statistics.median(values), f"median over {len(values)} ranks"
    else:
        typical, how = stats.rank_min, f"lowest over {stats.ranks_present} ranks"
    return Spread(
        stats.rank_min,
        stats.rank_max,
        stats.rank_argmin,
        stats.rank_argmax,
        typical,
        stats.ranks_present,
        how,
    )


class View:
    """One report seen as a step: per-step seconds for every path, the phases (the step's
    top-level regions, or the children of one region that covers the step), ``(other)``."""

    def __init__(self, report: Report) -> None:
        self.report = report
        step = report.step_time
        self.steps = report.steps
        #: Multiplies a report's (normalized) total into seconds per step; 0 without steps.
        self.scale = 0.0
        if step is not None and report.steps > 0:
            n = report.normalizer
            self.scale = 1.0 if n == "steps" else float(n) / report.steps
        self.step = step.total * self.scale if step is not None else 0.0
        #: Multiplies a report's per-call figures (mean, max, p50) into seconds.
        self.per_call = 1.0 if report.normalizer == "steps" else float(report.normalizer)
        kids: dict[str, list[Node]] = {}
        for node in report.nodes:
            kids.setdefault(node.path.rpartition("/")[0], []).append(node)
        self._kids = kids
        top = [node for node in kids.get("", ()) if not node.concurrent]
        covering = None
        if len(top) >= 1 and self.step > 0:
            big = max(top, key=lambda node: node.total)
            covers = big.total * self.scale >= COVERING * self.step
            if covers and STEP_NAME.search(big.name) and big.path in kids:
                covering = big
        #: The region that is the whole step, if the user wrapped it in one.
        self.covering = covering
        parent = covering.path if covering is not None else ""
        self.phases = tuple(
            node for node in kids.get(parent, ()) if not node.concurrent and node is not covering
        )
        other = 0.0
        if step is not None:  # Report.other, from the children already sorted
            covered = sum(node.total for node in top)
            other = max(step.total - covered - report.flush_time, 0.0) * self.scale
        if covering is not None:
            other += max(covering.self, 0.0) * self.scale
        #: Seconds per step in no region (the step region's own time included).
        self.other = other
        self.other_path = OTHER if covering is None else f"{covering.path} (self)"
        self.flush = report.flush_time * self.scale
        self._by_name: dict[str, Node] | None = None
        self._collectives: list[Node] | None = None

    def children(self, path: str) -> list[Node]:
        """The nodes directly below ``path`` ("" for the top level)."""
        return self._kids.get(path, [])

    @property
    def warm_up(self) -> bool:
        """The report is the run's first interval (first calls, lazy initialisation)."""
        return self.report.step - self.report.steps <= 0

    @property
    def slowest_step(self) -> float:
        """Seconds per step on the slowest rank where the ranks' rates were gathered (the
        same on every rank), else this rank's step."""
        rate = self.report.across.get("throughput.steps_per_sec")
        if rate is None or rate.rank_min <= 0:
            return self.step
        return 1.0 / rate.rank_min

    def noise(self, node: Node) -> float:
        """The step-to-step spread (standard deviation) of ``node``'s time per step: the
        largest over the ranks where gathered (the same on every rank), else this rank's."""
        stats = self.report.across.get("noise." + node.path)
        if stats is not None:
            return float(stats.rank_max) * self.per_call
        return step_spread(node, self.steps) * self.per_call

    @property
    def has_steps(self) -> bool:
        """The report measured steps (the shares below mean something)."""
        return self.step > 0.0

    @property
    def usual_step(self) -> float:
        """The median step in seconds (the mean where the report holds no median): a few
        steps slowed by the machine's other work move the mean, not this."""
        step = self.report.step_time
        return step.p50 if step is not None and step.p50 > 0 else self.step

    def seconds(self, node: Node) -> float:
        """``node``'s time per step."""
        return node.total * self.scale

    def share(self, seconds: float) -> float:
        """``seconds`` (per step) as a share of the step."""
        return seconds / self.step if self.step > 0 else 0.0

    def phase(self, name: str) -> Node | None:
        """The phase called ``name`` (``"data"``), or ``None``."""
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = {}
            for node in self.phases:
                by_name.setdefault(node.name, node)
        return by_name.get(name)

    def usual(self, node: Node) -> float:
        """``node``'s share of a usual step: its median call times its calls per step over
        the median step — what a few slow steps (a stall, a hiccup of the machine) do not
        move, unlike the mean."""
        step = self.report.step_time
        if step is None or step.p50 <= 0 or not self.steps or not node.count:
            return 0.0
        return node.p50 * node.count / self.steps / step.p50

    def share_of(self, node: Node, seconds: float) -> float:
        """The smaller of ``seconds`` (per step, the mean) and ``node``'s usual share: a
        share counts only when both the mean step and the usual one show it."""
        return min(self.share(seconds), self.usual(node))

    def other_share(self) -> float:
        """The smaller of the mean and the usual share of the step in no region."""
        mean = self.share(self.other)
        if self.covering is not None:
            return min(mean, self.usual(self.covering) - sum(map(self.usual, self.phases)))
        return min(mean, max(1.0 - sum(map(self.usual, self.phases)), 0.0))

    def typical(self, node: Node) -> tuple[float, str]:
        """``node``'s time per step for "every rank" judgements: the median or the lowest
        over the ranks when gathered (so one slow rank does not make them all look so), and
        how it was taken ("" for this rank alone)."""
        if node.ranks is None:
            return self.seconds(node), ""
        s = spread(node.ranks)
        return s.typical * self.scale, s.how

    def own(self, node: Node) -> Spread | None:
        """``node``'s own time (its collectives' waiting taken out) across ranks, per step,
        or ``None`` when not gathered (or, for a region holding a collective, gathered
        without its own time)."""
        stats = self.report.across.get("own." + node.path)
        if stats is None:
            inside = node.path + "/"
            if any(c.path.startswith(inside) for c in self.collectives()):
                return None  # its total holds waiting: not comparable across ranks
            stats = node.ranks
        if stats is None:
            return None
        s = spread(stats)
        k = self.scale
        return Spread(s.low * k, s.high * k, s.low_rank, s.high_rank, s.typical * k, s.ranks, s.how)

    def collectives(self) -> list[Node]:
        """The outermost collectives (and waits for other ranks) below the phases."""
        if self._collectives is None:
            found = [node for node in self.report.nodes if is_collective(node)]
            paths = {node.path for node in found}
            self._collectives = [
                node
                for node in found
                if not any(node.path.startswith(p + "/") for p in paths if p != node.path)
            ]
        return self._collectives

    def in_collectives(self) -> float:
        """Seconds per step with a collective in flight: synchronous collectives' time plus
        each region's async collectives counted once (their union, ``concurrent_time``)."""
        total = 0.0
        async_parents: set[str] = set()
        for node in self.collectives():
            if node.concurrent:
                async_parents.add(node.parent)
            else:
                total += self.seconds(node)
        for parent in async_parents:
            held = self.report.get(parent)
            # a top-level span has no parent to hold its union: the longest, a lower bound
            kids = [n for n in self.children(parent) if n.concurrent]
            longest = max((n.total for n in kids), default=0.0)
            union = held.concurrent_time if held is not None else 0.0
            total += max(union, longest) * self.scale
        return total
