"""Findings: what a report means, in words. Pure data; :mod:`instrument.diagnosis` makes them.

A :class:`Finding` names one problem (or the absence of one) in a stable vocabulary
(:data:`KINDS`), how bad it is (:data:`SEVERITIES`), the region and rank it is about, one
sentence of why with the measured numbers, one thing to try next, and the figures behind it.
A report holds its findings most important first: the first one is the report's *verdict*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Every kind a finding can have, in the order a verdict prefers them at equal severity.
KINDS: tuple[str, ...] = (
    "straggler",
    "memory_pressure",
    "memory_creep",
    "stalls",
    "input_bound",
    "slowdown",
    "residual_heavy",
    "collective_wait",
    "compute_bound",
    "balanced",
    "incomplete",  # a footnote: never the verdict while another finding holds
)
#: Severities, least severe first.
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")

Evidence = Mapping[str, Any]


def _json_value(key: str, value: Any) -> Any:
    """``value`` if JSON-safe (a finite number, a string, None, a list of those)."""
    kind = type(value)
    if kind is float and math.isfinite(value):  # (the usual evidence: checked first)
        return value
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"evidence {key!r} must be a finite number, got {value!r}")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(key, item) for item in value]
    raise ValueError(f"evidence {key!r} must be a number, a string or a list, got {value!r}")


@dataclass(frozen=True)
class Finding:
    """One thing a report shows, in words and figures.

    ``kind`` is one of :data:`KINDS`, ``severity`` one of :data:`SEVERITIES`; ``path`` is the
    region it is about (``"data"``, ``"forward/encoder"``, ``"(other)"``; ``None`` when about
    the whole step or run) and ``rank`` the rank (``None`` when about every rank or a single
    process); ``why`` says what was measured and ``next`` the first thing to try;
    ``evidence`` holds the figures behind it (seconds, bytes, shares in 0..1); ``since_step``
    is the step from which it has held without a break.
    """

    kind: str
    severity: str
    why: str
    next: str
    path: str | None = None
    rank: int | None = None
    evidence: Evidence = field(default_factory=dict)
    since_step: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}; expected one of {KINDS}")
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"unknown severity {self.severity!r}; expected one of 'info', 'warning', 'critical'"
            )
        evidence = {str(k): _json_value(str(k), v) for k, v in self.evidence.items()}
        object.__setattr__(self, "evidence", evidence)

    @property
    def key(self) -> tuple[str, str | None, int | None]:
        """What makes two reports' findings the same one: kind, path and rank."""
        return (self.kind, self.path, self.rank)

    @property
    def label(self) -> str:
        """The kind as a person reads it: ``"INPUT-BOUND"``."""
        return self.kind.replace("_", "-").upper()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores an equal finding."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "path": self.path,
            "rank": self.rank,
            "why": self.why,
            "next": self.next,
            "evidence": dict(self.evidence),
            "since_step": self.since_step,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict`; ``ValueError`` for something that is not one."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a finding must be a mapping, got {type(data).__name__}")
        path, rank, since = data.get("path"), data.get("rank"), data.get("since_step")
        evidence = data.get("evidence") or {}
        if not isinstance(evidence, Mapping):
            raise ValueError("a finding's evidence must be a mapping")
        for name in ("kind", "severity", "why", "next"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"a finding's {name!r} must be a string")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise ValueError(f"a finding's rank must be an int or null, got {rank!r}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int)):
            raise ValueError(f"a finding's since_step must be an int or null, got {since!r}")
        return cls(
            kind=data["kind"],
            severity=data["severity"],
            why=data["why"],
            next=data["next"],
            path=None if path is None else str(path),
            rank=rank,
            evidence=evidence,
            since_step=since,
        )


def importance(finding: Finding) -> tuple[int, int]:
    """A sort key, most important first: severity, then the kind's place in :data:`KINDS`."""
    return (-SEVERITIES.index(finding.severity), KINDS.index(finding.kind))


def ordered(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The findings most important first (stable for equal ones): the first is the verdict."""
    return tuple(sorted(findings, key=importance))
