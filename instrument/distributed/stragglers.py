"""Straggler scores: how this rank compares with the fastest rank, and with its own best.

Per region and interval, in the spirit of nvidia-resiliency-ext's straggler detection:

- **relative score** = the fastest rank's time / this rank's time (1.0 = the fastest);
- **individual score** = this rank's best interval / this interval (1.0 = its best so far).

A rank is a straggler in a region when its relative score stays below ``threshold`` for
``intervals`` consecutive intervals; it is cleared by the first interval at or above it.
Regions too small to matter (below ``min_share`` of the largest region's slowest time) and
collectives are not scored: in a collective the fast ranks *wait* for the slow one, so the
rank with the longest time there is the one that arrived first, and the one that arrived
last — the straggler — has the shortest (it is named as the collective's slowest rank).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from instrument.hooks.collectives import BUFFERS
from instrument.report import Node

#: Region names that are (or wait in) a collective.
COLLECTIVES = frozenset(BUFFERS) | {"ddp_all_reduce", "barrier"}


def is_collective(node: Node) -> bool:
    """A collective or a wait for other ranks (by name, moved bytes, or overlap)."""
    if node.concurrent or node.bytes > 0:
        return True
    return node.name.removesuffix(" (async)").strip() in COLLECTIVES


#: The key prefix of a region's own time across ranks (:func:`own_times`).
OWN = "/own/"
#: The key prefix of a phase's step-to-step spread across ranks (:func:`noise`).
NOISE = "/noise/"


def noise(nodes: Iterable[Node], steps: int) -> dict[str, float]:
    """``"/noise/<path>"`` → the standard deviation of the path's time per step (its calls'
    spread, times the square root of its calls per step), for the regions of the first two
    levels that are not collectives: what a straggler's excess must stand out of."""
    if steps <= 0:
        return {}
    out = {}
    for node in nodes:
        if node.count >= 2 and node.path.count("/") <= 1 and not is_collective(node):
            out[NOISE + node.path] = step_spread(node, steps)
    return out


def step_spread(node: Node, steps: int) -> float:
    """The standard deviation of ``node``'s time per step over ``steps`` steps (its
    calls' spread times the square root of its calls per step; 0.0 under two calls), in
    the unit of its per-call figures."""
    if steps <= 0 or node.count < 2:
        return 0.0
    return float(node.std * (node.count / steps) ** 0.5)


def own_times(nodes: Iterable[Node]) -> dict[str, float]:
    """``"/own/<path>"`` → the path's total less its waiting, for each region that contains a
    collective. DDP's ``backward`` holds its gradient all-reduce, which the fast ranks spend
    waiting for the slow one: by its total, the ranks that waited longest look the slowest.
    Its own time, the waiting taken out, is what the slowest rank and the straggler scores
    compare. The waiting is the time the concurrent (async) collectives below the region
    cover, their overlaps counted once (``Node.concurrent_time`` of the nodes holding them),
    plus the totals of the synchronous ones (the outermost below it)."""
    nodes = list(nodes)
    collectives = [node for node in nodes if is_collective(node)]
    if not collectives:
        return {}
    paths = [node.path for node in collectives]
    totals = {node.path: node.total for node in nodes}
    waited: dict[str, float] = {}
    for node in collectives:
        if any(node.path.startswith(c + "/") for c in paths):
            continue  # inside another collective: counted with it
        wait = 0.0 if node.concurrent else node.total  # async ones: once, by their parent
        for above in _above(node.path):
            if above in totals:
                waited[above] = waited.get(above, 0.0) + wait
    for node in nodes:  # (waited holds the regions with a collective, none inside one)
        if node.concurrent_time > 0.0 and node.path in waited:
            for above in (node.path, *_above(node.path)):
                if above in waited:
                    waited[above] += node.concurrent_time
    return {OWN + path: max(totals[path] - wait, 0.0) for path, wait in waited.items()}


def _above(path: str) -> list[str]:
    """The paths above ``path``, innermost last: ``"a/b/c"`` → ``["a", "a/b"]``."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


@dataclass(frozen=True)
class Scores:
    """This rank's scores for one region in one interval."""

    relative: float
    individual: float


def _ratio(best: float, mine: float) -> float:
    return 1.0 if mine <= 0.0 else min(best / mine, 1.0)


class Tracker:
    """This rank's straggler state over the intervals (O(paths) memory)."""

    def __init__(self, threshold: float, intervals: int, min_share: float = 0.01) -> None:
        self.threshold = threshold
        self.intervals = intervals
        self.min_share = min_share
        self._best: dict[str, float] = {}
        self._below: dict[str, int] = {}
        self._last: dict[str, float] = {}

    def update(
        self,
        mine: Mapping[str, float],
        fastest: Mapping[str, float],
        slowest: Mapping[str, float],
        skip: frozenset[str] | set[str] = frozenset(),
    ) -> dict[str, Scores]:
        """Score this interval: ``mine``, ``fastest`` and ``slowest`` map region paths to
        this rank's, the lowest and the highest total; ``skip`` holds paths not to score
        (collectives). Returns the scores of the scored paths."""
        floor = self.min_share * max(slowest.values(), default=0.0)
        out: dict[str, Scores] = {}
        for path, value in mine.items():
            low = fastest.get(path)
            if path in skip or low is None or slowest.get(path, 0.0) < floor or floor <= 0:
                continue
            best = min(self._best.get(path, value), value)
            self._best[path] = best
            out[path] = Scores(_ratio(low, value), _ratio(best, value))
        below = {
            path: self._below.get(path, 0) + 1
            for path, score in out.items()
            if score.relative < self.threshold
        }
        self._below = below
        self._last = {path: out[path].relative for path in below}
        return out

    def slow_regions(self) -> list[tuple[str, float, int]]:
        """``(path, relative score, consecutive intervals)`` of the regions in which this
        rank is a straggler now, slowest first."""
        found = [
            (path, self._last[path], count)
            for path, count in self._below.items()
            if count >= self.intervals
        ]
        return sorted(found, key=lambda item: (item[1], item[0]))
