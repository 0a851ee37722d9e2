"""The command line: ``python -m instrument show | summary | watch | diff | plot | html``.

They read JSONL files. ``show`` prints a report's tree, ``summary`` the run's verdict and
findings, ``watch`` follows a running job's files live, ``diff`` finds the regions that got
slower between two runs beyond their noise (``--fail-above`` for CI), ``plot`` draws the
costliest regions' time per step over a run, ``html`` writes one self-contained page to
explore it. Problems are printed as
``instrument: error: <what>`` with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from instrument import __version__, diffstats
from instrument.diffstats import Shift
from instrument.reading import ReportFileError, locate, read_file
from instrument.report import FLUSH_ROW, OTHER_ROW, Report
from instrument.sinks.console import Console
from instrument.terminal import PrintableStream

PLOT_HINT = 'plot needs matplotlib: pip install "torch-instrument[plot]"'
STEP_ROW = "(step)"  # the step time itself
REST_ROW = "other regions"  # the plot's regions outside the top K
FEW_REPORTS = 3  # fewer reports per run after warm-up cannot show its noise
#: Labels the CLI draws itself; a region named like one is shown quoted (see shown_name).
OWN_ROWS = frozenset({STEP_ROW, OTHER_ROW, REST_ROW, FLUSH_ROW})
#: the uncovered time and instrument's own: hatched, never mistaken for a region
HATCH = {OTHER_ROW: "///", FLUSH_ROW: "..."}
EDGE = {OTHER_ROW: "#9a9a9a", FLUSH_ROW: "#8a7d63"}


class CliError(Exception):
    """A problem to print as ``instrument: error: <message>`` (exit code 2)."""


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """The reports of one rank read from one file, oldest first, and their line numbers."""

    name: str
    rank: int
    reports: tuple[Report, ...]
    lines: tuple[int, ...] = ()

    def where(self, report: Report) -> str:
        """``file:line`` of one of its reports."""
        for candidate, line in zip(self.reports, self.lines, strict=False):
            if candidate is report:
                return f"{self.name}:{line}"
        return self.name


def shown_name(name: str) -> str:
    """A region name as the CLI prints it: as is, or — when it holds a control character
    (a newline would break the table), equals a row the CLI draws itself (``(step)``,
    ``(other)``) or starts with a quote — as its quoted, escaped ``repr``, so no two names
    print alike and none is taken for the CLI's own rows."""
    if name in OWN_ROWS or name[:1] in ("'", '"') or not name.isprintable():
        return repr(name)
    return name


def shown_names(report: Report) -> Report:
    """``report`` with every region name as :func:`shown_name` prints it."""
    nodes = tuple(
        dataclasses.replace(node, path="/".join(map(shown_name, node.path.split("/"))))
        for node in report.nodes
    )
    if all(new.path == old.path for new, old in zip(nodes, report.nodes, strict=True)):
        return report
    return dataclasses.replace(report, nodes=nodes)


def load(path: str, rank: int | None) -> Run:
    """The reports of ``rank`` (default: the lowest rank present) in ``path`` or in its
    per-rank files, region names as :func:`shown_name` prints them; a cut-off last line is
    noted on stderr."""
    found = read_file(locate(path, rank))
    name = str(found.path)
    if found.incomplete_line is not None:
        print(
            f"instrument: note: {name}:{found.incomplete_line}: skipped a last line cut off "
            "mid-write",
            file=sys.stderr,
        )
    ranks = sorted({report.rank for report in found.reports})
    chosen = ranks[0] if rank is None else rank
    mine = [(shown_names(r), line) for r, line in zip(found.reports, found.lines, strict=True)
            if r.rank == chosen]  # fmt: skip
    if not mine:
        present = ", ".join(map(str, ranks))
        raise CliError(f"{name}: no report of rank {chosen}; ranks present: {present}")
    return Run(name, chosen, tuple(r for r, _ in mine), tuple(line for _, line in mine))


