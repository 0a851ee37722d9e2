"""A report flattened into ``{tag: float}``: the scalars TensorBoard and wandb log.

Which regions get tags: with ``top=None`` every region of the report; with ``top=k`` (the
sinks' default is :data:`TOP`) the top-level regions (the phases: ``forward``, ``backward``,
``optimizer``...) and the ``k`` deeper regions with the most time in this report, so a deep
model writes tens of tags, not thousands. Every other tag (step time, throughput, memory,
the timing's own cost, stragglers, diagnosis) is always written.

Tags, with ``<path>`` the region's path (``step/forward``):

- ``time/<path>/total_ms``, ``self_ms``, ``mean_ms``, ``max_ms``, ``p90_ms`` and ``count``:
  the primary statistics (device time for a region on the "cuda" clock, host otherwise);
  left out for a path this rank never ran (it is in the report only through a gather).
- ``time_host/<path>/...`` and ``time_device/<path>/...`` (``total_ms``, ``mean_ms``,
  ``max_ms``, ``p90_ms``): host and device time side by side, for regions with device time.
- ``time/<path>/rank_min_ms``, ``rank_max_ms``, ``rank_mean_ms`` and ``rank_argmax`` (the
  slowest rank): the path's total across ranks, when the report was gathered; with them
  ``slowest_rank`` (in a collective: the rank that arrived last) and this rank's straggler
  scores ``relative_score`` and ``individual_score`` (1.0 = best) where the path is scored.
- ``stragglers/count`` (ranks named as stragglers; in a combined report) and per straggler
  ``stragglers/rank_<r>/min_score`` and ``stragglers/rank_<r>/intervals``.
- ``step_time/total_ms``, ``mean_ms``, ``max_ms``, ``p90_ms``, ``count`` (steps in the
  interval), ``flush_ms`` (the previous flush's time in the steps, outside every region) and
  ``other_ms`` (step time no top-level region covered, less ``flush_ms``), when steps were
  marked.
- ``throughput/<field>``: ``steps_per_sec``, ``samples_per_sec``, ``tokens_per_sec``,
  ``tflops``, ``mfu`` (those that are known).
- ``memory/<key>_gib`` for the byte counts of ``report.memory`` (GiB = 2**30 bytes), and
  ``memory/device_alloc_retries`` / ``memory/device_ooms`` as plain counts.
- ``instrument/share`` (what the timing itself cost, as a fraction of the interval),
  ``instrument/regions``, ``instrument/region_ns`` and ``instrument/flush_ms`` (the previous
  flush's own time): ``report.self_cost``, when the report has one; with
  ``instrument/hooked`` and ``instrument/hooked_ns`` (the regions entered through
  ``auto``'s hooks, and one's cost) when there were some.
- ``across/<tag>/rank_min``, ``rank_max``, ``rank_mean``, ``rank_argmin``, ``rank_argmax``
  for each value of ``report.across``, ``<tag>`` being its own tag above
  (``across/throughput/tokens_per_sec/rank_min``, ``across/memory/host_rss_gib/rank_max``),
  and ``across/own/<path>_ms/...`` (``across/noise/<path>_ms/...``) for a region's own
  time (``"own.<path>"``; the spread of its time per step, ``"noise.<path>"``), for the
  regions that get tags).
- ``diagnosis/<kind>`` for every kind of finding (``diagnosis/input_bound``...): 0 absent,
  1 info, 2 warning, 3 critical; ``diagnosis/verdict`` the same for the report's verdict;
  when the report was diagnosed.

Region names become tag segments that TensorBoard's tag rule accepts (letters, digits,
``_ . -``): every other run of characters becomes ``_`` inside a name and is dropped at its
ends, so ``all_reduce (async)`` becomes ``all_reduce_async``. Two names that clean to the same
segment under one parent keep apart by a ``_2``, ``_3``... suffix on the later one. NaN and
infinite values are left out.
"""

from __future__ import annotations

import math
import re

from instrument.findings import KINDS, SEVERITIES
from instrument.report import RankStats, Report
from instrument.stats import Stats

