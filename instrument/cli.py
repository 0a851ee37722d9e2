"""The command line: ``python -m instrument show | diff | plot`` on JSONL report files.

``show`` prints a report's tree, ``diff`` finds the regions that got slower between two
runs (``--fail-above`` for CI), ``plot`` draws the costliest regions' time per step over a
run. Problems are printed as ``instrument: error: <what>`` with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from instrument.reading import ReportFileError, locate, read_file
from instrument.report import Report
from instrument.sinks.console import Console

PLOT_HINT = 'plot needs matplotlib: pip install "torch-instrument[plot]"'
STEP_ROW = "(step)"  # the step time itself
OTHER_ROW = "(other)"  # step time no top-level region covered
REST_ROW = "other regions"  # the plot's regions outside the top K


class CliError(Exception):
    """A problem to print as ``instrument: error: <message>`` (exit code 2)."""


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """The reports of one rank read from one file, oldest first."""

    name: str
    rank: int
    reports: tuple[Report, ...]


def load(path: str, rank: int | None) -> Run:
    """The reports of ``rank`` (default: the lowest rank present) in ``path`` or in its
    per-rank files; a cut-off last line is noted on stderr."""
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
    reports = tuple(report for report in found.reports if report.rank == chosen)
    if not reports:
        present = ", ".join(map(str, ranks))
        raise CliError(f"{name}: no report of rank {chosen}; ranks present: {present}")
    return Run(name, chosen, reports)


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
    console = Console(unicode=False if args.ascii else None, ranks="all")
    for i, report in enumerate(reports):
        if i:
            sys.stdout.write("\n")
        console.write(report)
    return 0


# -- diff ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """Mean time (seconds) of every path per step — or per report when the run marked no
    step — over the reports kept after warm-up."""

    run: Run
    times: dict[str, float]
    per: str  # "step" or "report"
    skipped: int
    steps: int


def profile(run: Run, skip_first: int | None) -> Profile:
    """Sum each path's time over the kept reports, then divide by their steps."""
    reports = stepped(run.reports)
    skip = (1 if len(reports) > 2 else 0) if skip_first is None else skip_first
    if skip >= len(reports):
        raise CliError(f"{run.name}: --skip-first {skip} leaves none of its {len(reports)} reports")
    kept = reports[skip:]
    steps = sum(report.steps for report in kept)
    times: dict[str, float] = {}

    def add(path: str, seconds: float) -> None:
        times[path] = times.get(path, 0.0) + seconds

    for report in kept:
        factor = interval_factor(report)
        if report.step_time is not None:
            add(STEP_ROW, report.step_time.total * factor)
            add(OTHER_ROW, (report.other or 0.0) * factor)
        for node in report.nodes:
            add(node.path, node.total * factor)
    divisor = steps or len(kept)
    per = "step" if steps else "report"
    return Profile(run, {p: t / divisor for p, t in times.items()}, per, skip, steps)


@dataclass(frozen=True)
class Change:
    """One path's time per step in run A and run B (seconds; ``None``: not in that run)."""

    path: str
    before: float | None
    after: float | None

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


def compare(a: Profile, b: Profile, min_seconds: float) -> list[Change]:
    """Every path of either run above ``min_seconds`` in one of them: the step time first,
    then by impact (largest absolute change first)."""
    changes = [
        Change(path, a.times.get(path), b.times.get(path))
        for path in dict.fromkeys([*a.times, *b.times])
        if max(a.times.get(path, 0.0), b.times.get(path, 0.0)) >= min_seconds
    ]
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


