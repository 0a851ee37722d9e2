"""Baseline and contenders timed interleaved, in the same rounds (the ``paired`` fixture).

Separately measured rows drift by 20-30 % between runs on a shared machine; a ratio taken
inside each round, with the order rotating from round to round, does not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

#: Operations per timed round (the loop inside each benchmarked function).
INNER = 1000
#: Timed rounds per benchmark, and untimed warm-up rounds before them.
ROUNDS = 300
WARMUP_ROUNDS = 30


@dataclass(frozen=True)
class Contender:
    """One row of a paired group: ``fn`` performs ``inner`` operations; ``setup`` runs
    untimed before each of its rounds. ``peer``: another library's timer (the targets may
    ask to be cheaper than every peer). ``above``: the label of the row whose cost this one
    adds to (a plain call under a decorator, an empty loop under a ``with``); in a group
    whose baseline names one, ratios compare added costs (see :func:`run_paired`)."""

    label: str
    fn: Callable[[], object]
    setup: Callable[[], object] | None = None
    inner: int = INNER
    baseline: bool = False
    floor: bool = False
    peer: bool = False
    note: str = ""
    above: str | None = None


def run_paired(
    contenders: Sequence[Contender],
    *,
    rounds: int = ROUNDS,
    warmup_rounds: int = WARMUP_ROUNDS,
    clock: Callable[[], int] = perf_counter_ns,
    interleave: int = 1,
    block: int = 1,
    settle: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Time every contender once per round, in an order rotating by one each round; return
    one summary per contender (``report_ratios.py``'s ``paired_rows``) and each contender's
    ns per operation, round by round.

    A ratio is the median of the per-round ratios to the baseline. When the baseline is
    measured ``above`` another row, ratios compare costs added above each row's ``above``
    row instead (a row without one adds its whole cost): the median over rounds of a row's
    added cost (its time minus its ``above`` row's, in the same round) divided by the
    baseline's — a difference per round cancels the machine's drift, the medians its
    outliers.

    ``clock`` times the rounds: wall time by default; ``time.thread_time_ns`` (CPU time of
    this thread) for rounds long enough to be preempted many times on a shared machine.
    ``interleave``: a round gives each contender that many turns, alternating contenders
    turn by turn; a turn is the contender's ``setup``, then ``settle`` untimed calls of its
    ``fn``, then ``block`` timed ones; a round's time is the sum of the timed calls — for
    operations as long as a training step, whose cost drifts within a round. ``settle``
    keeps out of the figures what a call costs right after another contender's (its code
    and data evicted by the other's, not its own steady cost)."""
    if block < 1 or settle < 0:
        raise ValueError(f"block must be >= 1 and settle >= 0, got {block} and {settle}")
    bases = [c for c in contenders if c.baseline]
    if len(bases) != 1:
        raise ValueError("a paired group needs exactly one baseline contender")
    base = bases[0]
    labels = {c.label for c in contenders}
    for c in contenders:
        if c.above is not None and (c.above not in labels or c.above == c.label):
            raise ValueError(f"{c.label!r} is measured above {c.above!r}, not another row")
    per_op: dict[str, list[float]] = {c.label: [] for c in contenders}
    n = len(contenders)
    for r in range(warmup_rounds + rounds):
        order = [contenders[(i + r) % n] for i in range(n)]
        spent = dict.fromkeys(labels, 0)
        for _ in range(interleave):
            for contender in order:
                if contender.setup is not None:
                    contender.setup()
                for _ in range(settle):
                    contender.fn()
                for _ in range(block):
                    start = clock()
                    contender.fn()
                    spent[contender.label] += clock() - start
        if r >= warmup_rounds:
            for c in contenders:
                per_op[c.label].append(spent[c.label] / (c.inner * interleave * block))
    summary = []
    for c in contenders:
        if base.above is None:
            ratios = [a / b for a, b in zip(per_op[c.label], per_op[base.label], strict=True)]
            ratio_median = statistics.median(ratios)
            ratio_min = min(per_op[c.label]) / min(per_op[base.label])
        else:
            ratio_median = statistics.median(_added(c, per_op)) / statistics.median(
                _added(base, per_op)
            )
            ratio_min = _added_min(c, per_op) / _added_min(base, per_op)
        summary.append(
            {
                "label": c.label,
                "min_ns": min(per_op[c.label]),
                "median_ns": statistics.median(per_op[c.label]),
                "ratio_median": ratio_median,
                "ratio_min": ratio_min,
                "rounds": rounds,
                "baseline": c.baseline,
                "floor": c.floor,
                "peer": c.peer,
                "note": c.note,
                "above": c.above,
            }
        )
    return summary, per_op


def _added(c: Contender, per_op: dict[str, list[float]]) -> list[float]:
    """``c``'s cost above its ``above`` row, round by round."""
    if c.above is None:
        return per_op[c.label]
    return [a - b for a, b in zip(per_op[c.label], per_op[c.above], strict=True)]


def _added_min(c: Contender, per_op: dict[str, list[float]]) -> float:
    """``c``'s least time minus its ``above`` row's least time."""
    return min(per_op[c.label]) - (0.0 if c.above is None else min(per_op[c.above]))
