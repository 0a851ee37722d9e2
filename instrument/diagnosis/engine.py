"""The diagnosis of a run: reports in, findings out, one report at a time.

:class:`Diagnosis` folds the reports of one run (one rank) in order. Each report's findings
depend only on it and the reports before it, so the live run (the reporter calls
:meth:`Diagnosis.add` at each flush) and a saved run read back from its JSONL file (``python
-m instrument summary``) give the same findings and the same summary.
"""

from __future__ import annotations

from collections.abc import Iterable

from instrument._frozen import replaced
from instrument.diagnosis import rules
from instrument.diagnosis.stalls import Stalls
from instrument.diagnosis.summary import RunSummary, Seen, StepTrend
from instrument.diagnosis.thresholds import Thresholds
from instrument.diagnosis.trends import Trends
from instrument.diagnosis.view import View
from instrument.findings import SEVERITIES, Finding, ordered
from instrument.report import Report

Key = tuple[str, str | None, int | None]


class Diagnosis:
    """The findings of each report of one run, and the run's summary.

    Args:
        thresholds: The rules' thresholds (:class:`Thresholds`; default: its defaults).

    Example:
        >>> diagnosis = Diagnosis()
        >>> for report in reports:
        ...     print(diagnosis.add(report)[0].why)
        >>> print(diagnosis.summary().render())
    """

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        self._relaxed = self.thresholds.relaxed()
        self._held: dict[Key, int] = {}  # each finding held now: the step it holds since
        self._severity: dict[str, int] = {}  # per kind held now: its highest severity's index
        self._straggler: Key | None = None  # the last report's straggler, held or not yet
        self._seen: dict[Key, Seen] = {}
        self._stalls = Stalls()
        self._trends = Trends()
        self._reports = 0
        self._first_step: int | None = None
        self._last_step = 0
        self._recent_step = 0  # the step the report before the last ended at
        self._rank = 0
        self._world_size = 1

    def add(self, report: Report) -> tuple[Finding, ...]:
        """The findings of ``report`` (the next report of the run), most important first."""
        v = View(report)
        # a report of no steps (a zero_grad after the last step, closed at exit) is no
        # report of the run's: it does not count toward how long a finding held
        self._reports += report.steps > 0
        start = report.step - report.steps
        if self._first_step is None:
            self._first_step = start
        self._recent_step = self._last_step
        self._last_step = max(self._last_step, report.step)
        self._rank, self._world_size = report.rank, report.world_size
        held_kinds = {key[0] for key in self._held}
        found: list[Finding] = []
        for kind, rule in rules.RULES:
            finding = self._judge(kind, rule, v)
            if finding is not None:
                found.append(finding)
        found = self._consecutive_straggler(found)
        stalls = self._stalls.check(v, self._for("stalls", held_kinds))
        if stalls is not None:
            found.append(stalls)
        self._trends.add(v)
        relaxed = self._for("slowdown", held_kinds)
        slowdown = self._trends.change(relaxed) or self._trends.slowdown(relaxed)
        creep = self._trends.memory_creep(self._for("memory_creep", held_kinds), v.step)
        found += [f for f in (slowdown, creep) if f is not None]
        if self._world_size > 1 and creep is not None:
            found[-1] = replaced(creep, rank=report.rank)
        found = _explained(found)
        if v.has_steps and not any(
            f.severity != "info" or f.kind == "compute_bound" for f in found
        ):
            found.append(_balanced(v))
        out = []
        held: dict[Key, int] = {}
        severity: dict[str, int] = {}
        for finding in ordered(found):
            first = start if finding.since_step is None else finding.since_step
            since = held[finding.key] = self._held.get(finding.key, first)
            level = SEVERITIES.index(finding.severity)
            severity[finding.kind] = max(severity.get(finding.kind, 0), level)
            finding = replaced(finding, since_step=since)
            seen = self._seen.get(finding.key)
            if seen is None:
                self._seen[finding.key] = Seen(finding, report.step)
            else:
                seen.again(finding, report.step)
            out.append(finding)
        self._held, self._severity = held, severity
        return tuple(out)

    def _for(self, kind: str, held: set[str]) -> Thresholds:
        return self._relaxed if kind in held else self.thresholds

    def _judge(self, kind: str, rule: rules.Rule, v: View) -> Finding | None:
        """``rule``'s finding: by the thresholds, or, for a finding that holds, by the
        relaxed ones (hysteresis), which may keep it but never raise its severity."""
        finding = rule(v, self.thresholds)
        held = self._severity.get(kind)
        if finding is not None or held is None:
            return finding
        kept = rule(v, self._relaxed)
        if kept is None or SEVERITIES.index(kept.severity) <= held:
            return kept
        return replaced(kept, severity=SEVERITIES[held])

    def _consecutive_straggler(self, found: list[Finding]) -> list[Finding]:
        """A straggler is named once the same rank is slow in the same phase in two
        consecutive reports (one interval of a busy machine is not a straggler)."""
        before, self._straggler = self._straggler, None
        for finding in found:
            if finding.kind == "straggler":
                self._straggler = finding.key
                if finding.key != before:
                    return [f for f in found if f is not finding]
        return found

    def summary(self) -> RunSummary:
        """The run so far: its verdict, every finding with when it started and how long it
        held, and the step time's trend."""
        enough = len(self._trends.step.points) >= self.thresholds.trend_reports
        found = self._trends.step_trend() if enough else None
        trend = None
        if found is not None:
            trend = StepTrend(found.first, found.last, found.growth, found.tau, found.span)
        return RunSummary.of(
            self._seen.values(),
            reports=self._reports,
            first_step=self._first_step or 0,
            last_step=self._last_step,
            rank=self._rank,
            world_size=self._world_size,
            step_trend=trend,
            recent_step=self._recent_step,
        )


def _explained(found: list[Finding]) -> list[Finding]:
    """Leave out what another finding explains: time in no region that is mostly the
    stalls found there; a collective wait that is the waiting for a straggler (kept, as
    info)."""
    by_kind = {f.kind: f for f in found}
    stalls, residual = by_kind.get("stalls"), by_kind.get("residual_heavy")
    out = list(found)
    if stalls is not None and residual is not None and stalls.path == residual.path:
        typical = float(residual.evidence["share"]) - float(stalls.evidence["share"])
        if typical < 0.5 * float(residual.evidence["share"]):
            out.remove(residual)
    wait = by_kind.get("collective_wait")
    if wait is not None and "straggler" in by_kind:
        out[out.index(wait)] = replaced(
            wait, severity="info", next="it is the waiting for the straggler named above"
        )
    return out


def _balanced(v: View) -> Finding:
    largest = sorted(v.phases, key=lambda n: n.total, reverse=True)[:4]
    parts = [n for n in largest if v.share(v.seconds(n)) >= 0.01]
    shares = ", ".join(f"{n.path} {rules.pct(v.share(v.seconds(n)))}" for n in parts)
    if v.share(v.other) >= 0.01:
        shares += f", {v.other_path} {rules.pct(v.share(v.other))}"
    return Finding(
        "balanced",
        "info",
        f"nothing looks wrong: {shares or 'no regions'} of {rules.ms(v.step)} per step",
        "nothing to fix here; to go faster, start with the largest phase",
        evidence={"step_s": v.step},
    )


def diagnose(reports: Iterable[Report], thresholds: Thresholds | None = None) -> RunSummary:
    """The summary of a run from its reports in order (``Report.from_dict`` of a JSONL
    file's lines): what the live run's reporter says at its end."""
    diagnosis = Diagnosis(thresholds)
    for report in reports:
        diagnosis.add(report)
    return diagnosis.summary()