MS = 1e3
GIB = float(2**30)
THROUGHPUT_FIELDS = ("steps_per_sec", "samples_per_sec", "tokens_per_sec", "tflops", "mfu")
#: The deeper regions (below the top level) that get tags by default.
TOP = 10
MEMORY_COUNTS = frozenset({"device_alloc_retries", "device_ooms"})
_INVALID = re.compile(r"[^\w.\-]+")


def global_step(report: Report) -> int:
    """The x axis of a report: the steps seen up to it, or its index when no step was marked."""
    return report.step if report.step > 0 else report.index


def tag_segment(name: str) -> str:
    """``name`` with the characters a tag cannot hold replaced (``"a (b)"`` → ``"a_b"``)."""
    return "_".join(part for part in _INVALID.split(name) if part) or "_"


def check_top(top: object) -> int | None:
    """``top`` as given to a sink: ``None`` (every region) or an int >= 0."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise ValueError(f"top must be an int >= 0, or None for every region, got {top!r}")
    return top


def tagged_paths(report: Report, top: int | None) -> frozenset[str] | None:
    """The paths that get tags: the top-level ones and the ``top`` deeper ones with the most
    time (``None``: every path)."""
    if top is None:
        return None
    deeper = sorted(
        (node for node in report.nodes if "/" in node.path),
        key=lambda node: max(node.total, node.rank_max or 0.0),  # or on the slowest rank
        reverse=True,
    )
    kept = {node.path for node in report.nodes if "/" not in node.path}
    kept.update(node.path for node in deeper[:top])
    return frozenset(kept)


class _PathTags:
    """Region path → tag path, each segment cleaned and kept apart from its siblings."""

    def __init__(self) -> None:
        self._by_path: dict[str, str] = {}
        self._taken: set[str] = set()

    def __call__(self, path: str) -> str:
        tag = self._by_path.get(path)
        if tag is not None:
            return tag
        untagged = [path]  # the path and its ancestors without a tag yet, deepest first
        parent = path.rpartition("/")[0]
        while parent and parent not in self._by_path:
            untagged.append(parent)
            parent = parent.rpartition("/")[0]
        for current in reversed(untagged):
            parent, _, name = current.rpartition("/")
            base = (self._by_path[parent] + "/" if parent else "") + tag_segment(name)
            tag, suffix = base, 2
            while tag in self._taken:
                tag, suffix = f"{base}_{suffix}", suffix + 1
            self._taken.add(tag)
            self._by_path[current] = tag
        return self._by_path[path]


def _times(out: dict[str, float], prefix: str, stats: Stats) -> None:
    out[f"{prefix}/total_ms"] = stats.total * MS
    out[f"{prefix}/mean_ms"] = stats.mean * MS
    out[f"{prefix}/max_ms"] = stats.max * MS
    out[f"{prefix}/p90_ms"] = stats.p90 * MS


def _across(out: dict[str, float], prefix: str, ranks: RankStats, scale: float) -> None:
    out[f"{prefix}/rank_min"] = ranks.rank_min * scale
    out[f"{prefix}/rank_max"] = ranks.rank_max * scale
    out[f"{prefix}/rank_mean"] = ranks.rank_mean * scale
    out[f"{prefix}/rank_argmin"] = float(ranks.rank_argmin)
    out[f"{prefix}/rank_argmax"] = float(ranks.rank_argmax)


def _scores(out: dict[str, float], prefix: str, ranks: RankStats) -> None:
    """The rank holding the others up, and this rank's straggler scores."""
    if ranks.slowest is not None:
        out[f"{prefix}/slowest_rank"] = float(ranks.slowest)
    if ranks.relative_score is not None:
        out[f"{prefix}/relative_score"] = ranks.relative_score
    if ranks.individual_score is not None:
        out[f"{prefix}/individual_score"] = ranks.individual_score


#: ``across`` sections keyed by a region's path: ``"own.<path>"`` (its own time) and
#: ``"noise.<path>"`` (the spread of its time per step).
REGION_SECTIONS = frozenset({"own", "noise"})


def _memory_tag(key: str) -> tuple[str, float]:
    """The tag of a memory key and the factor from its value (bytes or a count)."""
    if key in MEMORY_COUNTS:
        return f"memory/{tag_segment(key)}", 1.0
    return f"memory/{tag_segment(key)}_gib", 1.0 / GIB


