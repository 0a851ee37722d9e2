"""Pure functions over a :class:`~instrument.report.Report`: the tree and its text form.

The tree reads the same whatever the reporter's normalizer: with steps marked, times are
per step (``ms/step``) and shares are of the step; without, they are the interval's totals
(``total ms``) and shares are of the top-level regions' time. Rows keep the report's order
(first seen first), so consecutive reports line up; small and deep rows fold.
"""

from __future__ import annotations

from dataclasses import dataclass

from instrument import report as _model
from instrument.findings import Finding
from instrument.report import FLUSH_ROW, Node, Report, SelfCost, Straggler

UNICODE_LINES = ("├── ", "└── ", "│   ", "    ")
ASCII_LINES = ("|-- ", "`-- ", "|   ", "    ")
#: Folded: rows under this share of the step (of the whole without steps), in percent...
FOLD_PERCENT = 1.0
#: ...and rows deeper than this many levels, except the largest child of a largest row.
FOLD_DEPTH = 3
#: A step time this many times the last report's (or its inverse) earns a note.
CHANGE_RATIO = 1.5


@dataclass(frozen=True)
class Row:
    """One line of the rendered tree, in seconds: ``time`` per step (the interval's total
    without steps), ``percent`` of the step (of the top-level regions' time without steps),
    ``calls`` per step (in the interval without steps), ``per_call`` the mean and
    ``longest`` the max of one call; ``folded`` counts the rows a fold line (or a ``(+N)``
    mark) stands for; ``path`` is the region's (``None`` on the other lines)."""

    label: str  # tree lines + name
    time: float | None
    percent: float | None
    calls: float | None = None
    per_call: float | None = None
    longest: float | None = None
    host: float | None = None
    bytes: float | None = None
    rank_min: float | None = None
    rank_max: float | None = None
    slowest: int | None = None
    folded: int = 0
    path: str | None = None


@dataclass(frozen=True)
class Scale:
    """What turns a report's figures into the tree's, whatever its normalizer: ``time``
    multiplies a total into seconds per step (in the interval without steps), ``per_call``
    a mean or max into seconds, and ``steps`` divides counts (1 without steps)."""

    time: float
    per_call: float
    steps: int

    @classmethod
    def of(cls, report: Report) -> Scale:
        """The scale of ``report``'s figures."""
        steps = report.steps or 1
        if report.normalizer == "steps":
            return cls(time=1.0, per_call=1.0, steps=steps)  # totals already per step
        factor = float(report.normalizer)
        return cls(time=factor / steps, per_call=factor, steps=steps)


def children_by_parent(report: Report) -> dict[str, list[Node]]:
    """Direct children of each path, in the report's order (first seen first). A node whose
    parent was not recorded this interval (still open at flush) is attached to the nearest
    recorded ancestor, or to the top level."""
    out: dict[str, list[Node]] = {}
    for node in report.nodes:
        parent = node.parent
        while parent and parent not in report:
            parent = parent.rpartition("/")[0]
        out.setdefault(parent, []).append(node)
    return out


#: The longest name a row shows; a longer one is cut with "…" (the report keeps it whole).
NAME_WIDTH = 80


def _label_name(node: Node, parent: str, unicode: bool) -> str:
    name = node.path[len(parent) + 1 :] if parent else node.path
    if len(name) <= NAME_WIDTH:
        return name
    return name[: NAME_WIDTH - 1] + "…" if unicode else name[: NAME_WIDTH - 3] + "..."


def _largest(nodes: list[Node]) -> Node | None:
    """The node with the most time, the first one on a tie."""
    best: Node | None = None
    for node in nodes:
        if best is None or node.total > best.total:
            best = node
    return best


def _choose(
    children: list[Node], depth: int, on_top: bool, whole: float, fold: bool
) -> tuple[list[Node], list[Node]]:
    """The children of a row at ``depth`` to show and to fold. Folded: those under
    :data:`FOLD_PERCENT` of ``whole`` (below the top level: the phases of a step always
    show), and those deeper than :data:`FOLD_DEPTH` except the largest child of a row that
    is itself the largest of its siblings (``on_top``). One small row alone is shown rather
    than folded into a line of its own."""
    if not fold or not children:
        return children, []
    largest = _largest(children)
    shown: list[Node] = []
    hidden: list[Node] = []
    for child in children:
        big = depth == 0 or whole <= 0.0 or 100.0 * child.total >= FOLD_PERCENT * whole
        near = depth < FOLD_DEPTH or (on_top and child is largest)
        (shown if big and near else hidden).append(child)
    if len(hidden) == 1 and shown:
        return children, []
    return shown, hidden


