"""tests/benchmarks/report_ratios.py: the targets written in docs/performance.md are the
ones it checks, and a missed target makes it exit non-zero (so ``tox -e bench`` fails)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "report_ratios", ROOT / "tests" / "benchmarks" / "report_ratios.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["report_ratios"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ratios = _load()


def _row(label: str, ratio: float, **flags: bool) -> dict[str, Any]:
    return {
        "label": label,
        "min_ns": 100.0 * ratio,
        "median_ns": 110.0 * ratio,
        "ratio_median": ratio,
        "ratio_min": ratio,
        "rounds": 300,
        "baseline": flags.get("baseline", False),
        "floor": False,
        "peer": flags.get("peer", False),
        "note": "",
    }


def _bench(group: str, *rows: dict[str, Any]) -> dict[str, Any]:
    return {"group": group, "name": group, "stats": {}, "extra_info": {"paired_rows": list(rows)}}


def _data(timed: float, peer: float, decorator: float) -> dict[str, Any]:
    return {
        "benchmarks": [
            _bench(
                "context-manager",
                _row("hand-written class", 1.0, baseline=True),
                _row("instrument timed", timed),
                _row("torchtnt Timer.time", peer, peer=True),
            ),
            _bench(
                "decorator",
                _row("with instrument.timed", 1.0, baseline=True),
                _row("@instrument.timed", decorator),
            ),
        ]
    }


def test_the_targets_are_read_from_performance_md() -> None:
    targets = ratios.read_targets((ROOT / "docs" / "performance.md").read_text())
    found = {(t.group, t.label): (t.max_ratio, t.below_peers) for t in targets}
    assert found[("context-manager", "instrument timed")] == (1.0, True)
    assert found[("decorator", "@instrument.timed")] == (1.5, False)
    assert found[("clock-pair", "with instrument.timed")] == (1.3, False)
    assert found[("auto-step", "instrument.auto between reports (every=50)")] == (0.6, False)
    assert ("disabled", "instrument timed, disabled") in found


@pytest.mark.parametrize(
    ("timed", "peer", "decorator", "status"),
    [
        (0.6, 2.0, 0.9, 0),  # every measured target met (the disabled group not run)
        (1.2, 2.0, 0.9, 1),  # above its ratio
        (0.6, 0.5, 0.9, 1),  # a peer is cheaper
        (0.6, 2.0, 1.55, 1),  # the decorator's 1.5
    ],
)
def test_a_missed_target_exits_non_zero(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    timed: float,
    peer: float,
    decorator: float,
    status: int,
) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_data(timed, peer, decorator)))
    assert ratios.main([str(path)]) == status
    out = capsys.readouterr().out
    assert ("MISSED" in out) == bool(status)
    assert "not measured: disabled / instrument timed, disabled" in out
    assert "(paired: baseline and contenders interleaved in each round)" in out


def test_unreadable_targets_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_data(0.6, 2.0, 0.9)))
    docs = tmp_path / "perf.md"
    docs.write_text("# Performance\n\nno targets here\n")
    assert ratios.main([str(path), "--targets", str(docs)]) == 2


def test_rows_measured_above_another_compare_added_costs() -> None:
    """A baseline measured ``above`` a row makes every ratio one of added costs."""
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    try:
        import paired
    finally:
        sys.path.pop(0)
    now = [0]

    def costing(ns: int) -> Any:
        def fn() -> None:
            now[0] += ns

        return fn

    rows = [
        paired.Contender("with", costing(50), inner=1, baseline=True, above="loop"),
        paired.Contender("decorated", costing(45), inner=1, above="call"),
        paired.Contender("call", costing(20), inner=1),
        paired.Contender("loop", costing(10), inner=1),
    ]
    summary, per_op = paired.run_paired(
        rows, rounds=5, warmup_rounds=1, clock=lambda: now[0], interleave=3
    )
    ratios = {row["label"]: row["ratio_median"] for row in summary}
    assert ratios == {"with": 1.0, "decorated": 25 / 40, "call": 0.5, "loop": 0.25}
    assert per_op["decorated"] == [45.0] * 5
    with pytest.raises(ValueError, match="not another row"):
        paired.run_paired([paired.Contender("a", costing(1), baseline=True, above="b")])


def test_turns_settle_untimed_and_time_a_block() -> None:
    """A turn is the setup, ``settle`` untimed calls, then ``block`` timed ones: what a call
    costs right after another contender's stays out of the figures."""
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    try:
        import paired
    finally:
        sys.path.pop(0)
    now = [0]
    calls = {"a": 0, "b": 0}
    last = [""]

    def costing(label: str, ns: int) -> Any:
        def fn() -> None:
            calls[label] += 1
            now[0] += ns * (10 if last[0] != label else 1)  # dearer right after the other
            last[0] = label

        return fn

    rows = [
        paired.Contender("a", costing("a", 4), inner=1, baseline=True),
        paired.Contender("b", costing("b", 2), inner=1),
    ]
    summary, per_op = paired.run_paired(
        rows, rounds=4, warmup_rounds=1, clock=lambda: now[0], interleave=2, block=3, settle=1
    )
    assert per_op == {"a": [4.0] * 4, "b": [2.0] * 4}
    assert calls == {"a": 5 * 2 * 4, "b": 5 * 2 * 4}
    assert {row["label"]: row["ratio_median"] for row in summary} == {"a": 1.0, "b": 0.5}
    _, unsettled = paired.run_paired(rows, rounds=4, warmup_rounds=1, clock=lambda: now[0])
    assert max(unsettled["a"]) == 40.0  # without settle, a call after the other's is dearer
    with pytest.raises(ValueError, match="block must be >= 1"):
        paired.run_paired(rows, block=0)


