"""Is a region slower, or is it noise? A bootstrap comparison of two runs.

Each run gives, per region, one value per report (its time per step in that interval).
The effect is the difference of the two runs' medians over their reports — a burst of
load from other processes that slows a few intervals moves a mean, not a median — and
its confidence interval comes from resampling each run's reports with replacement
(percentile bootstrap, a fixed seed so the same files always give the same answer). An
interval that leaves out zero is *significant*. A side with more
than :data:`MAX_SAMPLES` reports is thinned to that many evenly spaced order statistics
first (a wider interval, never a narrower one). The resampling runs in torch, the regions
together (:func:`shifts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Reports per side used for resampling (quantile-thinned beyond this).
MAX_SAMPLES = 120
#: Resamples per comparison.
RESAMPLES = 2000
#: Two-sided confidence level of the interval.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Shift:
    """How far run B's median sits from run A's: ``estimate`` with its interval
    ``[low, high]`` (same unit as the samples), ``baseline``: run A's median, and the
    interval of the relative change ``[low_percent, high_percent]`` (B's median over A's,
    resampled; ``None`` when A's median is zero)."""

    estimate: float
    low: float
    high: float
    baseline: float
    low_percent: float | None = None
    high_percent: float | None = None

    @property
    def significant(self) -> bool:
        """The interval leaves out zero."""
        return self.low > 0.0 or self.high < 0.0

    def percent(self, value: float) -> float | None:
        """``value`` relative to the baseline, in percent (``None`` for a zero baseline)."""
        return None if self.baseline <= 0.0 else 100.0 * value / self.baseline

    def beyond(self, threshold: float) -> str:
        """ "slower" / "faster" when the whole interval lies more than ``threshold``
        percent above / below the baseline (significant *and* above the threshold even
        at the interval's near end), else ""."""
        low, high = self.low_percent, self.high_percent
        if low is not None and low > threshold:
            return "slower"
        if high is not None and high < -threshold:
            return "faster"
        return ""


def thin(values: Sequence[float], limit: int = MAX_SAMPLES) -> list[float]:
    """``values`` sorted, or ``limit`` evenly spaced order statistics of them."""
    ordered = sorted(values)
    n = len(ordered)
    if n <= limit:
        return ordered
    return [ordered[round(i * (n - 1) / (limit - 1))] for i in range(limit)]


def _middle(picks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each resample (a row of indices into a sorted sample), the indices of its two
    middle order statistics (the same one twice for an odd size): a resample of a sorted
    sample is ordered as its indices are, so its median is known without its values."""
    ordered = picks.sort(dim=1).values
    size = picks.shape[1]
    return ordered[:, (size - 1) // 2], ordered[:, size // 2]


def _medians(samples: list[list[float]], middle: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Each sorted sample's resampled medians, ``[len(samples), RESAMPLES]``, as
    ``quantile(0.5)`` of the resampled values gives them."""
    stacked = torch.tensor(samples, dtype=torch.float64)
    low, high = middle
    return torch.lerp(stacked[:, low], stacked[:, high], 0.5)


def _median(values: Sequence[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(0.5))


def shifts(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> list[Shift]:
    """:func:`shift` of each ``(a, b)`` pair, the same as one at a time but resampled
    together: the pairs whose sides have the same sizes share their resampling picks (as
    one pair alone draws them from ``seed``), so 500 regions over 1,000 reports take about
    a second.

    Raises ``ValueError`` when a side is empty.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if any(not a or not b for a, b in pairs):
        raise ValueError("shift needs at least one value on each side")
    thinned = [(thin(a), thin(b)) for a, b in pairs]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (a, b) in enumerate(thinned):
        groups.setdefault((len(a), len(b)), []).append(i)
    tail = (1.0 - confidence) / 2
    levels = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
    out: list[Shift | None] = [None] * len(pairs)
    for (size_a, size_b), members in groups.items():
        generator = torch.Generator().manual_seed(seed)
        middle_a = _middle(torch.randint(size_a, (RESAMPLES, size_a), generator=generator))
        middle_b = _middle(torch.randint(size_b, (RESAMPLES, size_b), generator=generator))
        medians_a = _medians([thinned[i][0] for i in members], middle_a)
        medians_b = _medians([thinned[i][1] for i in members], middle_b)
        bounds = torch.quantile(medians_b - medians_a, levels, dim=1)  # [2, members]
        for row, i in enumerate(members):
            before, after = pairs[i]
            out[i] = _shift(before, after, medians_a[row], medians_b[row], bounds[:, row], levels)
    return [found for found in out if found is not None]


def _shift(
    a: Sequence[float],
    b: Sequence[float],
    medians_a: torch.Tensor,
    medians_b: torch.Tensor,
    bounds: torch.Tensor,
    levels: torch.Tensor,
) -> Shift:
    """One pair's :class:`Shift` from its resampled medians and the interval's bounds."""
    low, high = float(bounds[0]), float(bounds[1])
    median_a, median_b = _median(a), _median(b)
    estimate = median_b - median_a
    # the quantiles of a constant sample can land a rounding error off the estimate
    low, high = min(low, estimate), max(high, estimate)
    if median_a <= 0.0 or bool((medians_a <= 0.0).any()):
        return Shift(estimate, low, high, median_a)
    ratio = 100.0 * (medians_b / medians_a - 1.0)
    low_pct, high_pct = (float(x) for x in torch.quantile(ratio, levels))
    percent = 100.0 * estimate / median_a
    return Shift(estimate, low, high, median_a, min(low_pct, percent), max(high_pct, percent))


def shift(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0
) -> Shift:
    """The difference of medians from ``a`` to ``b`` with its bootstrap interval.

    Raises ``ValueError`` when either side is empty.
    """
    return shifts([(a, b)], confidence, seed)[0]