def rows(report: Report, *, unicode: bool = True, fold: bool = True) -> list[Row]:
    """The rows of the tree: an optional step root, regions in the report's order, fold
    lines (``fold``), the previous flush's line and an "(other)" line."""
    tee, elbow, pipe, blank = UNICODE_LINES if unicode else ASCII_LINES
    more = "…" if unicode else "..."
    kids = children_by_parent(report)
    scale = Scale.of(report)
    has_device = any(node.device is not None for node in report.nodes)
    top = kids.get("", [])
    step = report.step_time
    if step is not None:
        whole = step.total
    else:
        whole = sum(node.total for node in top if not node.concurrent)
    out: list[Row] = []

    def seconds(value: float) -> float:
        return value * scale.time

    def percent(value: float) -> float | None:
        return _percent(value, whole)

    def fold_row(label: str, hidden: list[Node]) -> Row:
        total = sum(node.total for node in hidden)
        small = all(100.0 * node.total < FOLD_PERCENT * whole for node in hidden)
        under = f" under {FOLD_PERCENT:g} %" if small else ""
        return Row(
            f"{label}{more} {len(hidden)} more{under}",
            seconds(total),
            percent(total),
            folded=len(hidden),
        )

    # (node or folded nodes, parent path, prefix of tree lines or None at the top without
    # steps, last sibling, depth, largest of its siblings): a stack, not recursion, so any
    # depth renders
    Item = tuple[Node | list[Node], str, str | None, bool, int, bool]

    def items(
        shown: list[Node],
        hidden: list[Node],
        parent: str,
        prefix: str | None,
        depth: int,
        last_too: bool,
    ) -> list[Item]:
        entries: list[Node | list[Node]] = [*shown] + ([hidden] if hidden else [])
        largest = _largest(shown)
        n = len(entries)
        return [
            (entry, parent, prefix, last_too and i == n - 1, depth, entry is largest)
            for i, entry in enumerate(entries)
        ]

    def add(start: list[Item]) -> None:
        stack = start[::-1]
        while stack:
            entry, parent, prefix, last, depth, on_top = stack.pop()
            branch = (elbow if last else tee) if prefix is not None else ""
            if isinstance(entry, list):
                out.append(fold_row(f"{prefix or ''}{branch}", entry))
                continue
            node = entry
            shown, hidden = _choose(kids.get(node.path, []), depth, on_top, whole, fold)
            suffix = " (async)" if node.concurrent and not node.path.endswith("(async)") else ""
            suffix += " (open)" if node.open else ""
            marked = bool(hidden) and not shown and depth >= FOLD_DEPTH  # all too deep
            suffix += f" (+{len(hidden)})" if marked else ""
            finished = node.count > 0  # an open region with no finished call: no per-call
            out.append(
                Row(
                    label=f"{prefix or ''}{branch}{_label_name(node, parent, unicode)}{suffix}",
                    time=seconds(node.total),
                    percent=percent(node.total),
                    calls=node.count / scale.steps,
                    per_call=node.mean * scale.per_call if finished else None,
                    longest=node.max * scale.per_call if finished else None,
                    host=seconds(node.host.total) if has_device else None,
                    bytes=node.bytes / scale.steps if node.bytes else None,
                    rank_min=None if node.rank_min is None else seconds(node.rank_min),
                    rank_max=None if node.rank_max is None else seconds(node.rank_max),
                    slowest=node.slowest_rank,
                    folded=len(hidden) if marked else 0,
                    path=node.path,
                )
            )
            if marked or not (shown or hidden):
                continue
            lines = (blank if last else pipe) if prefix is not None else ""
            below = items(shown, hidden, node.path, (prefix or "") + lines, depth + 1, True)
            stack.extend(reversed(below))

    shown, hidden = _choose(top, 0, True, whole, fold)
    if step is not None:
        out.append(
            Row(
                f"step ({report.steps} {'step' if report.steps == 1 else 'steps'})",
                seconds(step.total),
                100.0,
                step.count / scale.steps,
                step.mean * scale.per_call,
                step.max * scale.per_call,
                seconds(step.total) if has_device else None,
            )
        )
        # (a nanosecond or less is the float residue of a subtraction, not time)
        other = report.other if report.other is not None and report.other > 1e-9 else 0.0
        flush = report.flush_time if report.flush_time > 1e-9 else 0.0
        add(items(shown, hidden, "", "", 1, other <= 0.0 and flush <= 0.0))
        if flush > 0.0:
            branch = tee if other > 0.0 else elbow
            out.append(Row(f"{branch}{FLUSH_ROW}", seconds(flush), percent(flush)))
        if other > 0.0:
            out.append(Row(f"{elbow}(other)", seconds(other), percent(other)))
    else:
        add(items(shown, hidden, "", None, 1, True))
    return out