def interval_factor(report: Report) -> float:
    """What turns the report's (normalized) times back into seconds over its interval."""
    if report.normalizer == "steps":
        return float(report.steps) if report.steps else 1.0  # nothing was divided
    if isinstance(report.normalizer, str):
        return 1.0
    return float(report.normalizer)


def stepped(reports: Sequence[Report]) -> tuple[Report, ...]:
    """The reports that marked steps, or all of them when none did (then times are per
    report); a stepless tail (the flush at exit) is left out of a run that has steps."""
    with_steps = tuple(report for report in reports if report.steps)
    return with_steps or tuple(reports)


# -- show ---------------------------------------------------------------------------------


def show(args: argparse.Namespace) -> int:
    """Print the tree of one report (the last by default), of ``--step N``, or every one."""
    run = load(args.path, args.rank)
    reports: Sequence[Report] = run.reports
    if args.step is not None:
        reports = [report for report in run.reports if report.step == args.step]
        if not reports:
            steps = ", ".join(str(report.step) for report in run.reports)
            raise CliError(f"{run.name}: no report at step {args.step}; steps present: {steps}")
    if not args.all:
        reports = reports[-1:]
    console = Console(unicode=False if args.ascii else None, only_ranks="all", fold=not args.full)
    for i, report in enumerate(reports):
        if i:
            sys.stdout.write("\n")
        console.write(report)
    return 0


# -- summary ------------------------------------------------------------------------------


def summary(args: argparse.Namespace) -> int:
    """Print the run's summary (verdict, findings, step-time trend) from its JSONL files."""
    from instrument.diagnosis import Thresholds
    from instrument.diagnosis.saved import summarize

    try:
        thresholds = Thresholds.parse(args.threshold or [])
    except ValueError as exc:
        raise CliError(str(exc)) from None
    found = summarize(args.paths, thresholds)
    if args.json:
        print(json.dumps(found.to_dict(), indent=1))
    else:
        print(found.render())
    return 0


# -- diff ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """Time of every path per step — or per report when the run marked no step — over the
    reports kept after warm-up: ``times`` the mean over them (seconds), ``samples`` one
    value per kept report (a path missing from a report counts 0 there)."""

    run: Run
    times: dict[str, float]
    per: str  # "step" or "report"
    skipped: int
    steps: int
    samples: dict[str, list[float]] = field(default_factory=dict)


def uncovered(report: Report, scale: float) -> dict[str, float]:
    """The step time of a report with steps that no region covered, times ``scale``: the
    ``(other)`` row, and the ``(instrument flush)`` row when the report has one."""
    rows = {OTHER_ROW: (report.other or 0.0) * scale}
    if report.flush_time:
        rows[FLUSH_ROW] = report.flush_time * scale
    return rows


def profile(run: Run, skip_first: int | None) -> Profile:
    """Sum each path's time over the kept reports, then divide by their steps; keep each
    report's own time per step as a sample for the noise estimate."""
    reports = stepped(run.reports)
    skip = (1 if len(reports) > 2 else 0) if skip_first is None else skip_first
    if skip >= len(reports):
        raise CliError(f"{run.name}: --skip-first {skip} leaves none of its {len(reports)} reports")
    kept = reports[skip:]
    steps = sum(report.steps for report in kept)
    times: dict[str, float] = {}
    samples: dict[str, list[float]] = {}

    for i, report in enumerate(kept):
        factor = interval_factor(report)
        row: dict[str, float] = {}
        if report.step_time is not None:
            row[STEP_ROW] = report.step_time.total * factor
            row.update(uncovered(report, factor))
        for node in report.nodes:
            row[node.path] = row.get(node.path, 0.0) + node.total * factor
        count = report.steps or 1
        for path, seconds in row.items():
            _check_finite(seconds / count, run.where(report), path)
            times[path] = times.get(path, 0.0) + seconds
            samples.setdefault(path, [0.0] * i).append(seconds / count)
        for values in samples.values():
            if len(values) == i:
                values.append(0.0)
    divisor = steps or len(kept)
    per = "step" if steps else "report"
    means = {p: t / divisor for p, t in times.items()}
    for path, seconds in means.items():
        _check_finite(seconds, run.name, path)
    return Profile(run, means, per, skip, steps, samples)