def _across_tag(key: str) -> tuple[str, float]:
    """The tag of an ``across`` key (``"memory.host_rss"``) and the factor for its values."""
    section, _, field = key.partition(".")
    if section == "memory" and field:
        return _memory_tag(field)
    if section in REGION_SECTIONS and field:  # a region's time: ms, as the time/ tags
        path = "/".join(tag_segment(part) for part in field.split("/"))
        return f"{section}/{path}_ms", MS
    return "/".join(tag_segment(part) for part in key.split(".")), 1.0


def diagnosis_levels(report: Report) -> dict[str, float]:
    """Every finding kind and ``"verdict"`` → 0 absent, 1 info, 2 warning, 3 critical;
    empty when the report has no findings."""
    if not report.findings:
        return {}
    levels = dict.fromkeys(KINDS, 0.0)
    for finding in report.findings:
        level = 1.0 + SEVERITIES.index(finding.severity)
        levels[finding.kind] = max(levels[finding.kind], level)
    levels["verdict"] = 1.0 + SEVERITIES.index(report.findings[0].severity)
    return levels


def scalars(report: Report, top: int | None = None) -> dict[str, float]:
    """The numbers of ``report`` worth plotting, under the tags described in this module:
    those of every region (``top=None``), or of the top-level ones and the ``top`` deeper
    ones with the most time."""
    out: dict[str, float] = {}
    tags = _PathTags()
    kept = tagged_paths(report, check_top(top))
    for node in report.nodes:
        tag = tags(node.path)  # every path, so a name's suffix never depends on ``top``
        if kept is not None and node.path not in kept:
            continue
        base = f"time/{tag}"
        if node.count:
            _times(out, base, node.stats)
            out[f"{base}/self_ms"] = node.self * MS
            out[f"{base}/count"] = float(node.count)
            if node.device is not None:
                _times(out, f"time_host/{tag}", node.host)
                _times(out, f"time_device/{tag}", node.device)
        if node.ranks is not None:
            out[f"{base}/rank_min_ms"] = node.ranks.rank_min * MS
            out[f"{base}/rank_max_ms"] = node.ranks.rank_max * MS
            out[f"{base}/rank_mean_ms"] = node.ranks.rank_mean * MS
            out[f"{base}/rank_argmax"] = float(node.ranks.rank_argmax)
            _scores(out, base, node.ranks)
    if report.step_time is not None:
        _times(out, "step_time", report.step_time)
        out["step_time/count"] = float(report.steps)
        out["step_time/other_ms"] = (report.other or 0.0) * MS
        out["step_time/flush_ms"] = report.flush_time * MS
    rates = report.throughput
    if rates is not None:
        for name in THROUGHPUT_FIELDS:
            value = getattr(rates, name)
            if value is not None:
                out[f"throughput/{name}"] = float(value)
    for key, value in report.memory.items():
        tag, factor = _memory_tag(key)
        out[tag] = value * factor
    cost = report.self_cost
    if cost is not None:
        out["instrument/share"] = cost.share
        out["instrument/regions"] = float(cost.regions)
        out["instrument/region_ns"] = cost.region_ns
        out["instrument/flush_ms"] = cost.flush_seconds * MS
        if cost.hooked:
            out["instrument/hooked"] = float(cost.hooked)
            out["instrument/hooked_ns"] = cost.hooked_ns
    for key, ranks in report.across.items():
        section, _, field = key.partition(".")
        if kept is not None and section in REGION_SECTIONS and field not in kept:
            continue
        tag, factor = _across_tag(key)
        _across(out, f"across/{tag}", ranks, factor)
    if report.group_size:
        out["stragglers/count"] = float(max(report.stragglers_count, len(report.stragglers)))
    for kind, level in diagnosis_levels(report).items():
        out[f"diagnosis/{kind}"] = level
    for found in report.stragglers:
        out[f"stragglers/rank_{found.rank}/min_score"] = min(found.scores, default=1.0)
        out[f"stragglers/rank_{found.rank}/intervals"] = float(found.intervals)
    return {tag: value for tag, value in out.items() if math.isfinite(value)}