def _percent(value: float, whole: float | None) -> float | None:
    if whole is None or whole <= 0.0:
        return None
    return 100.0 * value / whole


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1e3:.3f}"


def _size(nbytes: float | None) -> str:
    if nbytes is None:
        return ""
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000.0 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000.0
    return ""  # pragma: no cover - the loop always returns


def _calls(value: float | None) -> str:
    """``10``, ``0.9``, ``0.33``: whole numbers as such, fractions to two places."""
    if value is None:
        return ""
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0")


def headers(report: Report) -> tuple[str, str, str]:
    """The time, share and calls headers: ``ms/step``, ``% of step``, ``calls/step`` with
    steps marked, else ``total ms``, ``% of total``, ``calls`` (the interval's)."""
    if report.steps:
        return "ms/step", "% of step", "calls/step"
    return "total ms", "% of total", "calls"


def render_text(
    report: Report,
    *,
    unicode: bool = True,
    width: int | None = None,
    fold: bool = True,
    previous: Report | None = None,
) -> str:
    """The report as a text tree: names with tree lines on the left, aligned figures on
    the right. With steps marked: milliseconds per step, % of the step, calls per step;
    without: the interval's total milliseconds, % of the top-level regions' total, calls.
    Then milliseconds per call (mean and max); host time per step (or total) when a device
    clock was used, bytes when collectives moved any, the min and max across ranks and the
    slowest rank when gathered. The same columns whatever the normalizer.

    ``fold`` folds rows under 1 % and rows more than 3 levels deep (but the largest child
    of a largest row) into ``… N more`` lines and ``(+N)`` marks. With ``previous`` (the
    report printed before), a line notes a step time that moved by 1.5x or more."""
    table = rows(report, unicode=unicode, fold=fold)
    has_device = any(row.host is not None for row in table)
    has_bytes = any(row.bytes is not None for row in table)
    has_ranks = any(row.rank_max is not None for row in table)
    time, share, calls = headers(report)
    per = "/step" if report.steps else ""
    names = [time, share, calls, "ms/call", "max ms/call"]
    names += [f"host {time}"] if has_device else []
    names += [f"bytes{per}"] if has_bytes else []
    names += [f"rank min {time}", f"rank max {time}", "slowest rank"] if has_ranks else []
    cells = [
        [
            _ms(row.time),
            "" if row.percent is None else f"{row.percent:.1f}",
            _calls(row.calls),
            _ms(row.per_call),
            _ms(row.longest),
        ]
        + ([_ms(row.host)] if has_device else [])
        + ([_size(row.bytes)] if has_bytes else [])
        + (
            [_ms(row.rank_min), _ms(row.rank_max), "" if row.slowest is None else str(row.slowest)]
            if has_ranks
            else []
        )
        for row in table
    ]
    label_width = max([len(row.label) for row in table] + [len("region")])
    if width is not None:
        label_width = max(label_width, width)
    col = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(names)]
    change = None if previous is None else change_line(report, previous, unicode=unicode)
    lines = [
        _title(report),
        *findings_lines(report),
        *([change] if change else []),
        *header_lines(report),
        "region".ljust(label_width)
        + "".join(f"  {h:>{w}}" for h, w in zip(names, col, strict=True)),
    ]
    for row, cell in zip(table, cells, strict=True):
        lines.append(
            row.label.ljust(label_width)
            + "".join(f"  {c:>{w}}" for c, w in zip(cell, col, strict=True))
        )
    if not table:
        lines.append("(no regions recorded)")
    hidden = len(report.nodes) - sum(1 for row in table if row.path is not None)
    if hidden:
        lines.append(fold_note(hidden, "step" if report.step_time is not None else "total"))
    return "\n".join(line.rstrip() for line in lines)


