"""The accumulator: exact sums, bounded histogram, percentiles, merge."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from instrument.stats import NBUCKETS, Accumulator, Stats, bucket_counts


def test_exact_count_total_min_max_std() -> None:
    values = [1_000, 2_000, 3_000, 4_000]
    acc = Accumulator()
    acc.add_batch(values[:2])
    acc.add_batch(values[2:])
    s = acc.to_stats()
    assert (s.count, s.total, s.min, s.max) == (4, 10e-6, 1e-6, 4e-6)
    assert s.mean == pytest.approx(2.5e-6)
    assert s.std == pytest.approx(statistics.pstdev(values) / 1e9)


def test_percentiles_within_histogram_resolution() -> None:
    rng = random.Random(0)
    values = [int(rng.lognormvariate(13, 0.6)) for _ in range(20_000)]
    acc = Accumulator()
    for i in range(0, len(values), 1000):
        acc.add_batch(values[i : i + 1000])
    s = acc.to_stats()
    ordered = sorted(values)
    for q, got in ((0.5, s.p50), (0.9, s.p90), (0.99, s.p99)):
        exact = ordered[int(q * len(ordered)) - 1] / 1e9
        assert got == pytest.approx(exact, rel=0.1)


def test_histogram_size_is_independent_of_calls() -> None:
    acc = Accumulator()
    for _ in range(50):
        acc.add_batch(list(range(1, 100_000, 7)))
    buckets = len(acc.hist)
    acc.add_batch(list(range(1, 100_000, 7)) * 5)
    assert len(acc.hist) == buckets <= 8 * math.ceil(math.log2(100_000)) + 1


@given(
    st.lists(st.integers(min_value=0, max_value=10**12), min_size=0, max_size=50),
    st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=50),
)
def test_batches_add_up_to_one_batch(a: list[int], b: list[int]) -> None:
    left, both = Accumulator(), Accumulator()
    left.add_batch(a)
    left.add_batch(b)
    both.add_batch(a + b)
    assert left.to_stats() == both.to_stats()
    s = both.to_stats()
    assert s.min <= s.p50 <= s.p90 <= s.p99 <= s.max


def test_empty_and_round_trip() -> None:
    assert Accumulator().to_stats() == Stats.empty()
    acc = Accumulator()
    acc.add_batch([5, 10, 15])
    s = acc.to_stats()
    assert Stats.from_dict(s.to_dict()) == s
    assert s.scaled(0.5).total == s.total * 0.5
    assert s.scaled(0.5).count == 3


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=200))
def test_quantiles_are_within_a_bucket_of_the_exact_ones(values: list[int]) -> None:
    acc = Accumulator()
    acc.add_batch(values)
    ordered = sorted(values)
    estimates = acc.quantiles([0.5, 0.9, 0.99])
    assert estimates == [acc.quantiles([q])[0] for q in (0.5, 0.9, 0.99)]
    for q, estimate in zip((0.5, 0.9, 0.99), estimates, strict=True):
        exact = ordered[max(0, math.ceil(q * len(values)) - 1)]
        # the estimate is the middle of exact's bucket (<= 12.5 % wide), clamped to [min, max]
        assert abs(estimate - exact) <= max(0.0625 * exact, 1.0)


def test_scaled_multiplies_every_time_and_keeps_the_count() -> None:
    stats = Stats(4, 8.0, 2.0, 1.0, 3.0, 0.5, 2.0, 2.5, 3.0)
    assert stats.scaled(0.25) == Stats(4, 2.0, 0.5, 0.25, 0.75, 0.125, 0.5, 0.625, 0.75)


def test_to_stats_extra_moves_only_the_total() -> None:
    acc = Accumulator()
    acc.add_batch([1_000_000_000, 3_000_000_000])
    whole = acc.to_stats()
    split = acc.to_stats(-1_500_000_000)  # 1.5 s of these calls were reported earlier
    assert split.total == 2.5
    assert split == dataclasses.replace(whole, total=2.5)
    assert acc.to_stats(-(10**12)).total == 0.0  # never below zero
    assert Accumulator().to_stats(2_000_000_000) == Stats(0, 2.0, 0, 0, 0, 0, 0, 0, 0)
    assert Accumulator().to_stats(-5) == Stats.empty()


def test_negative_durations_count_as_zero_and_huge_ones_share_the_last_bucket() -> None:
    acc = Accumulator()
    acc.add_batch([-5, 3])  # a clock swapped mid-region
    assert (acc.count, acc.total, acc.min, acc.max, acc.sumsq) == (2, 3, 0, 3, 9)
    assert bucket_counts([0, 0]) == {0: 2}
    assert bucket_counts([2**60, 2**61]) == {NBUCKETS - 1: 2}  # beyond ~68 h: one bucket
    assert Stats.empty() == Stats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_to_dict_has_every_field_in_order_as_asdict() -> None:
    stats = Stats(3, 0.5, 0.25, 0.125, 1.5, 0.75, 0.2, 0.4, 0.45)
    assert stats.to_dict() == dataclasses.asdict(stats)
    assert list(stats.to_dict()) == [f.name for f in dataclasses.fields(Stats)]
    assert Stats.from_dict(stats.to_dict()) == stats
