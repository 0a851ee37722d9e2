"""The end-of-run summary: the run's verdict, its findings with when they started, the
step time's trend. The same for a live run (at its close) and a saved one."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from instrument._frozen import replaced
from instrument.findings import KINDS, SEVERITIES, Finding
from instrument.tree import verdict_lines

#: Kinds judged over the whole run so far: one report holding them is enough ...
RUN_KINDS = frozenset({"slowdown", "memory_creep"})
#: ... if it is one of the run's last two, for memory: memory that stopped growing (the
#: later reports no longer show a creep) has levelled off; the run does not leak.
RECENT_KINDS = frozenset({"memory_creep"})


class Seen:
    """A finding over the run, kept up to date as reports come: its most severe form (the
    latest at that severity), the step it first held from, in how many reports it held, the
    last step it held at."""

    __slots__ = ("finding", "last_step", "reports", "since")

    def __init__(self, finding: Finding, step: int) -> None:
        self.finding = finding
        self.since = finding.since_step
        self.reports = 1
        self.last_step = step

    def again(self, finding: Finding, step: int) -> None:
        """Held in one more report, as ``finding``."""
        if SEVERITIES.index(finding.severity) >= SEVERITIES.index(self.finding.severity):
            self.finding = finding
        self.reports += 1
        self.last_step = step


@dataclass(frozen=True)
class StepTrend:
    """The step time over the run (given from ``trend_reports`` reports on): fitted first
    and last seconds per step, the relative growth, Kendall's tau (how steadily), the steps
    it spans."""

    first: float
    last: float
    growth: float
    tau: float
    steps: float

    def to_dict(self) -> dict[str, float]:
        """JSON-safe dict."""
        return {
            "first_s": self.first,
            "last_s": self.last,
            "growth": self.growth,
            "tau": self.tau,
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTrend:
        """Inverse of :meth:`to_dict`."""
        return cls(
            float(data["first_s"]),
            float(data["last_s"]),
            float(data["growth"]),
            float(data["tau"]),
            float(data["steps"]),
        )


def _importance(seen: Seen) -> tuple[int, bool, int, int]:
    f = seen.finding
    return (
        -SEVERITIES.index(f.severity),
        f.kind == "incomplete",  # a footnote, never the verdict beside another finding
        -seen.reports,
        KINDS.index(f.kind),
    )


@dataclass(frozen=True)
class RunSummary:
    """A run's diagnosis. ``findings`` held in at least a quarter of the reports (two at
    least; a run of under three reports: any; a trend over the run: one, for memory at
    one of its last two reports, those ending at ``recent_step`` or later), most
    important first — the first is ``verdict``; ``transient`` ones held more briefly.
    When no finding held that long, the most important brief one is the verdict: a run
    whose reports had findings always has one. Each finding's ``since_step`` is the step
    it first held from; its evidence also says in how many reports it held
    (``reports_held``) and the last step it held at (``last_step``)."""

    verdict: Finding | None
    findings: tuple[Finding, ...]
    transient: tuple[Finding, ...]
    reports: int
    first_step: int
    last_step: int
    rank: int = 0
    world_size: int = 1
    step_trend: StepTrend | None = None

    @classmethod
    def of(
        cls,
        seen: Iterable[Seen],
        *,
        reports: int,
        first_step: int,
        last_step: int,
        rank: int = 0,
        world_size: int = 1,
        step_trend: StepTrend | None = None,
        recent_step: int | None = None,
    ) -> RunSummary:
        """From the findings seen over a run of ``reports`` reports; ``recent_step``: the
        step the run's second last report ended at (default: ``last_step``)."""
        recent = last_step if recent_step is None else recent_step
        needed = max(2, math.ceil(reports / 4)) if reports >= 3 else 1
        lasting: list[Finding] = []
        brief: list[Finding] = []
        for item in sorted(seen, key=_importance):
            evidence = {**item.finding.evidence, "reports_held": item.reports}
            evidence["last_step"] = item.last_step
            finding = replaced(item.finding, evidence=evidence, since_step=item.since)
            if item.finding.kind in RECENT_KINDS:
                kept = item.last_step >= recent
            elif item.finding.kind in RUN_KINDS:
                kept = True
            else:
                kept = item.reports >= needed
            (lasting if kept else brief).append(finding)
        if not lasting and brief:
            lasting.append(brief.pop(0))
        return cls(
            verdict=lasting[0] if lasting else None,
            findings=tuple(lasting),
            transient=tuple(brief),
            reports=reports,
            first_step=first_step,
            last_step=last_step,
            rank=rank,
            world_size=world_size,
            step_trend=step_trend,
        )

    @classmethod
    def merge(cls, summaries: Iterable[RunSummary]) -> RunSummary:
        """Several ranks' summaries as one: every rank's findings (one per kind, path and
        rank: the most severe), the most important first."""
        parts = list(summaries)
        if not parts:
            raise ValueError("no summaries to merge")
        if len(parts) == 1:
            return parts[0]

        def pick(lists: Iterable[Iterable[Finding]]) -> list[Finding]:
            best: dict[tuple[str, str | None, int | None], Finding] = {}
            for findings in lists:
                for f in findings:
                    old = best.get(f.key)
                    if old is None or SEVERITIES.index(f.severity) > SEVERITIES.index(old.severity):
                        best[f.key] = f
            return sorted(
                best.values(),
                key=lambda f: (
                    -SEVERITIES.index(f.severity),
                    f.kind == "incomplete",
                    -int(f.evidence.get("reports_held", 0)),
                    KINDS.index(f.kind),
                ),
            )

        lasting = pick(p.findings for p in parts)
        keys = {f.key for f in lasting}
        brief = [f for f in pick(p.transient for p in parts) if f.key not in keys]
        first = min(parts, key=lambda p: p.rank)
        return cls(
            verdict=lasting[0] if lasting else None,
            findings=tuple(lasting),
            transient=tuple(brief),
            reports=max(p.reports for p in parts),
            first_step=min(p.first_step for p in parts),
            last_step=max(p.last_step for p in parts),
            rank=first.rank,
            world_size=max(p.world_size for p in parts),
            step_trend=first.step_trend,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``summary.json``, ``python -m instrument summary --json``)."""
        return {
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "transient": [f.to_dict() for f in self.transient],
            "reports": self.reports,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "rank": self.rank,
            "world_size": self.world_size,
            "step_trend": None if self.step_trend is None else self.step_trend.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """Inverse of :meth:`to_dict`."""
        verdict, trend = data.get("verdict"), data.get("step_trend")
        return cls(
            verdict=None if verdict is None else Finding.from_dict(verdict),
            findings=tuple(Finding.from_dict(f) for f in data.get("findings") or ()),
            transient=tuple(Finding.from_dict(f) for f in data.get("transient") or ()),
            reports=int(data.get("reports", 0)),
            first_step=int(data.get("first_step", 0)),
            last_step=int(data.get("last_step", 0)),
            rank=int(data.get("rank", 0)),
            world_size=int(data.get("world_size", 1)),
            step_trend=None if trend is None else StepTrend.from_dict(trend),
        )

    def render(self) -> str:
        """The summary as text, for a console."""
        title = (
            f"instrument run summary · steps {self.first_step}..{self.last_step} · "
            f"{self.reports} reports"
        )
        if self.world_size > 1:
            title += f" · rank {self.rank}/{self.world_size}"
        lines = [title]
        if self.verdict is None:
            lines.append("verdict: none (no report had a finding)")
        else:
            lines += verdict_lines(self.verdict, since=True)
        for f in self.findings[1:]:
            held = f.evidence.get("reports_held")
            lines.append(
                f"  also: {f.label} ({f.severity}) since step {f.since_step}, in {held} of "
                f"{self.reports} reports: {f.why}"
            )
        if self.transient:
            brief = ", ".join(
                f"{f.label} ({f.severity}, {f.evidence.get('reports_held')} reports)"
                for f in self.transient
            )
            lines.append(f"  briefly: {brief}")
        trend = self.step_trend
        if trend is not None:
            steady = "steadily" if abs(trend.tau) >= 0.6 else "no steady trend"
            lines.append(
                f"step time: {trend.first * 1e3:.3g} ms -> {trend.last * 1e3:.3g} ms per step "
                f"over {trend.steps:.0f} steps ({100 * trend.growth:+.0f} %, tau "
                f"{trend.tau:.2f}: {steady})"
            )
        return "\n".join(lines)
