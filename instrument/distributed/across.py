"""The cross-rank step of a flush: a protocol with a deadline, never a hang or a crash.

1. **Agree** (:mod:`~instrument.distributed.agree`, on the store, bounded by ``timeout``):
   every rank of the group is at the same interval; their path lists match or not.
2. Only then the collectives (:mod:`~instrument.distributed.reduce`): the union of the
   path lists when they differ, one ``MAX`` and one ``SUM`` all-reduce for min, max,
   arg-ranks, mean and the number of stragglers, and with ``ranks="all"`` a gather of the
   per-rank values to the group's first rank.
3. Straggler scores (:mod:`~instrument.distributed.stragglers`) on each rank for itself;
   the ranks that stayed slow describe themselves on the store, and the first rank reads
   them after the ``SUM`` that counts them.

A missing or out-of-step rank, a broken store or a failing collective: the report stays
this rank's own, ``report.across_note`` says why and names the ranks, a warning is logged
once per distinct cause, and the next flush tries again. Nothing raises into training.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
from typing import Any

import torch.distributed as dist

from instrument.distributed import agree, reduce
from instrument.distributed.stragglers import (
    NOISE,
    OWN,
    Tracker,
    is_collective,
    noise,
    own_times,
)
from instrument.hooks.collectives import suppressed
from instrument.report import Node, RankStats, Report, Straggler
from instrument.stats import Stats

logger = logging.getLogger("instrument")

#: A straggler describes at most this many of its slowest regions (bytes stay bounded).
REGIONS_PER_STRAGGLER = 3
#: The first rank reads the descriptions only when at most this many ranks are stragglers
#: (beyond that the report lists none and ``stragglers_count`` says how many there are).
LISTED_STRAGGLERS = 64

RATES = ("steps_per_sec", "samples_per_sec", "tokens_per_sec", "tflops", "mfu")


def active(group: Any = None) -> bool:
    """A process group of more than one rank is running and this rank is in it."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if group is not None and not isinstance(group, dist.ProcessGroup):
        return False  # GroupMember.NON_GROUP_MEMBER
    return dist.get_world_size(group) > 1 and dist.get_rank(group) >= 0


def extras(report: Report) -> dict[str, float]:
    """Rates and memory fields to combine, keyed ``"/throughput/<field>"`` and
    ``"/memory/<key>"`` (a leading "/" never starts a region path)."""
    out: dict[str, float] = {}
    rates = report.throughput
    if rates is not None:
        for name in RATES:
            value = getattr(rates, name)
            if value is not None:
                out[f"/throughput/{name}"] = float(value)
    for key, value in report.memory.items():
        out[f"/memory/{key}"] = float(value)
    out.update(own_times(report.nodes))
    out.update(noise(report.nodes, report.steps))
    return out


def across_key(key: str) -> str:
    """``"/throughput/tokens_per_sec"`` → ``"throughput.tokens_per_sec"``, ``"/own/step/
    backward"`` → ``"own.step/backward"``, ``"/noise/forward"`` → ``"noise.forward"`` (the
    key in ``report.across``)."""
    return key[1:].replace("/", ".", 1)


