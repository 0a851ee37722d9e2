"""A flush's report keeps the registry's columns and builds its nodes on first read: the
built report is the one an eager build gives, and reads, compares, pickles and copies
as any report. The diagnosis reads the nodes at the flush, so these reporters run without it."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
from collections.abc import Iterator

import pytest

import instrument
from instrument import registry
from instrument.report import LazyNodes, Report
from instrument.testing import FakeClock, use_clock


@pytest.fixture
def reporter() -> Iterator[instrument.Reporter]:
    with use_clock(FakeClock()):
        rep = instrument.Reporter(every=None, sinks=[], memory=False, diagnose=False)
        yield rep
        rep.close(flush=False)


def _record() -> None:
    for name, calls in (("a", 3), ("b", 1)):
        for _ in range(calls):
            with instrument.timed(name), instrument.timed("inner"):
                pass


def _flush(reporter: instrument.Reporter) -> Report:
    _record()
    return reporter.flush()


def test_a_flush_report_builds_its_nodes_on_first_read(reporter: instrument.Reporter) -> None:
    report = _flush(reporter)
    assert isinstance(report.__dict__["nodes"], LazyNodes)
    assert len(report) == 4  # known without building
    assert isinstance(report.__dict__["nodes"], LazyNodes)
    assert report.paths() == ("a", "a/inner", "b", "b/inner")
    assert isinstance(report.__dict__["nodes"], tuple)  # built once, kept
    assert report.nodes is report.nodes
    assert report["a"].count == 3
    assert report["a/inner"].count == 3


def test_a_built_report_equals_the_same_report_made_eagerly(
    reporter: instrument.Reporter,
) -> None:
    report = _flush(reporter)
    eager = dataclasses.replace(report, nodes=tuple(report.nodes))
    assert isinstance(eager.__dict__["nodes"], tuple)
    assert report == eager
    assert eager == report
    assert report != dataclasses.replace(report, nodes=report.nodes[:1])


@pytest.mark.parametrize(
    "clone",
    [
        lambda r: pickle.loads(pickle.dumps(r)),
        copy.copy,
        copy.deepcopy,
        lambda r: dataclasses.replace(r, index=r.index),
        lambda r: Report.from_dict(r.to_dict()),
    ],
    ids=["pickle", "copy", "deepcopy", "replace", "dict"],
)
def test_an_unread_report_clones_into_an_equal_one(
    reporter: instrument.Reporter, clone: object
) -> None:
    report = _flush(reporter)
    assert isinstance(report.__dict__["nodes"], LazyNodes)
    other = clone(report)  # type: ignore[operator]
    assert isinstance(other.__dict__["nodes"], tuple)
    assert other == report
    assert other["a/inner"] == report["a/inner"]


def test_the_level_filter_and_normalizer_apply_when_built() -> None:
    clock = FakeClock()
    with use_clock(clock):
        rep = instrument.Reporter(every=None, sinks=[], memory=False, level=1, normalizer=2.0)
        with instrument.timed("top"):
            clock.advance(0.5)
            with instrument.timed("detail", level=2):
                clock.advance(0.25)
        report = rep.flush()
        rep.close(flush=False)
    assert len(report) == 1
    assert report.paths() == ("top",)
    assert report["top"].total == 0.375 == report["top"].self  # (0.5 + 0.25) / 2, all self


def test_a_kept_report_does_not_keep_idle_paths_alive(reporter: instrument.Reporter) -> None:
    kept = [_flush(reporter)]
    for _ in range(registry.idle_flushes + 1):
        kept.append(reporter.flush())
    gc.collect()
    assert "a" not in registry.ROOT.children  # released although the first report lives
    assert kept[0]["a"].count == 3


def test_collected_counts_the_regions_and_the_calls_of_each_path() -> None:
    _record()
    collected = registry.collect()
    calls = {node.path: n for node, n in collected.calls()}
    assert calls == {"a": 3, "a/inner": 3, "b": 1, "b/inner": 1}
    assert collected.regions == 8
    assert collected.host.summary(collected.paths.index("b")) is not None


@pytest.mark.parametrize("many", [False, True], ids=["few keys", "many keys"])
def test_collected_finds_the_row_of_a_node_by_search_or_index(many: bool) -> None:
    names = [f"p{i}" for i in range(30)]
    for name in names:
        with instrument.timed(name):
            pass
    stray = registry.PathNode("stray", None)  # never a row
    collected = registry.collect()
    wanted = [registry.ROOT.children[n] for n in (names if many else names[:3])]
    rows = collected.rows_of([*wanted, stray])
    assert rows == {node: collected.nodes.index(node) for node in wanted}
    assert all(collected.paths[row] == node.path for node, row in rows.items())