def _check_finite(seconds: float, where: str, path: str) -> None:
    """Refuse a time the arithmetic turned into infinity or NaN (values near the float
    range): a diff of it could only hide a change."""
    if not math.isfinite(seconds):
        raise CliError(
            f"{where}: the time of {path!r} comes to {seconds} (its values are too large "
            "to add up); cannot compare it"
        )


@dataclass(frozen=True)
class Change:
    """One path's time per step in run A and run B (seconds; ``None``: not in that run),
    and the shift between their per-report distributions (``None`` for a path in one run
    only)."""

    path: str
    before: float | None
    after: float | None
    shift: Shift | None = None

    @property
    def delta(self) -> float:
        """B minus A (seconds); a missing side counts as zero."""
        return (self.after or 0.0) - (self.before or 0.0)

    @property
    def percent(self) -> float | None:
        """The change relative to A, or ``None`` when A is missing or zero."""
        if self.before is None or self.after is None or self.before <= 0.0:
            return None
        return 100.0 * self.delta / self.before

    @property
    def significant(self) -> bool:
        """The runs' distributions differ beyond their noise (the shift's interval leaves
        out zero)."""
        return self.shift is not None and self.shift.significant

    def interval_percent(self) -> tuple[float, float] | None:
        """The confidence interval of the change of the median, relative to A's median,
        in percent."""
        if self.shift is None:
            return None
        low, high = self.shift.low_percent, self.shift.high_percent
        return None if low is None or high is None else (low, high)

    def verdict(self, threshold: float, floor: float = 0.0) -> str:
        """ "slower" / "faster" when the change is significant, its whole interval lies
        beyond ``threshold`` percent and it moved the median by at least ``floor``
        seconds; else "" (noise, or too small to matter)."""
        if self.shift is None or abs(self.shift.estimate) < floor:
            return ""
        found = self.shift
        percents = (found.low_percent, found.high_percent)
        if not all(p is None or math.isfinite(p) for p in percents):
            # a baseline too close to zero for a finite percentage: never call it noise
            return "slower" if found.estimate > 0 else "faster" if found.estimate < 0 else ""
        return found.beyond(threshold)


def compare(a: Profile, b: Profile, min_seconds: float) -> list[Change]:
    """Every path of either run above ``min_seconds`` in one of them: the step time first,
    then by impact (largest absolute change first)."""
    kept = []
    for path in dict.fromkeys([*a.times, *b.times]):
        before, after = a.times.get(path), b.times.get(path)
        if max(before or 0.0, after or 0.0) >= min_seconds:
            kept.append((path, before, after))
    both = [(path, before, after) for path, before, after in kept
            if before is not None and after is not None]  # fmt: skip
    found = diffstats.shifts(
        [
            (a.samples.get(path, [before]), b.samples.get(path, [after]))
            for path, before, after in both
        ]
    )
    shifts = dict(zip([path for path, _, _ in both], found, strict=True))
    changes = [Change(path, before, after, shifts.get(path)) for path, before, after in kept]
    changes.sort(key=lambda c: (c.path != STEP_ROW, -abs(c.delta), c.path))
    return changes


def _describe(label: str, prof: Profile) -> str:
    count = len(stepped(prof.run.reports))
    skipped = f", first {prof.skipped} skipped as warm-up" if prof.skipped else ""
    steps = f", {prof.steps} steps" if prof.steps else ""
    return f"{label}: {prof.run.name} (rank {prof.run.rank}, {count} reports{skipped}{steps})"


def _ms_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3f}"


