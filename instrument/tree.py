"""Pure functions over a :class:`~instrument.report.Report`: the tree and its text form."""

from __future__ import annotations

from dataclasses import dataclass

from instrument import report as _model
from instrument.findings import Finding
from instrument.report import FLUSH_ROW, Node, Report, SelfCost, Straggler

UNICODE_LINES = ("├── ", "└── ", "│   ", "    ")
ASCII_LINES = ("|-- ", "`-- ", "|   ", "    ")


@dataclass(frozen=True)
class Row:
    """One line of the rendered tree."""

    label: str  # tree lines + name
    total: float | None
    percent: float | None
    count: int | None
    mean: float | None
    max: float | None
    host: float | None = None
    bytes: int | None = None
    rank_min: float | None = None
    rank_max: float | None = None
    slowest: int | None = None


def children_by_parent(report: Report) -> dict[str, list[Node]]:
    """Direct children of each path, most total time first. A node whose parent was not
    recorded this interval (still open at flush) is attached to the nearest recorded
    ancestor, or to the top level."""
    out: dict[str, list[Node]] = {}
    for node in report.nodes:
        parent = node.parent
        while parent and parent not in report:
            parent = parent.rpartition("/")[0]
        out.setdefault(parent, []).append(node)
    for siblings in out.values():
        siblings.sort(key=lambda n: -n.total)
    return out


def _label_name(node: Node, parent: str) -> str:
    return node.path[len(parent) + 1 :] if parent else node.path


def rows(report: Report, *, unicode: bool = True) -> list[Row]:
    """The rows of the tree: an optional step root, regions, the previous flush's line and
    an "(other)" line."""
    tee, elbow, pipe, blank = UNICODE_LINES if unicode else ASCII_LINES
    kids = children_by_parent(report)
    has_device = any(node.device is not None for node in report.nodes)
    out: list[Row] = []
    # (node, parent path, prefix of tree lines or None at the top without steps, last
    # sibling, parent's total): a stack, not recursion, so any depth renders
    Item = tuple[Node, str, str | None, bool, float | None]

    def add(items: list[Item]) -> None:
        stack = items[::-1]
        while stack:
            node, parent, prefix, last, parent_total = stack.pop()
            branch = (elbow if last else tee) if prefix is not None else ""
            suffix = " (async)" if node.concurrent and not node.path.endswith("(async)") else ""
            suffix += " (open)" if node.open else ""
            finished = node.count > 0  # an open region with no finished call: no per-call
            out.append(
                Row(
                    label=f"{prefix or ''}{branch}{_label_name(node, parent)}{suffix}",
                    total=node.total,
                    percent=_percent(node.total, parent_total),
                    count=node.count,
                    mean=node.mean if finished else None,
                    max=node.max if finished else None,
                    host=node.host.total if has_device else None,
                    bytes=node.bytes or None,
                    rank_min=node.rank_min,
                    rank_max=node.rank_max,
                    slowest=node.slowest_rank,
                )
            )
            below = kids.get(node.path, [])
            lines = (blank if last else pipe) if prefix is not None else ""
            child_prefix = (prefix or "") + lines
            n = len(below)
            for i in range(n - 1, -1, -1):
                stack.append((below[i], node.path, child_prefix, i == n - 1, node.total))

    top = kids.get("", [])
    if report.step_time is not None:
        step = report.step_time
        out.append(
            Row(
                f"step ({report.steps} steps)",
                step.total,
                100.0,
                step.count,
                step.mean,
                step.max,
                step.total if has_device else None,
            )
        )
        other = report.other or 0.0
        flush = report.flush_time
        add(
            [
                (node, "", "", i == len(top) - 1 and other <= 0.0 and flush <= 0.0, step.total)
                for i, node in enumerate(top)
            ]
        )
        if flush > 0.0:
            branch = tee if other > 0.0 else elbow
            out.append(
                Row(f"{branch}{FLUSH_ROW}", flush, _percent(flush, step.total), None, None, None)
            )
        if other > 0.0:
            out.append(Row(f"{elbow}(other)", other, _percent(other, step.total), None, None, None))
    else:
        covered = sum(node.total for node in top if not node.concurrent)
        add([(node, "", None, True, covered) for node in top])
    return out


def _percent(value: float, whole: float | None) -> float | None:
    if whole is None or whole <= 0.0:
        return None
    return 100.0 * value / whole


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1e3:.3f}"


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return ""
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000.0 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000.0
    return ""  # pragma: no cover - the loop always returns


def render_text(report: Report, *, unicode: bool = True, width: int | None = None) -> str:
    """The report as a text tree: names with tree lines on the left, aligned figures on
    the right (times in milliseconds, % of the parent line, number of calls; host time
    when a device clock was used, bytes when collectives moved any)."""
    table = rows(report, unicode=unicode)
    has_device = any(row.host is not None for row in table)
    has_bytes = any(row.bytes is not None for row in table)
    has_ranks = any(row.rank_max is not None for row in table)
    headers = ["total ms", "%", "calls", "mean ms", "max ms"]
    headers += (["host ms"] if has_device else []) + (["bytes"] if has_bytes else [])
    headers += ["rank min ms", "rank max ms", "slowest"] if has_ranks else []
    cells = [
        [
            _ms(row.total),
            "" if row.percent is None else f"{row.percent:.1f}",
            "" if row.count is None else str(row.count),
            _ms(row.mean),
            _ms(row.max),
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
    col = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    title = _title(report)
    lines = [
        title,
        *findings_lines(report),
        *header_lines(report),
        "region".ljust(label_width)
        + "".join(f"  {h:>{w}}" for h, w in zip(headers, col, strict=True)),
    ]
    for row, cell in zip(table, cells, strict=True):
        lines.append(
            row.label.ljust(label_width)
            + "".join(f"  {c:>{w}}" for c, w in zip(cell, col, strict=True))
        )
    if not table:
        lines.append("(no regions recorded)")
    return "\n".join(line.rstrip() for line in lines)


def _rate(value: float | None, unit: str) -> str | None:
    if value is None:
        return None
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{prefix} {unit}"
    return f"{value:.3g} {unit}"


def self_cost_line(cost: SelfCost) -> str:
    """``instrument: 0.31 % of the interval (1200 regions x 210 ns + 300 hooked x 950 ns +
    last flush 0.42 ms)``; the hooked part only when ``auto``'s hooks entered regions."""
    hooked = f" + {cost.hooked} hooked x {cost.hooked_ns:.0f} ns" if cost.hooked else ""
    return (
        f"instrument: {100 * cost.share:.2g} % of the interval ({cost.regions} regions x "
        f"{cost.region_ns:.0f} ns{hooked} + last flush {cost.flush_seconds * 1e3:.2f} ms)"
    )


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
    if report.steps:
        parts.append(f"{report.steps} steps")
    if report.normalizer == "steps":
        if report.steps:  # with no steps marked nothing was divided
            parts.append("times per step")
    elif report.normalizer != 1.0:
        parts.append(f"times / {report.normalizer:g}")
    span = report.end_time - report.start_time
    if span > 0:
        parts.append(f"{span:.2f} s wall")
    return " · ".join(parts)


_model.text_renderer = render_text