def _flush_bench(value_ns: float | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"label": "flush: 1000 paths x 10 calls", "inner": 1}
    if value_ns is not None:
        extra["value_ns"] = value_ns
    return {
        "group": "flush",
        "name": "flush",
        "stats": {"min": 1e-3, "median": 2e-3},
        "extra_info": extra,
    }


def test_an_at_most_with_a_unit_is_an_absolute_target() -> None:
    text = "## Targets\n\n| group | row | at most | peers |\n|---|---|---:|---|\n"
    text += "| g | a | 2 µs | no |\n| g | b | 0.2 ms | no |\n"
    text += "| g | c | 1.5 | no |\n| g | d | 30 ns | no |\n"
    found = {t.label: (t.max_ratio, t.max_ns) for t in ratios.read_targets(text)}
    assert found == {
        "a": (float("inf"), 2000.0),
        "b": (float("inf"), 200_000.0),
        "c": (1.5, None),
        "d": (float("inf"), 30.0),
    }
    docs = ratios.read_targets((ROOT / "docs" / "performance.md").read_text())
    flush = next(t for t in docs if t.group == "flush")
    assert (flush.label, flush.max_ns, flush.below_peers) == (
        "flush: 1000 paths x 10 calls",
        2000.0,
        False,
    )


@pytest.mark.parametrize(
    ("value_ns", "status", "line"),
    [
        (570.0, 0, "met: flush / flush: 1000 paths x 10 calls: 570 ns <= 2,000 ns"),
        (2500.0, 1, "MISSED: flush / flush: 1000 paths x 10 calls: 2,500 ns > 2,000 ns"),
        (None, 1, "MISSED: flush / flush: 1000 paths x 10 calls: no value_ns in the benchmark"),
    ],
)
def test_an_absolute_target_is_checked_against_value_ns(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    value_ns: float | None,
    status: int,
    line: str,
) -> None:
    data = _data(0.6, 2.0, 0.9)
    data["benchmarks"].append(_flush_bench(value_ns))
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    assert ratios.main([str(path)]) == status
    out = capsys.readouterr().out
    assert f"- {line}\n" in out
    if value_ns is not None:
        assert f"value {value_ns:,.0f} ns" in out  # shown in the flush table too


def test_an_absolute_target_not_run_is_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_data(0.6, 2.0, 0.9)))
    assert ratios.main([str(path)]) == 0
    assert "not measured: flush / flush: 1000 paths x 10 calls" in capsys.readouterr().out


def test_each_of_a_benchmarks_more_rows_is_checked_as_a_row_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _flush_bench(570.0)
    bench["extra_info"]["more_rows"] = [
        {"label": "flush: 1000 paths x 10 calls", "value_ns": 900.0, "note": "x"},
    ]
    bench["extra_info"]["label"] = "flush alone"
    data = _data(0.6, 2.0, 0.9)
    data["benchmarks"].append(bench)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    assert ratios.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "- met: flush / flush: 1000 paths x 10 calls: 900 ns <= 2,000 ns\n" in out
    assert "| flush alone |" in out
    bench["extra_info"]["more_rows"][0]["value_ns"] = 2500.0
    path.write_text(json.dumps(data))
    assert ratios.main([str(path)]) == 1
    assert "MISSED: flush / flush: 1000 paths x 10 calls: 2,500 ns > 2,000 ns" in (
        capsys.readouterr().out
    )