def _signed(value: float, decimals: int) -> str:
    """``value`` with its sign; what rounds to zero reads "+0" (never "-0.000")."""
    text = f"{value:+.{decimals}f}"
    return text if float(text) else text.replace("-", "+")


def _percent_text(change: Change) -> str:
    if change.before is None:
        return "new"
    if change.after is None:
        return "removed"
    percent = change.percent
    return "" if percent is None else _signed(percent, 1) + "%"


def _interval_text(change: Change) -> str:
    interval = change.interval_percent()
    if interval is None or change.shift is None:
        return "-"
    middle = change.shift.percent(change.shift.estimate) or 0.0
    return f"{_signed(middle, 1)}% [{_signed(interval[0], 1)}, {_signed(interval[1], 1)}]"


def noise_floor(a: Profile, percent: float) -> float:
    """The smallest change worth a verdict: ``percent`` of run A's step time (seconds;
    0 without steps). Regions of a few microseconds swing by tens of percent between
    two runs on a busy machine, in every interval alike."""
    return percent / 100.0 * a.times.get(STEP_ROW, 0.0)


def diff_table(
    a: Profile, b: Profile, changes: Sequence[Change], threshold: float, floor: float = 0.0
) -> str:
    """The comparison as aligned text: a line per run, then one row per path with the
    change of the median and its 95 % interval, and a verdict for significant changes
    beyond ``threshold`` percent and ``floor`` seconds."""
    unit = f"ms/{a.per}"
    headers = ["region", f"A {unit}", f"B {unit}", "delta ms", "delta %"]
    headers += ["median % [95% CI]", "verdict"]
    cells = [
        [
            c.path,
            _ms_or_dash(c.before),
            _ms_or_dash(c.after),
            _signed(c.delta * 1e3, 3),
            _percent_text(c),
            _interval_text(c),
            c.verdict(threshold, floor) or ("noise" if c.shift is not None else ""),
        ]
        for c in changes
    ]
    widths = [max(len(row[i]) for row in [headers, *cells]) for i in range(len(headers))]
    lines = [_describe("A", a), _describe("B", b), ""]
    for row in [headers, *cells]:
        first = row[0].ljust(widths[0])
        rest = "".join(f"  {cell:>{w}}" for cell, w in zip(row[1:], widths[1:], strict=True))
        lines.append((first + rest).rstrip())
    if not changes:
        lines.append("(no region above --min-ms in either run)")
    else:
        lines.append("")
        lines.append(
            "median %: change of the median over the runs' reports, with its bootstrap "
            f"interval; verdict: whole interval beyond {threshold:g}% and a change of at "
            f"least {floor * 1e3:.3f} ms/{a.per} (else noise)"
        )
        few = min(len(next(iter(p.samples.values()), [])) for p in (a, b))
        if few < FEW_REPORTS:
            lines.append(
                f"note: {few} report(s) after warm-up in one run: too few to measure its "
                f"noise (the interval only spans what those reports differ by); "
                f"{FEW_REPORTS} or more are needed"
            )
    return "\n".join(lines)


def diff(args: argparse.Namespace) -> int:
    """Compare two runs region by region; exit 1 when a region slowed significantly by
    more than ``--fail-above`` percent."""
    a = profile(load(args.a, args.rank), args.skip_first)
    b = profile(load(args.b, args.rank), args.skip_first)
    if a.per != b.per:
        with_steps, without = (a, b) if a.per == "step" else (b, a)
        raise CliError(
            f"cannot compare {with_steps.run.name} (time per step) with {without.run.name} "
            "(no step marked: time per report)"
        )
    changes = compare(a, b, args.min_ms / 1e3)
    threshold = args.threshold if args.fail_above is None else args.fail_above
    floor = noise_floor(a, args.noise_floor)
    print(diff_table(a, b, changes, threshold, floor))
    if args.fail_above is None:
        return 0
    slower = [c for c in changes if c.verdict(args.fail_above, floor) == "slower"]
    if not slower:
        return 0
    listed = ", ".join(f"{c.path} ({_interval_text(c).partition(' ')[0]})" for c in slower)
    print(
        f"instrument: {len(slower)} region(s) slowed significantly by more than "
        f"{args.fail_above:g}%: {listed}",
        file=sys.stderr,
    )
    return 1


