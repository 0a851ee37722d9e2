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
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


def load_rows(data: dict[str, Any]) -> list[Row]:
    """The rows of a pytest-benchmark JSON document, in the order they ran."""
    rows = []
    for bench in data.get("benchmarks", []):
        extra = bench.get("extra_info", {})
        stats = bench["stats"]
        inner = int(extra.get("inner", 1)) or 1
        rows.append(
            Row(
                group=bench.get("group") or extra.get("group") or "(no group)",
                label=str(extra.get("label") or bench["name"]),
                min_ns=stats["min"] * 1e9 / inner,
                median_ns=stats["median"] * 1e9 / inner,
                rounds=int(stats.get("rounds", 0)),
                baseline=bool(extra.get("baseline", False)),
                note=str(extra.get("note", "")),
                floor=bool(extra.get("floor", False)),
            )
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


def table(group: str, rows: Sequence[Row]) -> str:
    """One group's markdown table."""
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
            f" {row.rounds} | {row.note} |"
        )
    if base is not None and len(baselines) > 1:
        lines.append("")
        lines.append(f"(several rows marked baseline; ratios use {base.label!r})")
    return "\n".join(lines)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path, help="output of pytest --benchmark-json")
    args = parser.parse_args(argv)
    data = json.loads(args.json_file.read_text(encoding="utf-8"))
    if not data.get("benchmarks"):
        print(f"{args.json_file}: no benchmarks in this file", file=sys.stderr)
        return 1
    sys.stdout.write(render(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
