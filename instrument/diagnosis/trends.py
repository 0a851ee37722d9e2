"""Trends over the run: step time or a region growing (slowdown), memory growing (creep).

A trend is judged on a series of (step, value) points, one per report (the first report,
the run's warm-up, left out): Kendall's tau says how steadily it moves (1.0: every later
point is higher), the Theil-Sen slope (the median of the pairwise slopes) how fast, both
robust to a noisy report. A series keeps at most :data:`POINTS` points: past that,
neighbours are averaged in pairs, so a long run costs bounded memory and time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from instrument.diagnosis.rules import ms, pct, size
from instrument.diagnosis.thresholds import Thresholds
from instrument.diagnosis.view import View
from instrument.findings import Finding

POINTS = 32
#: At most this many region paths are followed for slowdown (the largest when first seen).
PATHS = 128
#: A region is followed once it takes at least this share of the step.
FOLLOWED_SHARE = 0.02
MEMORY = (
    ("host_rss", "host RSS", "host_total"),
    ("device_allocated", "CUDA allocated", "device_total"),
    ("device_reserved", "CUDA reserved", "device_total"),
)


@dataclass(frozen=True)
class Trend:
    """A series' direction: Kendall's tau, the Theil-Sen slope (y per x), the fitted first
    and last values and the x span."""

    tau: float
    slope: float
    first: float
    last: float
    span: float

    @property
    def growth(self) -> float:
        """The fitted change over the series, relative to its fitted start (0 at a start of 0)."""
        return (self.last - self.first) / self.first if self.first > 0 else 0.0


class Series:
    """(x, y) points in x order, at most :data:`POINTS` (pairs of neighbours averaged
    beyond), and their trend. Kendall's score is kept as points arrive (each new point
    against the sorted earlier values) and the pairwise slopes are sorted in when a trend
    needs them, so a report adds O(n) work, not O(n²)."""

    __slots__ = ("_score", "_sloped", "_slopes", "_ys", "points")

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []
        self._ys: list[float] = []  # the values so far, sorted
        self._score = 0  # Kendall's S: concordant minus discordant pairs
        self._slopes: list[float] = []  # the pairwise slopes of points[: self._sloped], sorted
        self._sloped = 0

    def add(self, x: float, y: float) -> None:
        """Append a point."""
        points = self.points
        points.append((x, y))
        if len(points) <= POINTS:
            self._score_of(y)
            return
        pairs = zip(points[0::2], points[1::2], strict=False)
        merged = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2) for a, b in pairs]
        if len(points) % 2:
            merged.append(points[-1])
        self.points = merged
        self._ys, self._score, self._slopes, self._sloped = [], 0, [], 0
        for _, value in merged:
            self._score_of(value)

    def _score_of(self, y: float) -> None:
        ys = self._ys
        self._score += bisect.bisect_left(ys, y) - (len(ys) - bisect.bisect_right(ys, y))
        bisect.insort(ys, y)

    @property
    def spread(self) -> float:
        """The highest value less the lowest (0.0 without points)."""
        ys = self._ys
        return ys[-1] - ys[0] if ys else 0.0

    @property
    def tau(self) -> float:
        """Kendall's tau of the points (0.0 for fewer than 2)."""
        n = len(self.points)
        return self._score / (n * (n - 1) / 2) if n >= 2 else 0.0

    def trend(self, at_least: float | None = None) -> Trend | None:
        """The trend (``None`` for fewer than 3 points, or when ``at_least`` is given and
        Kendall's tau is below it: the slope is not worked out then)."""
        points = self.points
        if len(points) < 3:
            return None
        tau = self.tau
        if at_least is not None and tau < at_least:
            return None
        slopes = self._slopes
        for j in range(self._sloped, len(points)):
            xj, yj = points[j]
            for xi, yi in points[:j]:
                if xj != xi:
                    bisect.insort(slopes, (yj - yi) / (xj - xi))
        self._sloped = len(points)
        slope = _median(slopes) if slopes else 0.0
        intercept = _median(sorted([y - slope * x for x, y in points]))
        first, last = intercept + slope * points[0][0], intercept + slope * points[-1][0]
        return Trend(tau, slope, first, last, points[-1][0] - points[0][0])


def _jump(points: list[tuple[float, float]], t: Thresholds) -> tuple[int, float, float] | None:
    """Where a series of step times jumped up and stayed: the index of the first point at
    the new level and the medians before and after it, or ``None``. At least
    ``change_reports`` points after the jump, two before, every point after above every
    point before, by ``slowdown_growth`` of the median before, and by a gap wider than
    ``change_gap`` times the spread on either side (a steady drift spreads: its gaps are
    never wider than its spread; a jump does not)."""
    ys = [y for _, y in points]
    if len(ys) < 2 + t.change_reports or max(ys) < (1.0 + t.slowdown_growth) * min(ys):
        return None  # the usual case, at the cost of two passes
    best = None
    for at in range(2, len(ys) - t.change_reports + 1):
        before, after = ys[:at], ys[at:]
        gap = min(after) - max(before)
        spread = max(max(before) - min(before), max(after) - min(after))
        if gap <= 0 or gap <= t.change_gap * spread:
            continue
        low, high = _median(sorted(before)), _median(sorted(after))
        if high < (1.0 + t.slowdown_growth) * low:
            continue
        if best is None or gap > best[0]:
            best = (gap, at, low, high)
    return None if best is None else best[1:]