# -- plot ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """What ``plot`` stacks: per report, each label's milliseconds per step."""

    x: list[float]
    widths: list[float]  # the steps each report covers (bar widths)
    per: str
    layers: dict[str, list[float]]  # bottom to top
    step_ms: list[float] | None
    parents: frozenset[str] = frozenset()  # layers whose region has children (self time)

    def label(self, name: str) -> str:
        """The legend's name for a layer: a parent's own time says it is its self time."""
        if name == REST_ROW:
            return "other regions (their self time)"
        if name == OTHER_ROW:
            return "(other): in no region"
        return f"{name} (self)" if name in self.parents else name


def series(reports: Sequence[Report], top: int) -> Series:
    """The self time of the ``top`` costliest paths, the rest of the regions summed, and
    the step time no region covered, per step for each report. Concurrent (async) regions
    overlap the others and are left out, so a stack adds up to the step time."""
    kept = stepped(reports)
    per_step = any(report.steps for report in kept)
    rows: list[dict[str, float]] = []
    for report in kept:
        scale = 1e3 * interval_factor(report) / (report.steps or 1)
        row = {n.path: n.self * scale for n in report.nodes if not n.concurrent}
        if report.step_time is not None:
            row.update(uncovered(report, scale))
        rows.append(row)
    overall: dict[str, float] = {}
    for row in rows:
        for path, ms in row.items():
            if path not in (OTHER_ROW, FLUSH_ROW):
                overall[path] = overall.get(path, 0.0) + ms
    ranked = [p for p in sorted(overall, key=lambda p: (-overall[p], p)) if overall[p] > 0.0]
    chosen, rest = ranked[:top], set(ranked[top:])
    layers = {path: [row.get(path, 0.0) for row in rows] for path in chosen}
    if rest:
        layers[REST_ROW] = [sum(ms for p, ms in row.items() if p in rest) for row in rows]
    for own in (FLUSH_ROW, OTHER_ROW):
        if any(row.get(own) for row in rows):
            layers[own] = [row.get(own, 0.0) for row in rows]
    step_ms = None
    if all(report.step_time is not None for report in kept):
        step_ms = [
            report.step_time.total * 1e3 * interval_factor(report) / (report.steps or 1)
            for report in kept
            if report.step_time is not None
        ]
    parents = frozenset(n.parent for r in kept for n in r.nodes if n.parent in layers)
    return Series(
        x=[float(r.step if per_step else r.index) for r in kept],
        widths=[float(r.steps if per_step else 1) for r in kept],
        per="step" if per_step else "report",
        layers=layers,
        step_ms=step_ms,
        parents=parents,
    )


def draw(data: Series, title: str, out: str) -> None:
    """Save the stacked chart (:func:`figure`) to ``out`` (format from the suffix: png,
    svg, pdf, ...)."""
    chart = figure(data, title)
    try:
        chart.savefig(out, dpi=110)
    except (OSError, ValueError) as exc:
        raise CliError(f"{out}: cannot save the plot ({exc})") from None