def fold_note(hidden: int, whole: str) -> str:
    """The line under a folded tree: how many rows it hides and how to see them."""
    rows_ = "row" if hidden == 1 else "rows"
    return (
        f"{hidden} {rows_} folded (under {FOLD_PERCENT:g} % of the {whole} or more than "
        f"{FOLD_DEPTH} levels deep); every row: Console(fold=False) or instrument show --full"
    )


def _duration(seconds: float) -> str:
    """``177 ms``, ``1.1 s``: three significant digits, in the unit that reads plainly."""
    return f"{seconds:.3g} s" if seconds >= 1.0 else f"{seconds * 1e3:.3g} ms"


def change_line(report: Report, previous: Report, *, unicode: bool = True) -> str | None:
    """``step time 2.1x the last report's (84 → 177 ms)`` when the time per step moved by
    :data:`CHANGE_RATIO` or more since ``previous``; ``None`` otherwise or without steps."""
    now, before = step_seconds(report), step_seconds(previous)
    if now is None or before is None or now <= 0.0 or before <= 0.0:
        return None
    ratio = now / before
    if 1.0 / CHANGE_RATIO < ratio < CHANGE_RATIO:
        return None
    arrow = "→" if unicode else "->"
    return (
        f"step time {ratio:.2g}x the last report's ({_duration(before)} {arrow} {_duration(now)})"
    )


def step_seconds(report: Report) -> float | None:
    """The report's mean time per step in seconds, whatever its normalizer (``None``
    without steps)."""
    if report.step_time is None or not report.steps:
        return None
    return report.step_time.total * Scale.of(report).time


def _rate(value: float | None, unit: str) -> str | None:
    if value is None:
        return None
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{prefix} {unit}"
    return f"{value:.3g} {unit}"


def self_cost_line(cost: SelfCost) -> str:
    """``instrument's own cost: 0.31 % of the time (1500 timed calls 0.6 ms, previous flush
    0.42 ms)``: what timing took of the interval, and where from."""
    calls = cost.regions + cost.hooked
    noun = "call" if calls == 1 else "calls"
    on_calls = cost.seconds - cost.flush_seconds
    flush = f", previous flush {_short_ms(cost.flush_seconds)}" if cost.flush_seconds else ""
    return (
        f"instrument's own cost: {_short(100 * cost.share)} % of the time "
        f"({calls} timed {noun} {_short_ms(on_calls)}{flush})"
    )


