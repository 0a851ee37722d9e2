"""The thresholds of every diagnosis rule, in one table (docs/diagnosis.md lists them)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class Thresholds:
    """When each finding is raised. Shares are fractions of the step (0..1), times seconds.

    A finding that holds stays until its figure falls below ``hysteresis`` times its
    threshold (:meth:`relaxed`), so it does not flap between consecutive reports.

    Example:
        >>> instrument.auto(model, optimizer, diagnose=Thresholds(input_share=0.4))
    """

    #: ``data`` at least this share of the step (lowest over ranks): input_bound, warning.
    input_share: float = 0.5
    #: ... at least this share: critical.
    input_critical: float = 0.7
    #: The largest phase at least this share: compute_bound (info).
    compute_share: float = 0.5
    #: ``optimizer`` or ``zero_grad`` at least this share: compute_bound, warning (a plain
    #: AdamW on a small model takes 35-40 % of a healthy step).
    optimizer_share: float = 0.5
    #: ``(other)`` at least this share: residual_heavy, warning.
    residual_share: float = 0.4
    #: ... at least this share: critical.
    residual_critical: float = 0.7
    #: Time with a collective in flight (async overlap counted once) at least this share:
    #: collective_wait, warning.
    collective_share: float = 0.7
    #: ... unless the rank that spends least in the largest collective spends under this
    #: share of what the rank that spends most does: then the others mostly wait for it
    #: (info; the straggler rule judges that rank).
    collective_even: float = 0.5
    #: A phase's own time on its slowest rank over its fastest rank's, at least this share
    #: of the step ...
    straggler_excess: float = 0.2
    #: ... and at least this ratio ...
    straggler_ratio: float = 1.5
    #: ... and at least this many times the phase's step-to-step spread (its standard
    #: deviation per step, the largest over the ranks), in two consecutive reports:
    #: straggler, warning (critical from 3x the excess).
    straggler_noise: float = 1.0
    #: A step at least this many times the median step ...
    stall_ratio: float = 5.0
    #: ... and at least this much longer (seconds) ...
    stall_min: float = 0.02
    #: ... with the stalls at least this share of the interval's time: stalls, warning.
    stall_share: float = 0.1
    #: Reports a trend needs (after the skipped first one).
    trend_reports: int = 6
    #: How steadily a trend must move: Kendall's tau of the series at least this.
    trend_tau: float = 0.6
    #: Step time grown by at least this fraction over the run: slowdown (a warning when one
    #: region's share of the step grew steadily by ``slowdown_share``, else info: the whole
    #: step slowed alike).
    slowdown_growth: float = 0.25
    #: ... the growth of that region's share of the step ...
    slowdown_share: float = 0.1
    #: ... with Kendall's tau of its share at least this ...
    slowdown_tau: float = 0.8
    #: ... and its own time's growth at least this fraction of the step's growth.
    slowdown_explains: float = 0.5
    #: A jump of the step time by ``slowdown_growth`` is a change point (slowdown, dated
    #: where it began) once this many reports show the new level ...
    change_reports: int = 2
    #: ... every one above every report before it, by a gap at least this many times the
    #: spread on either side (a gradual drift spreads, a jump does not).
    change_gap: float = 2.0
    #: A change point naming a region is a warning from this growth of the step (a busy
    #: machine moves a short run's step by half), else info.
    change_growth: float = 1.0
    #: Memory grown at least this many bytes over the run ...
    memory_growth: int = 32 * MIB
    #: ... with Kendall's tau at least this: memory_creep, warning ...
    memory_tau: float = 0.8
    #: ... and the later half of the run still growing, as steadily, by at least this
    #: share of ``memory_growth`` (memory that levelled off is no creep).
    memory_still: float = 0.5
    #: Memory at least this share of the device's or host's capacity: memory_pressure.
    pressure_share: float = 0.9
    #: A finding that holds stays until its figure is below this times its threshold.
    hysteresis: float = 0.8

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"threshold {f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"threshold {f.name} must be a finite number >= 0, got {value!r}")
        if not 0.0 < self.hysteresis <= 1.0:
            raise ValueError(f"threshold hysteresis must be in (0, 1], got {self.hysteresis!r}")
        if self.trend_reports < 3:
            raise ValueError(f"threshold trend_reports must be >= 3, got {self.trend_reports!r}")
        if self.change_reports < 1:
            raise ValueError(f"threshold change_reports must be >= 1, got {self.change_reports!r}")

    def relaxed(self) -> Thresholds:
        """The thresholds a finding that already holds must stay above: shares, seconds and
        bytes times ``hysteresis``; ratios (above 1) moved toward 1 by the same factor;
        counts and taus as they are."""
        h = self.hysteresis
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _KEPT:
                continue
            if f.name in _RATIOS:
                changes[f.name] = 1.0 + (value - 1.0) * h
            elif isinstance(value, int):
                changes[f.name] = int(value * h)
            else:
                changes[f.name] = value * h
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls, items: list[str]) -> Thresholds:
        """From ``["input_share=0.4", ...]`` (the CLI's ``--threshold``)."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        changes: dict[str, Any] = {}
        for item in items:
            name, sep, text = item.partition("=")
            if not sep or name not in names:
                raise ValueError(
                    f"unknown threshold {item!r}; expected NAME=VALUE with NAME one of "
                    + ", ".join(names)
                )
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"threshold {name} must be a number, got {text!r}") from None
            default = getattr(cls(), name)
            changes[name] = int(value) if isinstance(default, int) else value
        return cls(**changes)


_RATIOS = frozenset({"straggler_ratio", "stall_ratio"})
_KEPT = frozenset(
    {
        "trend_reports",
        "trend_tau",
        "slowdown_tau",
        "memory_tau",
        "memory_still",
        "collective_even",
        "change_reports",
        "change_gap",
        "hysteresis",
    }
)
