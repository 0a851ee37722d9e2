"""Straggler scores, the order-preserving packing of the reductions, and how reports carry,
render and export what crossed the ranks (no process group needed)."""

from __future__ import annotations

import math

import pytest
import torch

import instrument
from instrument.distributed.agree import Verdict
from instrument.distributed.reduce import _from_ordered, _ordered, path_hash
from instrument.distributed.stragglers import Tracker, is_collective, own_times
from instrument.report import Node, RankStats, Report, Straggler
from instrument.sinks.scalars import scalars
from instrument.stats import Stats

STATS = Stats(1, 0.2, 0.2, 0.2, 0.2, 0.0, 0.2, 0.2, 0.2)


def test_relative_and_individual_scores_and_k_consecutive_intervals() -> None:
    tracker = Tracker(threshold=0.8, intervals=2)
    fastest = {"step": 1.0, "step/forward": 0.1, "step/tiny": 0.001}
    scores = tracker.update(
        {"step": 1.0, "step/forward": 0.2, "step/tiny": 0.005},
        fastest,
        {"step": 1.0, "step/forward": 0.2, "step/tiny": 0.005},
    )
    assert scores["step/forward"].relative == 0.5
    assert scores["step/forward"].individual == 1.0
    assert "step/tiny" not in scores  # below 1 % of the largest region: not scored
    assert tracker.slow_regions() == []  # one interval is not enough
    tracker.update({"step/forward": 0.4}, {"step/forward": 0.1}, {"step/forward": 0.4})
    assert tracker.slow_regions() == [("step/forward", 0.25, 2)]
    scores = tracker.update({"step/forward": 0.3}, {"step/forward": 0.3}, {"step/forward": 0.3})
    assert scores["step/forward"].relative == 1.0
    assert scores["step/forward"].individual == pytest.approx(0.2 / 0.3)
    assert tracker.slow_regions() == []  # recovered: cleared at once


def test_collectives_are_not_scored() -> None:
    tracker = Tracker(threshold=0.8, intervals=1)
    scores = tracker.update({"a": 0.1, "b": 0.5}, {"a": 0.1, "b": 0.1}, {"a": 0.1, "b": 0.5}, {"b"})
    assert set(scores) == {"a"}
    assert is_collective(Node("backward/all_reduce", STATS))
    assert is_collective(Node("backward/ddp_all_reduce (async)", STATS, concurrent=True))
    assert is_collective(Node("step/my_exchange", STATS, bytes=64))
    assert not is_collective(Node("step/forward", STATS))


def test_own_time_leaves_out_synchronous_totals_and_the_async_union_once() -> None:
    def node(path: str, total: float, **fields: object) -> Node:
        return Node(path, Stats.empty().with_total(total), **fields)  # type: ignore[arg-type]

    nodes = [
        node("step", 10.0),
        node("step/forward", 1.0),
        node("step/all_reduce", 2.0),  # synchronous: its total
        node("step/all_reduce/inner", 1.0, bytes=8),  # inside it: counted with it
        node("step/backward", 5.0, concurrent_time=3.0),  # the buckets cover 3 s of it
        node("step/backward/ddp_all_reduce", 6.0, concurrent=True),  # summed: 6 s
    ]
    assert own_times(nodes) == {"/own/step": 10.0 - 2.0 - 3.0, "/own/step/backward": 2.0}
    assert own_times(nodes[:2]) == {}  # no collective: no own time


@pytest.mark.parametrize(
    "values",
    [[-math.inf, -2.0, -1.0, -1e-300, -0.0, 0.0, 1e-300, 0.1, 0.2, 1.0, 3e9, math.inf]],
)
def test_the_packing_keeps_the_order_of_floats(values: list[float]) -> None:
    keys = _ordered(torch.tensor(values, dtype=torch.float64))
    assert keys.tolist() == sorted(keys.tolist())
    assert _from_ordered(keys).tolist() == values  # exact round trip


