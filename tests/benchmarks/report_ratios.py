"""Turn a pytest-benchmark JSON file into one markdown ratio table per group.

Usage::

    pytest tests/benchmarks --benchmark-only --benchmark-json=out.json
    python tests/benchmarks/report_ratios.py out.json

Each benchmark's function performs ``extra_info["inner"]`` operations per round, so the
time per operation is a round's time divided by ``inner``: the min over rounds (the
figure least disturbed by a noisy machine) and the median. The ratio compares the
min-based figure with the group's baseline row (``extra_info["baseline"]``). A group with a
*floor* row (``extra_info["floor"]``: the bare operation) also gets an "added" column: each
row's cost above the floor divided by the baseline's cost above it.

A *paired* benchmark (``extra_info["paired_rows"]``, see ``paired.py``) timed its baseline
and contenders interleaved in the same rounds; its table shows the median of the per-round
ratios, the figure the targets are checked against (in a group whose rows are measured
*above* others, the ratio of the median added costs; the note names the row below).

Targets: the table under "## Targets" in ``docs/performance.md`` (the one place they are
written) — group, row, the highest ratio to the group's baseline it may have, and whether
it must be cheaper than every peer in its group. An "at most" written with a unit
(``2 µs``, ``0.2 ms``) is an absolute target instead: the row's ``extra_info["value_ns"]``
(the figure the benchmark says it is about, e.g. ns per path of a flush) may be at most
that; a row without a ``value_ns`` misses it. A benchmark that measures several such
figures at once lists the others in ``extra_info["more_rows"]`` (each a label, a
``value_ns`` and a note), each a row of its own. The script prints each check and exits
with status 1 when a measured row misses its target (2 when the targets cannot be read).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: Groups in this order first, any others after them in the order they appear.
GROUP_ORDER = (
    "context-manager",
    "decorator",
    "disabled",
    "flush",
    "module-call",
    "mlp-step",
    "transformer-step",
)


@dataclass(frozen=True)
class Row:
    """One benchmark, reduced to what the table shows."""

    group: str
    label: str
    min_ns: float
    median_ns: float
    rounds: int
    baseline: bool
    note: str
    floor: bool = False
    peer: bool = False
    ratio_median: float | None = None  # paired rows: median of per-round ratios
    above: str | None = None  # paired rows: the row whose cost the ratio is measured above
    ratio_min: float | None = None
    value_ns: float | None = None  # the figure an absolute target is checked against


def load_rows(data: dict[str, Any]) -> list[Row]:
    """The rows of a pytest-benchmark JSON document, in the order they ran."""
    rows = []
    for bench in data.get("benchmarks", []):
        extra = bench.get("extra_info", {})
        group = bench.get("group") or extra.get("group") or "(no group)"
        if "paired_rows" in extra:
            rows.extend(
                Row(
                    group=group,
                    label=str(r["label"]),
                    min_ns=float(r["min_ns"]),
                    median_ns=float(r["median_ns"]),
                    rounds=int(r["rounds"]),
                    baseline=bool(r["baseline"]),
                    note=str(r.get("note", "")),
                    floor=bool(r.get("floor", False)),
                    peer=bool(r.get("peer", False)),
                    above=r.get("above"),
                    ratio_median=float(r["ratio_median"]),
                    ratio_min=float(r["ratio_min"]),
                )
                for r in extra["paired_rows"]
            )
            continue
        stats = bench["stats"]
        inner = int(extra.get("inner", 1)) or 1
        row = Row(
            group=group,
            label=str(extra.get("label") or bench["name"]),
            min_ns=stats["min"] * 1e9 / inner,
            median_ns=stats["median"] * 1e9 / inner,
            rounds=int(stats.get("rounds", 0)),
            baseline=bool(extra.get("baseline", False)),
            note=str(extra.get("note", "")),
            floor=bool(extra.get("floor", False)),
            value_ns=None if extra.get("value_ns") is None else float(extra["value_ns"]),
        )
        rows.append(row)
        for more in extra.get("more_rows", ()):  # other figures of the same benchmark
            value = float(more["value_ns"])
            figures = {"min_ns": value, "median_ns": value, "value_ns": value}
            label, note = str(more["label"]), str(more.get("note", ""))
            rows.append(
                replace(row, label=label, note=note, baseline=False, floor=False, **figures)
            )
    return rows


def group_rows(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows by group, known groups first; within a group the baseline comes first."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    ordered = [g for g in GROUP_ORDER if g in groups] + [g for g in groups if g not in GROUP_ORDER]
    return {g: sorted(groups[g], key=lambda r: not r.baseline) for g in ordered}


def _ns(value: float) -> str:
    if value >= 100_000:
        return f"{value / 1000:,.0f} µs"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def paired_group_table(group: str, rows: Sequence[Row]) -> str:
    """A paired group's markdown table (ratios measured round by round)."""
    base = next((r for r in rows if r.baseline), None)
    floor = next((r for r in rows if r.floor), None)
    lines = [
        f"### {group} (paired: baseline and contenders interleaved in each round)",
        "",
        "| label | ns/op (min) | ns/op (median) | ratio to baseline (median of rounds) "
        "| ratio of mins |"
        + (" added above floor (min), ratio |" if floor else "")
        + " rounds | note |",
        "|---|---:|---:|---:|---:|" + ("---:|" if floor else "") + "---:|---|",
    ]
    for row in rows:
        ratio = "1.00 (baseline)" if row.baseline else f"{row.ratio_median:.2f}"
        added = ""
        if floor is not None and base is not None:
            above, base_above = row.min_ns - floor.min_ns, base.min_ns - floor.min_ns
            share = f"{above / base_above:.2f}" if base_above > 0 and row is not floor else "—"
            added = f" {_ns(above)} ns, {share} |"
        lines.append(
            f"| {row.label} | {_ns(row.min_ns)} | {_ns(row.median_ns)} | {ratio} "
            f"| {row.ratio_min:.2f} |{added} {row.rounds} | {_note(row)} |"
        )
    return "\n".join(lines)


