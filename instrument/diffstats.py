"""Is a region slower, or is it noise? A bootstrap comparison of two runs.

Each run gives, per region, one value per report (its time per step in that interval).
The effect is the difference of the two runs' medians over their reports — a burst of
load from other processes that slows a few intervals moves a mean, not a median — and
its confidence interval comes from resampling each run's reports with replacement
(percentile bootstrap, a fixed seed so the same files always give the same answer). An
interval that leaves out zero is *significant*. A side with more
than :data:`MAX_SAMPLES` reports is thinned to that many evenly spaced order statistics
first (a wider interval, never a narrower one). The resampling runs in torch, so a diff
of 500 regions over 1,000 reports takes about a second.
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


def _resampled_medians(values: Sequence[float], generator: torch.Generator) -> torch.Tensor:
    sample = torch.tensor(thin(values), dtype=torch.float64)
    picks = torch.randint(len(sample), (RESAMPLES, len(sample)), generator=generator)
    return sample[picks].quantile(0.5, dim=1)


def _median(values: Sequence[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(0.5))


def shift(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0
) -> Shift:
    """The difference of medians from ``a`` to ``b`` with its bootstrap interval.

    Raises ``ValueError`` when either side is empty.
    """
    if not a or not b:
        raise ValueError("shift needs at least one value on each side")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    generator = torch.Generator().manual_seed(seed)
    medians_a, medians_b = _resampled_medians(a, generator), _resampled_medians(b, generator)
    tail = (1.0 - confidence) / 2
    levels = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
    low, high = (float(x) for x in torch.quantile(medians_b - medians_a, levels))
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