def test_path_hash_depends_on_names_and_order() -> None:
    assert path_hash(["a", "b"]) == path_hash(["a", "b"])
    assert path_hash(["a", "b"]) != path_hash(["b", "a"])
    assert 0 <= path_hash(["x"]) < 2**63


def test_verdicts_name_ranks() -> None:
    missing = Verdict(ok=False, missing=(3, 5))
    assert missing.reason(2.0) == "ranks [3, 5] did not reach this flush within 2 s"
    odd = Verdict(ok=False, mismatched={1: (4, 7, 8)}, expected=(6, 8))
    assert odd.reason(2.0) == (
        "ranks [1] are at another interval (rank 1: interval #4, steps 7..8)"
        " (the others: steps 6..8)"
    )
    assert Verdict.from_json(odd.to_json()) == odd
    assert Verdict(ok=True).reason(1.0) == ""


def _combined() -> Report:
    ranks = RankStats(0.1, 0.2, 0.15, 0, 1, 2, slowest=1, relative_score=0.5, individual_score=1)
    collective = RankStats(0.01, 0.11, 0.06, 1, 0, 2, slowest=1)
    return Report(
        nodes=(
            Node("train", STATS),
            Node("train/forward", STATS, ranks=ranks),
            Node("train/all_reduce", STATS, ranks=collective),
        ),
        rank=0,
        world_size=2,
        ranks="minmax",
        group_size=2,
        stragglers=(Straggler(1, "node-7", ("train/forward",), (0.5,), 3),),
        stragglers_count=1,
    )


def test_reports_carry_scores_and_stragglers_through_every_sink() -> None:
    report = _combined()
    assert Report.from_dict(report.to_dict()) == report  # JSONL
    assert report["train/all_reduce"].slowest_rank == 1  # arrived last, not argmax 0
    assert report["train/forward"].relative_score == 0.5
    text = report.render()
    assert "across 2 ranks" in text
    assert "stragglers: rank 1 (node-7): train/forward 0.50 for 3 intervals" in text
    tags = scalars(report)  # TensorBoard and wandb
    assert tags["time/train/forward/relative_score"] == 0.5
    assert tags["time/train/forward/individual_score"] == 1.0
    assert tags["time/train/all_reduce/slowest_rank"] == 1.0
    assert tags["stragglers/count"] == 1.0
    assert tags["stragglers/rank_1/min_score"] == 0.5
    assert tags["stragglers/rank_1/intervals"] == 3.0


def test_a_local_fallback_says_why() -> None:
    report = Report(nodes=(Node("train", STATS),), across_note="ranks [1] did not reach")
    assert Report.from_dict(report.to_dict()) == report
    assert "across ranks: not combined, this rank only: ranks [1] did not reach" in (
        report.render()
    )
    assert "across" not in Report(nodes=(Node("train", STATS),)).render()


def test_too_many_stragglers_are_counted_not_listed() -> None:
    report = Report(
        nodes=(Node("train", STATS),), ranks="minmax", group_size=512, stragglers_count=80
    )
    assert "stragglers: 80 ranks (too many to list)" in report.render()
    assert scalars(report)["stragglers/count"] == 80.0


def test_old_reports_still_load() -> None:
    data = _combined().to_dict()
    for key in ("group_size", "stragglers", "stragglers_count", "across_note"):
        del data[key]
    for node in data["nodes"]:
        if node["ranks"]:
            for key in ("slowest", "relative_score", "individual_score"):
                del node["ranks"][key]
    old = Report.from_dict(data)
    assert old.stragglers == ()
    assert old["train/all_reduce"].slowest_rank == 0  # argmax, as before


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("rank_timeout", 0, "rank_timeout must be a positive number"),
        ("rank_timeout", "soon", "rank_timeout must be a positive number"),
        ("straggler_threshold", 1.5, r"straggler_threshold must be a number in \(0, 1\]"),
        ("straggler_intervals", 0, "straggler_intervals must be an int >= 1"),
    ],
)
def test_bad_options_are_named(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        instrument.Reporter(every=None, **{option: value})  # type: ignore[arg-type]