def _note(row: Row) -> str:
    if row.above is None:
        return row.note
    return f"{row.note}; added above {row.above!r}" if row.note else f"added above {row.above!r}"


def table(group: str, rows: Sequence[Row]) -> str:
    """One group's markdown table."""
    if rows and all(r.ratio_median is not None for r in rows):
        return paired_group_table(group, rows)
    baselines = [r for r in rows if r.baseline]
    base = baselines[0] if baselines else None
    floor = next((r for r in rows if r.floor), None)
    added_header = " added above floor, ratio |" if floor is not None else ""
    lines = [
        f"### {group}",
        "",
        f"| label | ns/op (min) | ns/op (median) | ratio to baseline (min) |{added_header}"
        " rounds | note |",
        "|---|---:|---:|---:|" + ("---:|" if floor is not None else "") + "---:|---|",
    ]
    for row in rows:
        if base is None or base.min_ns <= 0:
            ratio = "—"
        elif row is base:
            ratio = "1.00 (baseline)"
        else:
            ratio = f"{row.min_ns / base.min_ns:.2f}"
        added = ""
        if floor is not None:
            above = row.min_ns - floor.min_ns
            base_above = base.min_ns - floor.min_ns if base is not None else 0.0
            share = f"{above / base_above:.2f}" if base_above > 0 and row is not floor else "—"
            added = f" {_ns(above)} ns, {share} |"
        lines.append(
            f"| {row.label} | {_ns(row.min_ns)} | {_ns(row.median_ns)} | {ratio} |{added}"
            f" {row.rounds} | {_value_note(row)} |"
        )
    if base is not None and len(baselines) > 1:
        lines.append("")
        lines.append(f"(several rows marked baseline; ratios use {base.label!r})")
    return "\n".join(lines)


def _value_note(row: Row) -> str:
    if row.value_ns is None:
        return row.note
    shown = _ns(row.value_ns)
    value = f"value {shown}" if shown.endswith("µs") else f"value {shown} ns"
    return f"{row.note}; {value}" if row.note else value


def header(data: dict[str, Any]) -> str:
    """Where and when the numbers were taken."""
    machine = data.get("machine_info", {})
    commit = data.get("commit_info", {})
    cpu = machine.get("cpu", {})
    parts = [
        f"python {machine.get('python_version', '?')}",
        f"{cpu.get('brand_raw', machine.get('processor', '?'))}",
        f"{cpu.get('count', '?')} cores",
    ]
    if commit.get("id"):
        dirty = " (dirty)" if commit.get("dirty") else ""
        parts.append(f"commit {str(commit['id'])[:10]}{dirty}")
    return f"Benchmarks of {data.get('datetime', '?')}: " + ", ".join(parts)


def paired_table(data: dict[str, Any]) -> str | None:
    """Benchmarks that measured a paired ratio themselves (``extra_info["paired_median"]``)."""
    lines = []
    for bench in data.get("benchmarks", []):
        extra = bench.get("extra_info", {})
        if "paired_median" in extra:
            lines.append(
                f"| {extra.get('label', bench['name'])} | {_ns(extra['base_min_ns'])} "
                f"| {extra['paired_median']:.3f} | {extra['paired_min_ratio']:.3f} "
                f"| {extra.get('note', '')} |"
            )
    if not lines:
        return None
    head = [
        "### paired ratios",
        "",
        "| comparison | uninstrumented ns/step (min) | ratio (median of rounds) "
        "| ratio of mins | note |",
        "|---|---:|---:|---:|---|",
    ]
    return "\n".join(head + lines)


