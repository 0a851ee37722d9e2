"""``python -m instrument html``: one self-contained HTML file of a run.

The page holds everything it needs — its CSS, a small hand-written script (SVG drawing,
no library) and the run's data, gzip-compressed and base64-encoded, unpacked in the
browser by the built-in ``DecompressionStream`` — so it opens from a disk or a CI
artifact and never touches the network. It shows the run's verdict and findings on top
(:mod:`instrument.diagnosis`, as ``python -m instrument summary`` says them), the timing
tree of any interval as an icicle (click to zoom), a timeline with one point per interval
(the step time, or the zoomed region's, over its regions stacked; throughput, MFU,
memory), a rank-by-region heatmap with stragglers marked when the run gathered
``ranks="all"`` or ``"minmax"``, and with a base run the diff, regressions first, its
noise behind a toggle. A search box and a switch that hides regions under 1 % of the
step work on the whole page.

Report fields are read defensively, so files written by older or newer versions work.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from instrument.diagnosis import diagnose
from instrument.report import Report

#: A rank slower than the median rank by more than this fraction is a straggler.
STRAGGLER = 0.10


def _finite(value: float | None) -> float | None:
    """``value``, or None where it is not a finite number (JSON has no inf or NaN: a file
    that holds 1e308 MFU, times 100, is still drawn)."""
    return value if value is not None and math.isfinite(value) else None


def _ms(seconds: float | None) -> float | None:
    """Milliseconds to 4 significant digits (shorter numbers: a smaller page)."""
    return None if seconds is None else _finite(float(f"{seconds * 1e3:.4g}"))


def _ms3(seconds: float) -> float | None:
    """Milliseconds to 3 significant digits (percentiles: histogram buckets are coarser)."""
    return _finite(float(f"{seconds * 1e3:.3g}"))


def _factors(report: Report) -> tuple[float, float]:
    """(what turns the report's totals into seconds per step, what turns its per-call
    statistics into seconds)."""
    normalizer = report.normalizer
    steps = report.steps or 1
    if normalizer == "steps":
        return 1.0, 1.0
    if isinstance(normalizer, str):
        return 1.0 / steps, 1.0
    return float(normalizer) / steps, float(normalizer)


def _interval(report: Report, index: dict[str, int]) -> dict[str, Any]:
    per_step, per_call = _factors(report)
    rows: list[list[Any]] = []
    for node in report.nodes:
        device = node.device
        stats = device if device is not None else node.host
        row: list[Any] = [
            index[node.path],
            _ms(stats.total * per_step),
            stats.count,
            _ms3(stats.p50 * per_call),
            _ms3(stats.p90 * per_call),
            _ms3(stats.p99 * per_call),
        ]
        is_open = bool(getattr(node, "open", False))
        mean = stats.mean * per_call
        derived = stats.total * per_step * (report.steps or 1) / stats.count if stats.count else 0
        odd_mean = stats.count > 0 and abs(mean - derived) > 1e-3 * max(mean, 1e-12)
        if device is not None or is_open or odd_mean:
            host_ms = _ms(node.host.total * per_step)
            row += [host_ms, None if device is None else row[1], int(is_open)]
            if odd_mean:  # a call split over intervals: its mean is not total / calls
                row.append(_ms(mean))
        rows.append(row)
    out: dict[str, Any] = {
        "i": report.index,
        "s": report.step,
        "n": report.steps,
        "st": None if report.step_time is None else _ms(report.step_time.total * per_step),
        "o": _ms(None if report.other is None else report.other * per_step),
        "d": rows,
    }
    if report.flush_time > 0.0:
        out["f"] = _ms(report.flush_time * per_step)
    rates = report.throughput
    if rates is not None:
        out["tp"] = {
            "samples/s": _finite(rates.samples_per_sec),
            "tokens/s": _finite(rates.tokens_per_sec),
            "steps/s": _finite(rates.steps_per_sec),
            "TFLOP/s": _finite(rates.tflops),
            "MFU %": None if rates.mfu is None else _finite(100.0 * rates.mfu),
        }
    memory = dict(report.memory or {})
    if memory:
        out["mem"] = {key: _finite(value / 2**20) for key, value in memory.items()
                      if "oom" not in key and "retries" not in key}  # fmt: skip
    return out


#: At most this many columns in the heatmap: beyond, neighbouring ranks share one (their mean).
MAX_COLUMNS = 128


def heatmap(reports: Sequence[Report], paths: Sequence[str]) -> dict[str, Any] | None:
    """Each rank's mean time per step in each region over the run (``ranks="all"``), or
    the slowest and fastest rank's (``"minmax"``); stragglers: a rank more than
    :data:`STRAGGLER` above the median rank of a region, and (``reported``) the ones the
    run named itself. One column per rank that holds a value (whatever ``world_size`` or a
    rank number claims), at most :data:`MAX_COLUMNS`: beyond, each column is the mean of
    neighbouring ranks (``labels``: ``"0"``, or ``"0-7"``)."""
    gathered = [r for r in reports if any(n.ranks is not None for n in r.nodes)]
    if not gathered:
        return None
    sums: dict[str, dict[int, float]] = {}
    seen: dict[str, dict[int, int]] = {}
    for report in gathered:
        per_step, _ = _factors(report)
        for node in report.nodes:
            ranks = node.ranks
            if ranks is None:
                continue
            values: dict[int, float] = {}
            if ranks.per_rank is not None:
                values = {r: v for r, v in enumerate(ranks.per_rank) if v is not None}
            else:
                values = {ranks.rank_argmin: ranks.rank_min, ranks.rank_argmax: ranks.rank_max}
            row = sums.setdefault(node.path, {})
            count = seen.setdefault(node.path, {})
            for rank, value in values.items():
                if rank >= 0:
                    row[rank] = row.get(rank, 0.0) + value * per_step
                    count[rank] = count.get(rank, 0) + 1
    present = sorted({rank for row in seen.values() for rank in row})
    width = -(-len(present) // MAX_COLUMNS)  # ranks per column
    columns = [present[i : i + width] for i in range(0, len(present), width)]
    column_of = {rank: i for i, column in enumerate(columns) for rank in column}
    reported = reported_stragglers(reports)
    rows: list[dict[str, Any]] = []
    stragglers: list[dict[str, Any]] = []
    for path in paths:
        if path not in sums:
            continue
        means: dict[int, float] = {}
        for rank, total in sums[path].items():
            mean = _ms(total / seen[path][rank])
            if mean is not None:
                means[rank] = mean
        cells: list[float | None] = []
        for column in columns:
            held = [means[rank] for rank in column if rank in means]
            cells.append(sum(held) / len(held) if held else None)
        flagged = {column_of[s["r"]] for s in reported
                   if path in s["regions"] and s["r"] in column_of}  # fmt: skip
        if len(means) >= 2:
            middle = statistics.median(means.values())
            for rank, mean in sorted(means.items()):
                if middle > 0 and mean > (1 + STRAGGLER) * middle:
                    stragglers.append({"p": path, "r": rank, "pct": 100.0 * (mean / middle - 1)})
                    flagged.add(column_of[rank])
        rows.append({"p": path, "v": cells, "s": sorted(flagged)})
    modes = {r.ranks for r in gathered}
    return {
        "world": len(present),
        "labels": [
            str(column[0]) if len(column) == 1 else f"{column[0]}-{column[-1]}"
            for column in columns
        ],
        "mode": "all" if "all" in modes else sorted(modes)[0],
        "rows": rows,
        "stragglers": sorted(stragglers, key=lambda s: -s["pct"]),
        "reported": reported,
    }


def reported_stragglers(reports: Sequence[Report]) -> list[dict[str, Any]]:
    """The stragglers the run itself named (``report.stragglers``, written by versions that
    score ranks across intervals), from the last report that names any; read defensively,
    so files without the field give none."""
    for report in reversed(reports):
        named = getattr(report, "stragglers", None) or ()
        out = []
        for item in named:
            rank = getattr(item, "rank", None)
            if isinstance(rank, int):
                out.append(
                    {
                        "r": rank,
                        "host": str(getattr(item, "host", "") or ""),
                        "regions": [str(r) for r in getattr(item, "regions", ()) or ()],
                        "intervals": int(getattr(item, "intervals", 0) or 0),
                    }
                )
        if out:
            return out
    return []


@dataclass(frozen=True)
class DiffRow:
    """One region of the diff view (times in seconds per step; ``verdict`` "slower",
    "faster" or "")."""

    path: str
    before: float | None
    after: float | None
    estimate_percent: float | None
    low_percent: float | None
    high_percent: float | None
    verdict: str


def file_label(path: str, other: str = "") -> str:
    """How the page names a run file: its base name, so no machine's folders show in a
    page someone shares (with its folder when ``other``, the file it is compared with,
    has the same base name)."""
    name = os.path.basename(path) or path
    if os.path.basename(other) != name:
        return name
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return f"{folder}/{name}" if folder else name


def page_data(
    reports: Sequence[Report],
    *,
    title: str,
    run_name: str,
    rank: int,
    diff: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the page draws, as JSON-safe data (times in ms per step; per-call
    statistics in ms). Each interval's ``d`` has one row per region: ``[path index, total,
    calls, p50, p90, p99]``, plus ``host, device, open`` for a region with device time or
    one still open at the flush, and ``mean`` when it is not total / calls (a call split
    over intervals). Self time and the mean are otherwise derived in the page."""
    paths: dict[str, int] = {}
    concurrent: set[str] = set()
    for report in reports:
        for node in report.nodes:
            paths.setdefault(node.path, len(paths))
            if node.concurrent:
                concurrent.add(node.path)
    names = list(paths)
    parents = [paths.get(path.rpartition("/")[0], -1) for path in names]
    try:
        verdict: dict[str, Any] | None = diagnose(reports).to_dict()
    except Exception:  # a page without its banner rather than no page
        verdict = None
    return {
        "version": 1,
        "title": title,
        "run": file_label(run_name),
        "rank": rank,
        "per": "step" if any(r.steps for r in reports) else "report",
        "paths": names,
        "parents": parents,
        "concurrent": [1 if p in concurrent else 0 for p in names],
        "intervals": [_interval(report, paths) for report in reports],
        "heat": heatmap(reports, names),
        "diff": diff,
        "verdict": verdict,
    }