def figure(data: Series, title: str) -> Any:
    """The stacked chart as a matplotlib ``Figure``.

    Up to 40 reports are drawn as stacked bars, each spanning the steps its report
    covers; more as a stacked area. A black line marks the measured step time; x ticks
    are whole steps."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise CliError(PLOT_HINT) from None
    chart = Figure(figsize=(10, 5.5), layout="constrained")
    axes = chart.add_subplot()
    colors = _colors(list(data.layers))
    centers = data.x
    if len(data.x) <= 40:
        lefts = [x - w for x, w in zip(data.x, data.widths, strict=True)]
        widths = [0.9 * w for w in data.widths]
        centers = [left + w / 2 for left, w in zip(lefts, widths, strict=True)]
        bottom = [0.0] * len(data.x)
        for name, ms in data.layers.items():
            axes.bar(lefts, ms, widths, bottom=bottom, align="edge", label=data.label(name),
                     color=colors[name], hatch=HATCH.get(name),
                     edgecolor=EDGE.get(name))  # fmt: skip
            bottom = [b + y for b, y in zip(bottom, ms, strict=True)]
    elif data.layers:
        areas = axes.stackplot(data.x, *data.layers.values(),
                               labels=[data.label(n) for n in data.layers],
                               colors=[colors[n] for n in data.layers])  # fmt: skip
        for area, name in zip(areas, data.layers, strict=True):
            if name in HATCH:
                area.set_hatch(HATCH[name])
                area.set_edgecolor(EDGE[name])
    if data.step_ms is not None:
        axes.plot(centers, data.step_ms, color="black", linewidth=1.5, marker=".",
                  label="step time")  # fmt: skip
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.set_xlabel("step" if data.per == "step" else "report")
    axes.set_ylabel(f"ms per {data.per}")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.grid(axis="y", alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    axes.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
                fontsize="small", title="self time")  # fmt: skip
    return chart


def _colors(names: Sequence[str]) -> dict[str, Any]:
    """A distinct colour per region (tab10 without its grey, then tab20b), a solid grey for
    the other regions and white with grey hatching for the uncovered time."""
    from matplotlib import colormaps

    tab10, tab20b = colormaps["tab10"], colormaps["tab20b"]
    palette = [tab10(i) for i in range(10) if i != 7] + [tab20b(i) for i in range(20)]
    greys = {REST_ROW: "#8c8c8c", OTHER_ROW: "#ffffff", FLUSH_ROW: "#d8cfbd"}
    regions = [n for n in names if n not in greys]
    out: dict[str, Any] = {n: palette[i % len(palette)] for i, n in enumerate(regions)}
    out.update((n, greys[n]) for n in names if n in greys)
    return out


def plot(args: argparse.Namespace) -> int:
    """Draw the top regions' time per step over a run."""
    run = load(args.path, args.rank)
    data = series(run.reports, args.top)
    title = f"time per {data.per} by region · {os.path.basename(run.name)} · rank {run.rank}"
    draw(data, title, args.output)
    print(f"wrote {args.output}")
    return 0


# -- html ---------------------------------------------------------------------------------


def html_report(args: argparse.Namespace) -> int:
    """Write the run (and its diff against ``--base``) as one self-contained HTML file."""
    from instrument import html

    output = args.output if args.output is not None else html_path(args.path)
    run = load(args.path, args.rank)
    diff_view = None
    if args.base is not None:
        a = profile(load(args.base, args.rank), args.skip_first)
        b = profile(run, args.skip_first)
        if a.per != b.per:
            raise CliError(f"cannot compare {a.run.name} with {b.run.name}: one marked steps")
        floor = noise_floor(a, args.noise_floor)
        rows = []
        for change in compare(a, b, 0.0):
            found = change.shift
            rows.append(
                html.DiffRow(
                    path=change.path,
                    before=change.before,
                    after=change.after,
                    estimate_percent=None if found is None else found.percent(found.estimate),
                    low_percent=None if found is None else found.low_percent,
                    high_percent=None if found is None else found.high_percent,
                    verdict=change.verdict(args.threshold, floor),
                )
            )
        diff_view = html.diff_data(
            rows, a=a.run.name, b=b.run.name, per=a.per, threshold=args.threshold, floor=floor
        )
    title = f"instrument · {os.path.basename(run.name)}"
    data = html.page_data(run.reports, title=title, run_name=run.name, rank=run.rank,
                          diff=diff_view)  # fmt: skip
    try:
        with open(output, "w", encoding="utf-8") as file:
            file.write(html.render(data))
    except OSError as exc:
        raise CliError(f"{output}: cannot write the report ({exc})") from None
    print(f"wrote {output}")
    return 0


