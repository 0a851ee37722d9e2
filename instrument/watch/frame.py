"""What the live view shows: lines of text, each with a style, made from the followed
files' state alone (no terminal, no clock), so every frame can be checked as text.

Top to bottom: the title with the run's status; the verdict and findings of the latest
report; the step time and its trend over the reports so far; what instrument cost,
throughput, memory and stragglers (as every report's header says them); the slowest rank;
the top regions with their share of the step; once the run ended, its summary.
"""

from __future__ import annotations

from collections.abc import Sequence

from instrument.diagnosis.summary import RunSummary
from instrument.diagnosis.view import View
from instrument.distributed.stragglers import is_collective
from instrument.report import FLUSH_ROW, Report
from instrument.tree import findings_lines, header_lines
from instrument.watch.follow import Track

#: A line of the frame: its text and its style, one of :data:`STYLES`.
Line = tuple[str, str]
#: "" is plain; a finding's line takes its severity.
STYLES = ("", "title", "heading", "dim", "info", "warning", "critical")
SPARKS = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 24
#: Ranks listed by name on the per-rank line; the others are counted.
RANKS_LISTED = 8
#: |Kendall's tau| from which the step time's trend is called steady.
STEADY_TAU = 0.6


def frame(
    tracks: Sequence[Track],
    status: str,
    *,
    top: int = 8,
    unicode: bool = True,
    summary: RunSummary | None = None,
) -> list[Line]:
    """The lines of one frame for ``tracks`` (one per followed file); ``status`` goes in
    the title, ``summary`` (the run's, once it ended) at the bottom."""
    shown = sorted((t for t in tracks if t.last is not None), key=_rank_order)
    lines: list[Line] = [(_title(tracks, shown, status), "title")]
    if shown:
        main = shown[0]
        report = main.last
        assert report is not None
        lines += _findings(report)
        lines.append((_step_line(main, unicode), ""))
        lines += [(line, "") for line in header_lines(report)]
        lines += _slowest(shown)
        lines += _regions(report, top, unicode)
    for track in tracks:
        if track.skipped:
            lines.append((f"skipped {track.skipped}", "dim"))
    if summary is not None:
        lines.append(("", ""))
        lines += [(line, "heading" if i == 0 else "") for i, line in
                  enumerate(summary.render().splitlines())]  # fmt: skip
    return lines


def _rank_order(track: Track) -> tuple[int, str]:
    assert track.last is not None
    return (track.last.rank, str(track.path))


def _title(tracks: Sequence[Track], shown: Sequence[Track], status: str) -> str:
    """``instrument watch · <status> · report #12 · step 120 · 4 ranks · run.jsonl``: the
    path last, where a narrow window crops it."""
    parts = ["instrument watch", status]
    if shown:
        report = shown[0].last
        assert report is not None
        parts += [f"report #{report.index}", f"step {report.step}"]
        if report.world_size > 1:
            parts.append(f"{report.world_size} ranks")
    if tracks:
        more = f" (+{len(tracks) - 1} files)" if len(tracks) > 1 else ""
        parts.append(f"{tracks[0].path}{more}")
    return " · ".join(parts)


def _findings(report: Report) -> list[Line]:
    """The verdict (styled by its severity), its next step, then one line per finding."""
    text = findings_lines(report)
    if not text:
        return []
    first, *rest = report.findings
    styles = [first.severity, ""] + [finding.severity for finding in rest]
    return list(zip(text, styles, strict=True))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _step_line(track: Track, unicode: bool) -> str:
    """``step: 15.40 ms (median 15.10 ms) · trend +3 % over steps 10..120 (steady) ▁▂▃``."""
    report = track.last
    assert report is not None
    view = View(report)
    if not view.has_steps:
        return "step: not measured (this report marked no instrument.step())"
    line = f"step: {_ms(view.step)} (median {_ms(view.usual_step)})"
    points = track.steps.points
    fitted = track.steps.trend()
    if fitted is None:
        line += f" · trend: after 3 reports ({len(points)} so far)"
    else:
        steady = "steady" if abs(fitted.tau) >= STEADY_TAU else "no steady trend"
        line += (
            f" · trend {100 * fitted.growth:+.0f} % over steps {points[0][0]:.0f}.."
            f"{points[-1][0]:.0f} ({steady})"
        )
    if unicode and len(points) >= 2:
        line += "  " + _sparkline([y for _, y in points])
    return line


