"""Streaming statistics per path: exact count/total/min/max/variance and a log histogram.

Durations are integer nanoseconds. Sums are exact integers, so totals and variance are
exact whatever the number of calls. Percentiles come from a fixed histogram of
``NBUCKETS`` log-linear buckets — 8 per doubling, the exponent and top 3 mantissa bits of
the duration as a double (at most 12.5 % wide) — covering 1 ns to about 68 hours (longer
durations share the last bucket); memory does not depend on the number of calls. The C
accelerator (``_speedups``) uses the very same buckets, so both paths give the same
numbers.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_object_new = object.__new__

BUCKETS_PER_OCTAVE = 8
NBUCKETS = 384
_MANTISSA_SHIFT = 49  # keep the 11 exponent bits and the top 3 mantissa bits
_ONE = 1023 << 3  # (bits of 1.0) >> 49
_shift = _MANTISSA_SHIFT.__rrshift__


def bucket_counts(values: Sequence[int]) -> Counter[int]:
    """Histogram of non-negative ns durations: bucket 0 holds 0, bucket b >= 1 holds
    ``lower(b) <= v < lower(b + 1)`` (see :func:`bucket_bounds`), the last bucket the rest."""
    bits = array("q")
    bits.frombytes(array("d", values).tobytes())
    raw = Counter(map(_shift, bits))
    out: Counter[int] = Counter()
    for key, n in raw.items():
        out[0 if key == 0 else min(key - _ONE + 1, NBUCKETS - 1)] += n
    return out


def _from_bits(key: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", key << _MANTISSA_SHIFT))[0])


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The [lower, upper) range of a bucket, in ns."""
    if bucket == 0:
        return 0.0, 1.0
    return _from_bits(bucket + _ONE - 1), _from_bits(bucket + _ONE)


QUANTILES = (0.5, 0.9, 0.99)
_MIDDLE = [sum(bucket_bounds(b)) / 2 for b in range(NBUCKETS)]  # what a bucket stands for


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
        if lo < 0:  # a clock swapped mid-region; durations are never negative
            values = [max(v, 0) for v in values]
            lo = 0
        hi = max(values)
        if self.count:
            self.min = min(self.min, lo)
            self.max = max(self.max, hi)
        else:
            self.min, self.max = lo, hi
        self.count += len(values)
        self.total += sum(values)
        self.sumsq += sum(map(operator.mul, values, values))
        self.hist.update(bucket_counts(values))

    def merge(self, other: Accumulator) -> None:
        """Add what ``other`` holds, as if its durations had been added here."""
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

    def summary(self) -> Summary | None:
        """``(count, total ns, mean, min, max, std, p50, p90, p99)`` (seconds but the exact
        integer total; see :func:`stats_of`), ``None`` without calls. The C path node's
        ``take()`` returns the very same numbers."""
        n = self.count
        if not n:
            return None
        variance = (n * self.sumsq - self.total * self.total) / (n * n)  # exact integers
        p50, p90, p99 = self.quantiles(QUANTILES)
        return (
            n,
            self.total,
            self.total / n / 1e9,
            self.min / 1e9,
            self.max / 1e9,
            math.sqrt(max(variance, 0.0)) / 1e9,
            p50 / 1e9,
            p90 / 1e9,
            p99 / 1e9,
        )

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Several quantiles in ns (ascending ``qs``) in one pass over the histogram: the
        middle of the bucket the quantile falls in, clamped to [min, max]."""
        if not self.count:
            return [0.0] * len(qs)
        out: list[float] = []
        buckets = iter(sorted(self.hist.items()))
        seen = 0
        bucket = 0
        for q in qs:
            rank = q * self.count
            while seen < rank:
                found = next(buckets, None)
                if found is None:
                    break
                bucket, n = found
                seen += n
            if seen < rank:
                out.append(float(self.max))
                continue
            out.append(float(min(max(_MIDDLE[bucket], self.min), self.max)))
        return out

    def to_stats(self, extra_ns: int = 0) -> Stats:
        """Freeze into a :class:`Stats` in seconds; ``extra_ns`` is added to the total only
        (see :func:`stats_of`)."""
        return stats_of(self.summary(), extra_ns)


#: What a path recorded in an interval, ready for :func:`stats_of`: ``(count, total ns,
#: mean, min, max, std, p50, p90, p99)``, the times but the total in seconds.
Summary = tuple[int, int, float, float, float, float, float, float, float]


def stats_of(summary: Summary | None, extra_ns: int = 0) -> Stats:
    """A :class:`Stats` from a summary (``None``: no calls); ``extra_ns`` is added to the
    total only (the open-region split of an interval: time that belongs to no finished call
    here, or minus time reported earlier). The total never goes below 0."""
    if summary is None:
        return _EMPTY if extra_ns <= 0 else dataclasses.replace(_EMPTY, total=extra_ns / 1e9)
    total_ns = summary[1] + extra_ns if extra_ns else summary[1]
    return _new(
        summary[0],
        (total_ns if total_ns > 0 else 0) / 1e9,
        summary[2],
        summary[3],
        summary[4],
        summary[5],
        summary[6],
        summary[7],
        summary[8],
    )


def from_figures(
    count: int, total_ns: int, figures: Sequence[float], at: int, per_step: float = 1.0
) -> Stats:
    """A :class:`Stats` of ``count`` calls (> 0) totalling ``total_ns`` (never below 0) times
    ``per_step``, with the mean, min, max, std, p50, p90 and p99 in seconds at
    ``figures[at : at + 7]`` (the registry's columns; :func:`stats_of` of the same summary,
    without the tuple)."""
    return _new(
        count,
        (total_ns if total_ns > 0 else 0) / 1e9 * per_step,
        figures[at],
        figures[at + 1],
        figures[at + 2],
        figures[at + 3],
        figures[at + 4],
        figures[at + 5],
        figures[at + 6],
    )


def _new(
    count: int,
    total: float,
    mean: float,
    min: float,
    max: float,
    std: float,
    p50: float,
    p90: float,
    p99: float,
) -> Stats:
    """``Stats(...)`` without the frozen dataclass's per-field ``__setattr__`` (the flush
    builds one or two per path): the fields set in the instance's own ``__dict__`` in their
    declared order, which keeps it a key-sharing dict (a third cheaper than a dict made
    apart and set as ``__dict__``)."""
    stats = _object_new(Stats)
    state = stats.__dict__  # (three a line compile without a tuple)
    state["count"], state["total"], state["mean"] = count, total, mean
    state["min"], state["max"], state["std"] = min, max, std
    state["p50"], state["p90"], state["p99"] = p50, p90, p99
    return stats


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
        return _EMPTY

    def with_total(self, total: float) -> Stats:
        """The same statistics with another ``total`` (per-step normalization)."""
        return _new(
            self.count,
            total,
            self.mean,
            self.min,
            self.max,
            self.std,
            self.p50,
            self.p90,
            self.p99,
        )

    def scaled(self, factor: float) -> Stats:
        """Every time multiplied by ``factor``; the count unchanged."""
        return _new(
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
        """JSON-safe dict of the stored fields (``dataclasses.asdict``'s, without its
        recursive copy: a report writes one or two per path)."""
        return {
            "count": self.count,
            "total": self.total,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
            "std": self.std,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
        }

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


_EMPTY = Stats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