def _still_growing(series: Series, t: Thresholds) -> bool:
    """The later half of ``series`` grows too, steadily, by ``memory_still`` of the growth
    a memory trend needs: memory that rose and then levelled off (an allocator's high-water
    mark, a cache filled once) is no creep, however steady its rise was."""
    later = Series()
    for x, y in series.points[len(series.points) // 2 :]:
        later.add(x, y)
    needed = t.memory_still * t.memory_growth
    if later.spread < needed:
        return False
    found = later.trend(t.memory_tau)
    return found is not None and found.last - found.first >= needed


def _median(ordered: list[float]) -> float:
    """The median of a sorted, non-empty list."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


class Trends:
    """The run's series (step time, followed regions, memory) and the two trend rules."""

    def __init__(self) -> None:
        self.step = Series()
        self.regions: dict[str, Series] = {}
        self.memory: dict[str, Series] = {}
        self.capacity: dict[str, int] = {}
        self.run_steps = 0

    def add(self, v: View) -> None:
        """Take one report's points (not the run's first interval, its warm-up)."""
        report = v.report
        self.run_steps = max(self.run_steps, report.step)
        first_interval = v.warm_up
        for key, _, capacity in MEMORY:
            if key in report.memory and not first_interval:
                self.memory.setdefault(key, Series()).add(report.step, report.memory[key])
            if capacity in report.memory:
                self.capacity[capacity] = report.memory[capacity]
        if not v.has_steps or first_interval:
            return
        x = report.step - v.steps / 2
        self.step.add(x, v.usual_step)  # the median step: the mean jumps on a busy machine
        seen = set()
        regions = self.regions
        per_total = v.share(v.scale)  # a node's total -> its share of the step
        for node in report.nodes:
            if node.concurrent:
                continue
            share = node.total * per_total  # shares: a loaded machine moves them little
            series = regions.get(node.path)
            if series is None:
                if share < FOLLOWED_SHARE or len(regions) >= PATHS:
                    continue
                series = regions[node.path] = Series()
            series.add(x, share)
            seen.add(node.path)
        other = self.regions.get(v.other_path)
        if other is None and v.share(v.other) >= FOLLOWED_SHARE and len(self.regions) < PATHS:
            other = self.regions[v.other_path] = Series()
        if other is not None:
            other.add(x, v.share(v.other))
            seen.add(v.other_path)
        for path, series in self.regions.items():
            if path not in seen:
                series.add(x, 0.0)  # not run in this interval

    def step_trend(self) -> Trend | None:
        """The step time's trend over the run so far."""
        return self.step.trend()

    def slowdown(self, t: Thresholds) -> Finding | None:
        """Step time growing steadily over the run, and the region that grows."""
        if len(self.step.points) < t.trend_reports:
            return None
        found = self.step.trend(t.trend_tau)
        if found is None or found.growth < t.slowdown_growth:
            return None
        where, where_trend = None, None
        for path, series in self.regions.items():  # the deepest whose share grew steadily
            if len(series.points) < t.trend_reports:
                continue
            region = series.trend(t.slowdown_tau)
            if region is None or region.last - region.first < t.slowdown_share:
                continue
            if where is None or path.count("/") > where.count("/"):
                where, where_trend = path, region
        share_growth = 0.0 if where_trend is None else where_trend.last - where_trend.first
        step_growth = found.last - found.first
        region_growth = 0.0
        if where_trend is not None:
            region_growth = where_trend.last * found.last - where_trend.first * found.first
        # the region must hold most of the growth: else every region slowed (the machine),
        # one of them a little more
        explains = region_growth >= t.slowdown_explains * step_growth
        severity = "info"
        if where is not None and explains:
            severity = "critical" if found.growth >= 1.0 else "warning"
        why = (
            f"the step grew from {ms(found.first)} to {ms(found.last)} (+{pct(found.growth)}) "
            f"over {found.span:.0f} steps, steadily (tau {found.tau:.2f})"
        )
        evidence: dict[str, object] = {
            "first_s": found.first,
            "last_s": found.last,
            "growth": found.growth,
            "tau": found.tau,
            "steps": found.span,
        }
        if where is not None and where_trend is not None:
            why += (
                f"; {where} grew from {pct(where_trend.first)} to {pct(where_trend.last)} "
                f"of the step ({ms(where_trend.first * found.first)} to "
                f"{ms(where_trend.last * found.last)})"
            )
            evidence.update(region=where, region_first_share=where_trend.first)
            evidence.update(
                region_last_share=where_trend.last,
                share_growth=share_growth,
                region_growth_s=region_growth,
            )
            hint = (
                f"look at what accumulates in {where} as the run goes on: a growing list or "
                "cache, a growing input (sequence length), recompilation"
            )
            if not explains:
                why += f", {ms(region_growth)} of the step's {ms(step_growth)} growth"
                hint = (
                    "the whole step slowed, not mostly one region: look at the machine "
                    f"(thermal throttling, other processes on its cores), then at {where}"
                )
        else:
            why += "; every region slowed alike"
            hint = (
                "the whole step slowed, not one region: look at the machine (thermal "
                "throttling, other processes on its cores, swapping)"
            )
        return Finding("slowdown", severity, why, hint, path=where, evidence=evidence)

    def change(self, t: Thresholds) -> Finding | None:
        """A step time that jumped at one report and stayed there (a change point, not a
        trend): the region whose share jumped with it, or none when every region slowed
        alike (the machine). Found once ``change_reports`` reports show the new level."""
        found = _jump(self.step.points, t)
        if found is None:
            return None
        at, before, after = found
        growth = after / before - 1.0
        began = round((self.step.points[at - 1][0] + self.step.points[at][0]) / 2)
        where, share_before, share_after = None, 0.0, 0.0
        for path, series in self.regions.items():  # the deepest whose share jumped there
            ys = [y for x, y in series.points if x >= self.step.points[0][0]]
            if len(ys) != len(self.step.points):
                continue
            low, high = _median(sorted(ys[:at])), _median(sorted(ys[at:]))
            if high - low < t.slowdown_share:
                continue
            grown = high * after - low * before
            if grown < t.slowdown_explains * (after - before):
                continue
            if where is None or path.count("/") > where.count("/"):
                where, share_before, share_after = path, low, high
        why = (
            f"the step jumped from {ms(before)} to {ms(after)} (+{pct(growth)}) at about "
            f"step {began} and stayed there"
        )
        evidence: dict[str, object] = {"first_s": before, "last_s": after, "growth": growth}
        evidence["change_step"] = began
        if where is not None:
            why += (
                f"; {where} went from {pct(share_before)} to {pct(share_after)} of the step "
                f"({ms(share_before * before)} to {ms(share_after * after)})"
            )
            evidence.update(region=where, region_first_share=share_before)
            evidence.update(region_last_share=share_after)
            hint = (
                f"look at what changed in {where} at step {began}: a new code path, a "
                "larger input, a recompilation, a setting switched on"
            )
        else:
            why += "; every region slowed alike"
            hint = (
                "the whole step slowed at once, not one region: look at the machine (other "
                "processes or threads on its cores, thermal throttling, swapping)"
            )
        # a smaller jump, or every region alike: another process's load looks the same
        severity = "warning" if where is not None and growth >= t.change_growth else "info"
        return Finding(
            "slowdown", severity, why, hint, path=where, evidence=evidence, since_step=began
        )

    def memory_creep(self, t: Thresholds, seconds_per_step: float) -> Finding | None:
        """Memory growing steadily over the run: bytes per step and, where the capacity is
        known, when it runs out at this rate."""
        for key, label, capacity_key in MEMORY:
            series = self.memory.get(key)
            if series is None or len(series.points) < t.trend_reports:
                continue
            if series.spread < t.memory_growth:  # the values cannot show that much growth
                continue
            found = series.trend(t.memory_tau)
            if found is None:
                continue
            grown = found.last - found.first
            if grown < t.memory_growth or found.slope <= 0:
                continue
            if not _still_growing(series, t):  # it levelled off: a cache filled, a peak
                continue
            why = (
                f"{label} grew by {size(grown)} over {found.span:.0f} steps "
                f"({size(found.slope)} per step), steadily (tau {found.tau:.2f})"
            )
            evidence: dict[str, object] = {
                "memory": key,
                "grown_bytes": grown,
                "bytes_per_step": found.slope,
                "tau": found.tau,
                "steps": found.span,
            }
            severity = "warning"
            capacity = self.capacity.get(capacity_key)
            if capacity:
                left = max(capacity - series.points[-1][1], 0.0) / found.slope
                when = f" (~{left * seconds_per_step / 60:.0f} min)" if seconds_per_step else ""
                why += f"; at this rate the {size(capacity)} run out in ~{left:.0f} steps{when}"
                evidence.update(capacity_bytes=capacity, steps_to_full=left)
                if left <= max(self.run_steps, 1):
                    severity = "critical"
            return Finding(
                "memory_creep",
                severity,
                why,
                "look for tensors kept across steps with their graph (store loss.item() or "
                "loss.detach(), not loss), lists of outputs, caches that only grow",
                evidence=evidence,
            )
        return None