class CrossRank:
    """Combines one rank's reports with the other ranks' of ``group``, flush by flush."""

    def __init__(
        self,
        ranks: str,
        group: Any = None,
        *,
        timeout: float = 60.0,
        threshold: float = 0.8,
        intervals: int = 3,
        channel: str = "",
    ) -> None:
        self.ranks = ranks
        self.group = group
        self.channel = channel  # which reporter of each process this one meets
        self.timeout = timeout
        self.tracker = Tracker(threshold, intervals)
        self._warned: set[tuple[object, ...]] = set()  # causes warned about

    def combine(self, report: Report) -> Report:
        """``report`` with every path's values across the group, or ``report`` itself with a
        note when the ranks do not agree. Collective over the group; never raises."""
        try:
            if not active(self.group):
                return report
        except Exception:  # a group torch does not recognise: nothing to combine
            return report
        local = {node.path: node.total for node in report.nodes}
        more = extras(report)
        keys = [*report.paths(), *more]
        local.update(more)
        mine = agree.Arrival(
            index=report.index,
            first_step=report.step - report.steps,
            last_step=report.step,
            paths=reduce.path_hash(keys),
        )
        verdict = agree.agree(mine, self.timeout, self.group, self.channel)
        if not verdict.ok:
            cause = ("agree", verdict.missing, tuple(sorted(verdict.mismatched)), verdict.late)
            return self._alone(report, verdict.reason(self.timeout), cause)
        try:
            with suppressed():
                return self._collectives(report, keys, local, verdict)
        except Exception as exc:  # a broken group must not take training down
            why = f"a collective failed ({type(exc).__name__}: {exc})"
            return self._alone(report, why, ("collective", type(exc).__name__))

    def _alone(self, report: Report, why: str, cause: tuple[object, ...]) -> Report:
        first = cause not in self._warned
        self._warned.add(cause)
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "instrument: flush #%d (steps %d..%d) on rank %d reports this rank only: %s"
            "; training goes on, the next flush tries again%s",
            report.index,
            report.step - report.steps,
            report.step,
            report.rank,
            why,
            " (said once)" if first else "",
        )
        return dataclasses.replace(report, across_note=why)

    def _collectives(
        self, report: Report, keys: list[str], local: dict[str, float], verdict: agree.Verdict
    ) -> Report:
        group = self.group
        union = reduce.union(keys, group) if verdict.paths_differ else keys
        values = [local.get(key) for key in union]
        ends = reduce.extremes(values, group)
        by_path = {node.path: node for node in report.nodes}
        # a region holding a collective is compared by its own time (own_times)
        own = {key[len(OWN) :]: i for i, key in enumerate(union) if key.startswith(OWN)}
        spread = {key[len(NOISE) :]: i for i, key in enumerate(union) if key.startswith(NOISE)}
        per_step = 1.0 if report.normalizer == "steps" or not report.steps else 1 / report.steps
        fastest, slowest, mine, skip = {}, {}, {}, set()
        calm: set[str] = set()  # no rank slower than chance
        for i, key in enumerate(union):
            if key.startswith("/"):
                continue
            j = own.get(key, i)
            value, end = values[j], ends[j]
            if end is None:
                continue
            fastest[key], slowest[key] = end.low, end.high
            if value is not None:
                mine[key] = value
            if is_collective(by_path.get(key) or Node(path=key, host=Stats.empty())):
                skip.add(key)  # waiting, not work: never a straggler's region
            elif end.high - end.low < _noise(ends, spread.get(key)) / per_step:
                skip.add(key)  # the ranks differ less than one step from the next
                calm.add(key)
        scores = self.tracker.update(mine, fastest, slowest, skip)
        slow = self.tracker.slow_regions()
        if slow:
            self._describe(verdict.prefix, report.rank, slow)
        total, present, (stragglers,) = reduce.sums(values, [1.0 if slow else 0.0], group)
        per_rank = reduce.gather_to_first(values, group) if self.ranks == "all" else None
        count = round(stragglers)
        first = dist.get_rank(group) == 0
        listed = first and 0 < count <= LISTED_STRAGGLERS
        found = self._stragglers(verdict.prefix) if listed else ()
        nodes, across = [], {}
        for i, key in enumerate(union):
            end = ends[i]
            stats = None
            node = by_path.get(key) or Node(path=key, host=Stats.empty())
            if end is not None:
                score = scores.get(key)
                stats = RankStats(
                    rank_min=end.low,
                    rank_max=end.high,
                    rank_mean=total[i] / present[i],
                    rank_argmin=end.argmin,
                    rank_argmax=end.argmax,
                    ranks_present=present[i],
                    per_rank=None if per_rank is None else tuple(row[i] for row in per_rank),
                    slowest=None
                    if key in calm
                    else _slowest(node, end, ends[own[key]] if key in own else None),
                    relative_score=None if score is None else score.relative,
                    individual_score=None if score is None else score.individual,
                )
            if key.startswith("/"):
                if stats is not None:
                    across[across_key(key)] = stats
                continue
            nodes.append(dataclasses.replace(node, ranks=stats))
        return dataclasses.replace(
            report,
            nodes=tuple(nodes),
            ranks=self.ranks,
            across=across,
            group_size=dist.get_world_size(group),
            stragglers=found,
            stragglers_count=count if first else len(found),
        )

    def _describe(self, prefix: str, rank: int, slow: list[tuple[str, float, int]]) -> None:
        """Write this rank's slow regions to the store, for the group's first rank."""
        worst = slow[:REGIONS_PER_STRAGGLER]
        entry = {
            "rank": rank,
            "host": socket.gethostname(),
            "regions": [path for path, _, _ in worst],
            "scores": [score for _, score, _ in worst],
            "intervals": max(count for _, _, count in slow),
        }
        agree.append(prefix + "slow", json.dumps(entry) + "\n")

    def _stragglers(self, prefix: str) -> tuple[Straggler, ...]:
        lines = agree.read(prefix + "slow").splitlines()
        found = [Straggler.from_dict(json.loads(line)) for line in lines if line]
        return tuple(sorted(found, key=lambda s: s.rank))


def _noise(ends: list[reduce.Extremes | None], index: int | None) -> float:
    """The largest rank's step-to-step spread at ``index`` of ``ends`` (0.0 without one)."""
    found = None if index is None else ends[index]
    return 0.0 if found is None else found.high


def _slowest(node: Node, end: reduce.Extremes, own_end: reduce.Extremes | None) -> int:
    """The rank that held the others up in ``node``: the last to arrive in a collective
    (the shortest wait), else the longest own time (``own_end``: its time less its
    collectives', where it holds any), else the longest time."""
    if is_collective(node):
        return int(end.argmin)
    return int((own_end or end).argmax)
