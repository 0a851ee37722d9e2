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
    ask to be cheaper than every peer)."""

    label: str
    fn: Callable[[], object]
    setup: Callable[[], object] | None = None
    inner: int = INNER
    baseline: bool = False
    floor: bool = False
    peer: bool = False
    note: str = ""


def run_paired(
    contenders: Sequence[Contender], *, rounds: int = ROUNDS, warmup_rounds: int = WARMUP_ROUNDS
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Time every contender once per round, in an order rotating by one each round; return
    one summary per contender (``report_ratios.py``'s ``paired_rows``) and each contender's
    ns per operation, round by round."""
    bases = [c for c in contenders if c.baseline]
    if len(bases) != 1:
        raise ValueError("a paired group needs exactly one baseline contender")
    base = bases[0]
    per_op: dict[str, list[float]] = {c.label: [] for c in contenders}
    n = len(contenders)
    for r in range(warmup_rounds + rounds):
        for i in range(n):
            contender = contenders[(i + r) % n]
            if contender.setup is not None:
                contender.setup()
            start = perf_counter_ns()
            contender.fn()
            elapsed = perf_counter_ns() - start
            if r >= warmup_rounds:
                per_op[contender.label].append(elapsed / contender.inner)
    summary = []
    for c in contenders:
        ratios = [a / b for a, b in zip(per_op[c.label], per_op[base.label], strict=True)]
        summary.append(
            {
                "label": c.label,
                "min_ns": min(per_op[c.label]),
                "median_ns": statistics.median(per_op[c.label]),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(per_op[c.label]) / min(per_op[base.label]),
                "rounds": rounds,
                "baseline": c.baseline,
                "floor": c.floor,
                "peer": c.peer,
                "note": c.note,
            }
        )
    return summary, per_op