def _sparkline(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    if high <= low:
        return SPARKS[0] * len(values)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - low) / (high - low) * top)] for v in values)


def _slowest(shown: Sequence[Track]) -> list[Line]:
    """The rank the others wait for: with several files, the one with the most time per
    step outside collectives; with one file of a cross-rank run, the slowest rank of the
    phase whose ranks differ the most."""
    if len(shown) >= 2:
        return _slowest_of_files(shown)
    report = shown[0].last
    assert report is not None
    view = View(report)
    if not view.has_steps:
        return []
    spread = []
    for node in view.phases:
        stats = node.ranks
        if stats is None or is_collective(node) or stats.ranks_present < 2:
            continue
        slowest = stats.slowest if stats.slowest is not None else stats.rank_argmax
        gap = (stats.rank_max - stats.rank_min) * view.scale
        spread.append((gap, node.name, slowest, stats.rank_max * view.scale,
                       stats.rank_min * view.scale, stats.rank_argmin))  # fmt: skip
    if not spread:
        return []
    _, name, slowest, high, low, fastest = max(spread)
    return [
        (
            f"slowest rank: {slowest} on {name}: {_ms(high)} per step vs {_ms(low)} on "
            f"rank {fastest}",
            "",
        )
    ]


def _slowest_of_files(shown: Sequence[Track]) -> list[Line]:
    busy: list[tuple[float, int]] = []
    indices: dict[int, int] = {}
    for track in shown:
        report = track.last
        assert report is not None
        view = View(report)
        indices[report.rank] = report.index
        if view.has_steps:
            busy.append((max(view.step - view.in_collectives(), 0.0), report.rank))
    lines: list[Line] = []
    if len(busy) >= 2:
        busy.sort(reverse=True)
        (high, slowest), (low, fastest) = busy[0], busy[-1]
        lines.append(
            (
                f"slowest rank: {slowest}: {_ms(high)} per step outside collectives vs "
                f"{_ms(low)} on rank {fastest}",
                "",
            )
        )
        listed = " · ".join(f"{rank} {seconds * 1e3:.2f}" for seconds, rank in busy[:RANKS_LISTED])
        more = f" · {len(busy) - RANKS_LISTED} more" if len(busy) > RANKS_LISTED else ""
        lines.append((f"  ms per step outside collectives by rank: {listed}{more}", "dim"))
    newest = max(indices.values())
    behind = sorted(rank for rank, index in indices.items() if index < newest)
    if behind:
        names = ", ".join(map(str, behind))
        lines.append((f"  behind: rank {names} (the others are at report #{newest})", "dim"))
    return lines


def _regions(report: Report, top: int, unicode: bool) -> list[Line]:
    """The step's phases (and the time in none), largest first, with their share."""
    view = View(report)
    if view.has_steps:
        rows = [(_name(node.name), view.seconds(node)) for node in view.phases]
        rows.append((view.other_path, view.other))
        if view.flush > 0:
            rows.append((FLUSH_ROW, view.flush))
        whole, unit = view.step, "ms/step"
    else:
        rows = [(_name(node.name), node.total) for node in report.children("")]
        whole, unit = sum(seconds for _, seconds in rows), "ms"
    rows.sort(key=lambda row: -row[1])
    if not rows:
        return [("(no regions recorded)", "dim")]
    shown = rows[:top]
    width = max(len(name) for name, _ in [*shown, ("region", 0.0)])
    lines: list[Line] = [(f"{'region':<{width}}  {unit:>9}  {'share':>6}", "heading")]
    for name, seconds in shown:
        share = seconds / whole if whole > 0 else 0.0
        bar = ("█" if unicode else "#") * round(min(share, 1.0) * BAR_WIDTH)
        row = f"{name:<{width}}  {seconds * 1e3:>9.3f}  {100 * share:>5.1f}%  {bar}"
        lines.append((row.rstrip(), ""))
    if len(rows) > top:
        lines.append((f"({len(rows) - top} smaller not shown; --top K shows more)", "dim"))
    return lines


def _name(name: str) -> str:
    """A region name as a terminal can show it: non-printable characters escaped."""
    return name if name.isprintable() else repr(name)