def _figure(value: float) -> str:
    """Three significant digits, whole numbers from 100 on."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _short(value: float, floor: float = 0.001) -> str:
    """Two significant digits, whole numbers from 10 on, "under" ``floor`` below it (never
    an exponent)."""
    if value >= 10:
        return f"{value:.0f}"
    if 0.0 < value < floor:
        return f"under {floor:g}"
    return f"{value:.2g}"


def _short_ms(seconds: float) -> str:
    return f"{_short(seconds * 1e3, floor=0.0001)} ms"


def header_lines(report: Report) -> list[str]:
    """What instrument cost, throughput and memory, one line each, for above the tree (none
    when absent)."""
    lines = [] if report.self_cost is None else [self_cost_line(report.self_cost)]
    rates = report.throughput
    if rates is not None and rates.steps:
        parts: list[str | None] = [
            _rate(rates.steps_per_sec, "steps/s"),
            _rate(rates.samples_per_sec, "samples/s"),
            _rate(rates.tokens_per_sec, "tokens/s"),
            None if rates.tflops is None else f"{rates.tflops:.3g} TFLOP/s",
            None if rates.mfu is None else f"MFU {100 * rates.mfu:.1f}%",
        ]
        skipped = f" ({rates.warmup_steps} warm-up steps skipped)" if rates.warmup_steps else ""
        lines.append("throughput: " + " · ".join(p for p in parts if p is not None) + skipped)
    memory = report.memory
    if memory:
        held: list[str] = []
        if "host_rss" in memory:
            peak = memory.get("host_peak_rss")
            extra = f" (peak {_size(peak)})" if peak is not None else ""
            held.append(f"host rss {_size(memory['host_rss'])}{extra}")
        if "device_allocated" in memory:
            held.append(
                f"cuda allocated {_size(memory['device_allocated'])}"
                f" (peak {_size(memory.get('device_peak_allocated'))})"
                f", reserved {_size(memory.get('device_reserved'))}"
                f" (peak {_size(memory.get('device_peak_reserved'))})"
            )
        if memory.get("device_alloc_retries"):
            held.append(f"{memory['device_alloc_retries']} allocation retries")
        if memory.get("device_ooms"):
            held.append(f"{memory['device_ooms']} OOMs")
        if held:
            lines.append("memory: " + " · ".join(held))
    spread = [
        f"{key.split('.', 1)[1]} {_num(v.rank_min)}..{_num(v.rank_max)}"
        f" (lowest rank {v.rank_argmin})"
        for key, v in report.across.items()
        if key in ("throughput.tokens_per_sec", "throughput.samples_per_sec", "throughput.mfu")
    ]
    device_peak = report.across.get("memory.device_peak_allocated")
    if device_peak is not None:
        spread.append(
            f"cuda peak {_size(int(device_peak.rank_min))}..{_size(int(device_peak.rank_max))}"
            f" (highest rank {device_peak.rank_argmax})"
        )
    if report.across_note:
        lines.append(f"across ranks: not combined, this rank only: {report.across_note}")
    elif report.ranks != "local":
        size = report.group_size or report.world_size
        lines.append(f"across {size} ranks" + (": " + " · ".join(spread) if spread else ""))
    if report.stragglers:
        lines.append("stragglers: " + " · ".join(_straggler(s) for s in report.stragglers))
    elif report.stragglers_count:
        lines.append(f"stragglers: {report.stragglers_count} ranks (too many to list)")
    return lines


def _where(finding: Finding) -> str:
    where = f" on {finding.path}" if finding.path else ""
    return where + (f" (rank {finding.rank})" if finding.rank is not None else "")


def verdict_lines(finding: Finding, *, since: bool = False) -> list[str]:
    """``verdict: INPUT-BOUND (warning) on data: <why>`` and ``  next: <what to try>``."""
    when = f" since step {finding.since_step}" if since and finding.since_step is not None else ""
    return [
        f"verdict: {finding.label} ({finding.severity}){_where(finding)}{when}: {finding.why}",
        f"  next: {finding.next}",
    ]


def findings_lines(report: Report) -> list[str]:
    """The report's verdict and next step, then one line per other finding (none without
    findings)."""
    if not report.findings:
        return []
    first, *rest = report.findings
    return verdict_lines(first) + [
        f"  also: {f.label} ({f.severity}){_where(f)}: {f.why}" for f in rest
    ]


def _straggler(found: Straggler) -> str:
    """``rank 3 (node-7): forward 0.52, backward 0.71 for 4 intervals``."""
    regions = ", ".join(
        f"{path} {score:.2f}" for path, score in zip(found.regions, found.scores, strict=True)
    )
    return f"rank {found.rank} ({found.host}): {regions} for {found.intervals} intervals"


def _num(value: float) -> str:
    return f"{value:.3g}"


def _title(report: Report) -> str:
    parts = [f"instrument report #{report.index}"]
    if report.world_size > 1:
        parts.append(f"rank {report.rank}/{report.world_size}")
    if report.ranks != "local" and any(node.ranks is not None for node in report.nodes):
        parts.append(f"ranks: {report.ranks}")
    # (the columns say per step or in total; the normalizer does not change them)
    parts.append(f"{report.steps} steps" if report.steps else "no steps marked: interval totals")
    span = report.end_time - report.start_time
    if span > 0:
        parts.append(f"{span:.2f} s wall")
    return " · ".join(parts)


_model.text_renderer = render_text
