"""Streaming statistics per path: exact count/total/min/max/variance and a log histogram.

Durations arrive in integer nanoseconds, in batches (the hot path only appends to a list).
Sums are Python integers, so totals and variance are exact whatever the number of calls.
Percentiles come from a histogram with ``BUCKETS_PER_OCTAVE`` buckets per doubling
(about ±4.5 % relative error), whose size depends on the range of durations, not on
how many there are: at most ~350 buckets cover 1 ns to 3 hours.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

BUCKETS_PER_OCTAVE = 8
_scale = float(BUCKETS_PER_OCTAVE).__mul__
_plus_one = (1).__add__

QUANTILES = (0.5, 0.9, 0.99)


class Accumulator:
    """Mutable running statistics over integer nanosecond durations.

    Not thread-safe by itself: the registry only touches it under its lock.
    """

    __slots__ = ("count", "hist", "max", "min", "sumsq", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.sumsq = 0
        self.min = 0
        self.max = 0
        self.hist: Counter[int] = Counter()

    def add_batch(self, values: Sequence[int]) -> None:
        """Fold a batch of durations (ns) in, with C-speed builtins only."""
        if not values:
            return
        lo = min(values)
        hi = max(values)
        if self.count:
            self.min = min(self.min, lo)
            self.max = max(self.max, hi)
        else:
            self.min, self.max = lo, hi
        self.count += len(values)
        self.total += sum(values)
        self.sumsq += sum(map(operator.mul, values, values))
        # bucket b holds v with 2**(b/8) <= v + 1 < 2**((b+1)/8)
        self.hist.update(map(int, map(_scale, map(math.log2, map(_plus_one, values)))))

    def merge(self, other: Accumulator) -> None:
        """Add ``other`` into this accumulator (threads, ranks, late records)."""
        if not other.count:
            return
        if self.count:
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
        else:
            self.min, self.max = other.min, other.max
        self.count += other.count
        self.total += other.total
        self.sumsq += other.sumsq
        self.hist.update(other.hist)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in ns, estimated from the histogram and clamped to [min, max]."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for bucket in sorted(self.hist):
            seen += self.hist[bucket]
            if seen >= rank:
                mid = 2.0 ** ((bucket + 0.5) / BUCKETS_PER_OCTAVE) - 1.0
                return float(min(max(mid, self.min), self.max))
        return float(self.max)

    def to_stats(self) -> Stats:
        """Freeze into a :class:`Stats` in seconds."""
        n = self.count
        if not n:
            return Stats.empty()
        variance = (n * self.sumsq - self.total * self.total) / (n * n)  # exact integers
        p50, p90, p99 = (self.quantile(q) / 1e9 for q in QUANTILES)
        return Stats(
            count=n,
            total=self.total / 1e9,
            mean=self.total / n / 1e9,
            min=self.min / 1e9,
            max=self.max / 1e9,
            std=math.sqrt(max(variance, 0.0)) / 1e9,
            p50=p50,
            p90=p90,
            p99=p99,
        )


@dataclass(frozen=True)
class Stats:
    """Summary of a set of durations, in seconds. ``count`` is always the number of calls;
    ``mean`` is per call (``total`` may be normalized, see ``Reporter(normalizer=...)``)."""

    count: int
    total: float
    mean: float
    min: float
    max: float
    std: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def empty(cls) -> Stats:
        """Statistics of no calls."""
        return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def scaled(self, factor: float) -> Stats:
        """Every time multiplied by ``factor``; the count unchanged."""
        return Stats(
            self.count,
            self.total * factor,
            self.mean * factor,
            self.min * factor,
            self.max * factor,
            self.std * factor,
            self.p50 * factor,
            self.p90 * factor,
            self.p99 * factor,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the stored fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stats:
        """Inverse of :meth:`to_dict`."""
        return cls(
            count=int(data["count"]),
            total=float(data["total"]),
            mean=float(data["mean"]),
            min=float(data["min"]),
            max=float(data["max"]),
            std=float(data["std"]),
            p50=float(data["p50"]),
            p90=float(data["p90"]),
            p99=float(data["p99"]),
        )