# -- watch --------------------------------------------------------------------------------


def watch(args: argparse.Namespace) -> int:
    """Redraw the run's live view while its JSONL files grow (see instrument.watch)."""
    from instrument.watch import watch as live_view

    return live_view(args.paths, interval=args.interval, idle=args.idle, once=args.once,
                     top=args.top, plain=args.plain)  # fmt: skip


def html_path(path: str) -> str:
    """The page ``html`` writes without ``-o``: ``path`` with the suffix ``.html``."""
    root, suffix = os.path.splitext(path)
    if suffix.lower() in (".html", ".htm"):
        raise CliError(f"{path}: looks like a page, not a JSONL run; give the run's JSONL file")
    return root + ".html"


# -- arguments ----------------------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def _number(minimum: float, inclusive: bool) -> Callable[[str], float]:
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``instrument`` argument parser and its commands."""
    parser = argparse.ArgumentParser(
        prog="instrument",
        description="View, compare and plot instrument report files (JSONL).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    rank_help = "the rank whose reports to use (default: the lowest present)"

    show_cmd = commands.add_parser("show", help="print the tree of a report")
    show_cmd.add_argument("path", help="a JSONL file written by instrument.sinks.JSONL")
    pick = show_cmd.add_mutually_exclusive_group()
    pick.add_argument("--step", type=_non_negative_int, help="the report at this step count")
    pick.add_argument("--all", action="store_true", help="every report, oldest first")
    show_cmd.add_argument("--rank", type=_non_negative_int, help=rank_help)
    show_cmd.add_argument("--ascii", action="store_true", help="ASCII tree lines")
    show_cmd.add_argument("--full", action="store_true", help="every row, nothing folded")
    show_cmd.set_defaults(run=show)

    summary_cmd = commands.add_parser(
        "summary", help="the run's verdict and findings (what the live run said at its end)"
    )
    summary_cmd.add_argument(
        "paths", nargs="+", metavar="path", help="JSONL files of the run (one or several ranks')"
    )
    summary_cmd.add_argument("--json", action="store_true", help="one JSON object")
    summary_cmd.add_argument(
        "--threshold",
        action="append",
        metavar="NAME=VALUE",
        help="override a diagnosis threshold (docs/diagnosis.md), e.g. input_share=0.4",
    )
    summary_cmd.set_defaults(run=summary)

    diff_cmd = commands.add_parser(
        "diff", help="which regions got slower or faster between two runs"
    )
    diff_cmd.add_argument("a", help="the baseline run (JSONL)")
    diff_cmd.add_argument("b", help="the run to compare with it (JSONL)")
    diff_cmd.add_argument("--rank", type=_non_negative_int, help=rank_help)
    diff_cmd.add_argument(
        "--skip-first",
        type=_non_negative_int,
        metavar="K",
        help="leave out each run's first K reports as warm-up "
        "(default: 1 when a run has more than 2 reports, else 0)",
    )
    diff_cmd.add_argument(
        "--min-ms",
        type=_number(0.0, inclusive=True),
        default=0.0,
        metavar="MS",
        help="hide regions under MS ms per step in both runs (default: 0)",
    )
    diff_cmd.add_argument(
        "--fail-above",
        type=_number(0.0, inclusive=False),
        metavar="PCT",
        help="exit 1 when a region in both runs slowed significantly (beyond the runs' "
        "noise) by more than PCT percent",
    )
    diff_cmd.add_argument(
        "--threshold",
        type=_number(0.0, inclusive=True),
        default=5.0,
        metavar="PCT",
        help="smallest change (percent) the verdict column calls slower/faster "
        "(default: 5; --fail-above sets it)",
    )
    diff_cmd.add_argument(
        "--noise-floor",
        type=_number(0.0, inclusive=True),
        default=2.0,
        metavar="PCT",
        help="ignore changes smaller than PCT percent of A's step time (default: 2)",
    )
    diff_cmd.set_defaults(run=diff)

    plot_cmd = commands.add_parser("plot", help="the top regions' time per step over a run")
    plot_cmd.add_argument("path", help="a JSONL file written by instrument.sinks.JSONL")
    plot_cmd.add_argument("-o", "--output", required=True, help="the picture (.png, .svg, .pdf)")
    plot_cmd.add_argument(
        "--top", type=_positive_int, default=8, metavar="K", help="regions drawn (default: 8)"
    )
    plot_cmd.add_argument("--rank", type=_non_negative_int, help=rank_help)
    plot_cmd.set_defaults(run=plot)

    html_cmd = commands.add_parser(
        "html", help="one self-contained HTML report (tree, timeline, ranks, diff)"
    )
    html_cmd.add_argument("path", help="a JSONL file written by instrument.sinks.JSONL")
    html_cmd.add_argument(
        "-o", "--output", help="the HTML file to write (default: the run's path, ending .html)"
    )
    html_cmd.add_argument("--base", metavar="BASE", help="a baseline run (JSONL): adds the diff")
    html_cmd.add_argument("--rank", type=_non_negative_int, help=rank_help)
    html_cmd.add_argument(
        "--skip-first", type=_non_negative_int, metavar="K", help="as for diff (warm-up reports)"
    )
    html_cmd.add_argument(
        "--threshold", type=_number(0.0, inclusive=True), default=5.0, metavar="PCT",
        help="smallest change (percent) the diff calls slower/faster (default: 5)",
    )  # fmt: skip
    html_cmd.add_argument(
        "--noise-floor", type=_number(0.0, inclusive=True), default=2.0, metavar="PCT",
        help="ignore changes smaller than PCT percent of the base's step time (default: 2)",
    )  # fmt: skip
    html_cmd.set_defaults(run=html_report)

    watch_cmd = commands.add_parser(
        "watch", help="a live view of a running job: verdict, step time, top regions, ranks"
    )
    watch_cmd.add_argument(
        "paths", nargs="+", metavar="path", help="JSONL files of the run (one or several ranks')"
    )
    watch_cmd.add_argument("--once", action="store_true", help="draw one frame and exit")
    watch_cmd.add_argument(
        "--idle", type=_number(0.0, inclusive=False), metavar="SECONDS",
        help="also end when no file got a report for SECONDS (default: wait for the summary)",
    )  # fmt: skip
    watch_cmd.add_argument(
        "--interval", type=_number(0.0, inclusive=False), default=1.0, metavar="SECONDS",
        help="seconds between refreshes (default: 1)",
    )  # fmt: skip
    watch_cmd.add_argument(
        "--top", type=_positive_int, default=8, metavar="K", help="regions shown (default: 8)"
    )
    watch_cmd.add_argument(
        "--plain", action="store_true", help="plain ANSI redraw even when rich is installed"
    )
    watch_cmd.set_defaults(run=watch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 ``--fail-above`` hit, 2 error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
        return exc.code if isinstance(exc.code, int) else 0
    command: Callable[[argparse.Namespace], int] = args.run
    out, err = sys.stdout, sys.stderr
    if command is not watch:  # watch draws with escape sequences: it escapes each line itself
        sys.stdout, sys.stderr = PrintableStream(out), PrintableStream(err)
    try:
        return command(args)
    except (CliError, ReportFileError) as exc:
        print(f"instrument: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `instrument show run.jsonl | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # a bug, not a regression: never exit 1 (what --fail-above uses)
        print(
            f"instrument: error: internal error on this input ({type(exc).__name__}: {exc}); "
            "please report it with the file",
            file=sys.stderr,
        )
        return 2
    finally:
        sys.stdout, sys.stderr = out, err