def diff_table(a: Profile, b: Profile, changes: Sequence[Change]) -> str:
    """The comparison as aligned text: a line per run, then one row per path."""
    unit = f"ms/{a.per}"
    headers = ["region", f"A {unit}", f"B {unit}", "delta ms", "delta %"]
    cells = [
        [
            c.path,
            _ms_or_dash(c.before),
            _ms_or_dash(c.after),
            _signed(c.delta * 1e3, 3),
            _percent_text(c),
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
    return "\n".join(lines)


def diff(args: argparse.Namespace) -> int:
    """Compare two runs region by region; exit 1 when ``--fail-above`` is exceeded."""
    a = profile(load(args.a, args.rank), args.skip_first)
    b = profile(load(args.b, args.rank), args.skip_first)
    if a.per != b.per:
        with_steps, without = (a, b) if a.per == "step" else (b, a)
        raise CliError(
            f"cannot compare {with_steps.run.name} (time per step) with {without.run.name} "
            "(no step marked: time per report)"
        )
    changes = compare(a, b, args.min_ms / 1e3)
    print(diff_table(a, b, changes))
    if args.fail_above is None:
        return 0
    slower = [c for c in changes if (c.percent or 0.0) > args.fail_above]
    if not slower:
        return 0
    listed = ", ".join(f"{c.path} ({c.percent:+.1f}%)" for c in slower)
    print(
        f"instrument: {len(slower)} region(s) slowed by more than {args.fail_above:g}%: {listed}",
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
            row[OTHER_ROW] = (report.other or 0.0) * scale
        rows.append(row)
    overall: dict[str, float] = {}
    for row in rows:
        for path, ms in row.items():
            if path != OTHER_ROW:
                overall[path] = overall.get(path, 0.0) + ms
    ranked = [p for p in sorted(overall, key=lambda p: (-overall[p], p)) if overall[p] > 0.0]
    chosen, rest = ranked[:top], set(ranked[top:])
    layers = {path: [row.get(path, 0.0) for row in rows] for path in chosen}
    if rest:
        layers[REST_ROW] = [sum(ms for p, ms in row.items() if p in rest) for row in rows]
    if any(row.get(OTHER_ROW) for row in rows):
        layers[OTHER_ROW] = [row.get(OTHER_ROW, 0.0) for row in rows]
    step_ms = None
    if all(report.step_time is not None for report in kept):
        step_ms = [
            report.step_time.total * 1e3 * interval_factor(report) / report.steps
            for report in kept
            if report.step_time is not None
        ]
    return Series(
        x=[float(r.step if per_step else r.index) for r in kept],
        widths=[float(r.steps if per_step else 1) for r in kept],
        per="step" if per_step else "report",
        layers=layers,
        step_ms=step_ms,
    )


def draw(data: Series, title: str, out: str) -> None:
    """Save the stacked chart to ``out`` (format from the suffix: png, svg, pdf, ...).

    Up to 40 reports are drawn as stacked bars, each spanning the steps its report
    covers; more as a stacked area. A black line marks the measured step time."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CliError(PLOT_HINT) from None
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    axes = figure.add_subplot()
    colors = _colors(list(data.layers))
    centers = data.x
    if len(data.x) <= 40:
        lefts = [x - w for x, w in zip(data.x, data.widths, strict=True)]
        widths = [0.9 * w for w in data.widths]
        centers = [left + w / 2 for left, w in zip(lefts, widths, strict=True)]
        bottom = [0.0] * len(data.x)
        for name, ms in data.layers.items():
            axes.bar(lefts, ms, widths, bottom=bottom, align="edge", label=name,
                     color=colors[name])  # fmt: skip
            bottom = [b + y for b, y in zip(bottom, ms, strict=True)]
    elif data.layers:
        axes.stackplot(data.x, *data.layers.values(), labels=list(data.layers),
                       colors=[colors[n] for n in data.layers])  # fmt: skip
    if data.step_ms is not None:
        axes.plot(centers, data.step_ms, color="black", linewidth=1.5, marker=".",
                  label="step time")  # fmt: skip
    axes.set_xlabel("step" if data.per == "step" else "report")
    axes.set_ylabel(f"ms per {data.per}")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.grid(axis="y", alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    axes.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
                fontsize="small", title="self time")  # fmt: skip
    try:
        figure.savefig(out, dpi=110)
    except (OSError, ValueError) as exc:
        raise CliError(f"{out}: cannot save the plot ({exc})") from None


def _colors(names: Sequence[str]) -> dict[str, Any]:
    """A distinct colour per region (tab10 without its grey, then tab20b), and greys for
    the other regions and the uncovered time."""
    from matplotlib import colormaps

    tab10, tab20b = colormaps["tab10"], colormaps["tab20b"]
    palette = [tab10(i) for i in range(10) if i != 7] + [tab20b(i) for i in range(20)]
    greys = {REST_ROW: "#9a9a9a", OTHER_ROW: "#dadada"}
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
    """The ``instrument`` argument parser with its three commands."""
    parser = argparse.ArgumentParser(
        prog="instrument",
        description="View, compare and plot instrument report files (JSONL).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    rank_help = "the rank whose reports to use (default: the lowest present)"

    show_cmd = commands.add_parser("show", help="print the tree of a report")
    show_cmd.add_argument("path", help="a JSONL file written by instrument.sinks.JSONL")
    pick = show_cmd.add_mutually_exclusive_group()
    pick.add_argument("--step", type=_non_negative_int, help="the report at this step count")
    pick.add_argument("--all", action="store_true", help="every report, oldest first")
    show_cmd.add_argument("--rank", type=_non_negative_int, help=rank_help)
    show_cmd.add_argument("--ascii", action="store_true", help="ASCII tree lines")
    show_cmd.set_defaults(run=show)

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
        help="exit 1 when a region in both runs slowed by more than PCT percent",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 ``--fail-above`` hit, 2 error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
        return exc.code if isinstance(exc.code, int) else 0
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except (CliError, ReportFileError) as exc:
        print(f"instrument: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `instrument show run.jsonl | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