def render(data: dict[str, Any]) -> str:
    """The whole report: a header line and one table per group (paired ratios last)."""
    rows = [r for r in load_rows(data) if r.group != "paired-step"]
    groups = group_rows(rows)
    parts = [header(data), *(table(g, rows) for g, rows in groups.items())]
    paired = paired_table(data)
    if paired is not None:
        parts.append(paired)
    return "\n\n".join(parts) + "\n"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "performance.md"


@dataclass(frozen=True)
class Target:
    """One line of the targets table: a highest ratio to the baseline, or (``max_ns`` set)
    a highest absolute ``value_ns``."""

    group: str
    label: str
    max_ratio: float
    below_peers: bool
    max_ns: float | None = None


#: ns per unit of an absolute target
UNITS = {"ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}


def parse_limit(cell: str) -> tuple[float, float | None] | None:
    """``(max ratio, None)`` for a plain number, ``(inf, max ns)`` for a number with a unit
    (``2 µs``), ``None`` for anything else (the header and separator lines)."""
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|us|ms|s)?", cell.strip())
    if match is None:
        return None
    value, unit = float(match.group(1)), match.group(2)
    return (value, None) if unit is None else (float("inf"), value * UNITS[unit])


def read_targets(markdown: str) -> list[Target]:
    """The rows of the table under the "## Targets" heading; ``ValueError`` if none."""
    section = re.search(r"^## Targets\s*$(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    if section is None:
        raise ValueError("no '## Targets' section")
    targets = []
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not line.lstrip().startswith("|"):
            continue
        group, label, limit, peers = (c.strip("`") for c in cells)
        parsed = parse_limit(limit)
        if parsed is None:
            continue  # the header and separator lines
        targets.append(Target(group, label, parsed[0], peers.lower() == "yes", parsed[1]))
    if not targets:
        raise ValueError("the '## Targets' section has no table rows")
    return targets


def check_targets(rows: Sequence[Row], targets: Sequence[Target]) -> tuple[list[str], bool]:
    """One line per target (met, missed, or not measured in this run) and whether all the
    measured ones were met."""
    lines, ok = [], True
    for t in targets:
        group = [r for r in rows if r.group == t.group]
        row = next((r for r in group if r.label == t.label), None)
        if t.max_ns is not None:
            line, met = _check_absolute(t, row)
            lines.append(line)
            ok = ok and met
            continue
        base = next((r for r in group if r.baseline), None)
        if row is None or base is None:
            lines.append(f"not measured: {t.group} / {t.label}")
            continue
        ratio = _ratio(row, base)
        missed = []
        if ratio > t.max_ratio:
            missed.append(f"ratio {ratio:.2f} > {t.max_ratio:.2f}")
        if t.below_peers:
            missed += [
                f"not cheaper than {p.label} ({_ratio(p, base):.2f})"
                for p in group
                if p.peer and _ratio(p, base) <= ratio
            ]
        ok = ok and not missed
        verdict = "MISSED" if missed else "met"
        detail = "; ".join(missed) if missed else f"ratio {ratio:.2f} <= {t.max_ratio:.2f}"
        lines.append(f"{verdict}: {t.group} / {t.label}: {detail}")
    return lines, ok


def _check_absolute(t: Target, row: Row | None) -> tuple[str, bool]:
    """The line of an absolute target and whether it was met (or not measured)."""
    assert t.max_ns is not None
    if row is None:
        return f"not measured: {t.group} / {t.label}", True
    if row.value_ns is None:
        return f"MISSED: {t.group} / {t.label}: no value_ns in the benchmark", False
    within = row.value_ns <= t.max_ns
    sign = "<=" if within else ">"
    verdict = "met" if within else "MISSED"
    return (
        f"{verdict}: {t.group} / {t.label}: {row.value_ns:,.0f} ns {sign} {t.max_ns:,.0f} ns",
        within,
    )


def _ratio(row: Row, base: Row) -> float:
    if row.ratio_median is not None:
        return row.ratio_median
    return row.min_ns / base.min_ns if base.min_ns > 0 else float("inf")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path, help="output of pytest --benchmark-json")
    parser.add_argument(
        "--targets", type=Path, default=DOCS, help="markdown file with a '## Targets' table"
    )
    args = parser.parse_args(argv)
    data = json.loads(args.json_file.read_text(encoding="utf-8"))
    if not data.get("benchmarks"):
        print(f"{args.json_file}: no benchmarks in this file", file=sys.stderr)
        return 1
    sys.stdout.write(render(data))
    try:
        targets = read_targets(args.targets.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"cannot read the targets from {args.targets}: {exc}", file=sys.stderr)
        return 2
    lines, ok = check_targets(load_rows(data), targets)
    sys.stdout.write("\n## Targets\n\n" + "".join(f"- {line}\n" for line in lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