def diff_data(
    rows: Sequence[DiffRow], *, a: str, b: str, per: str, threshold: float, floor: float
) -> dict[str, Any]:
    """The diff view's data: regressions first, the one whose own time (its change minus
    its children's) grew most on top, then the rest by impact, the faster ones last."""
    delta = {row.path: (row.after or 0.0) - (row.before or 0.0) for row in rows}
    own = dict(delta)
    for path, change in delta.items():
        parent = path.rpartition("/")[0]
        if "/" in path and parent in own:
            own[parent] -= change
    for top in ("(step)",):
        own[top] = 0.0  # the step holds everything

    def order(row: DiffRow) -> tuple[int, float]:
        rank = {"slower": 0, "faster": 2}.get(row.verdict, 1)
        return rank, -(own[row.path] if rank == 0 else abs(delta[row.path]))

    return {
        "a": file_label(a, b),
        "b": file_label(b, a),
        "per": per,
        "threshold": threshold,
        "floor_ms": _ms(floor),
        "rows": [
            {
                "p": row.path,
                "a": _ms(row.before),
                "b": _ms(row.after),
                "est": row.estimate_percent,
                "lo": row.low_percent,
                "hi": row.high_percent,
                "v": row.verdict,
            }
            for row in sorted(rows, key=order)
        ],
    }


PLACEHOLDER = re.compile(r"/\*CSS\*/|/\*JS\*/|\{\{TITLE\}\}|\{\{DATA\}\}")


def _asset(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def render(data: dict[str, Any]) -> str:
    """The page: template, CSS, script and the compressed data in one string."""
    raw = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    packed = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")
    filling = {
        "/*CSS*/": _asset("report.css"),
        "/*JS*/": _asset("report.js"),
        "{{TITLE}}": html.escape(str(data.get("title", "instrument report"))),
        "{{DATA}}": packed,
    }
    # one pass: what goes in (a title holding "{{DATA}}") is never filled again
    return PLACEHOLDER.sub(lambda match: filling[match.group(0)], _asset("page.html"))
