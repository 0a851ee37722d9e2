"""TensorBoard: real event files, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from distributed_helpers import run_ranks

import instrument
from instrument.report import Node, RankStats, Report
from instrument.sinks.scalars import global_step, scalars, tag_segment
from instrument.sinks.tensorboard import TensorBoard
from instrument.stats import Stats
from instrument.testing import FakeClock, use_clock

Scalars = dict[str, list[tuple[int, float]]]
TAG = re.compile(r"^[\w.\-]+(/[\w.\-]+)*$")
HINT = re.escape('TensorBoard sink needs tensorboard: pip install "torch-instrument[tensorboard]"')
needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason='needs tensorboard: pip install "torch-instrument[tensorboard]"',
)


def summary_writer(log_dir: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir), flush_secs=3600)


def read(log_dir: Path) -> Scalars:
    """Every scalar in ``log_dir``'s event files: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def work(clock: FakeClock, forward: float, steps: int = 2) -> None:
    for _ in range(steps):
        with instrument.timed("step"):
            clock.advance(0.001)
            with instrument.timed("forward"):
                clock.advance(forward)
        clock.advance(0.004)
        instrument.step(samples=4, tokens=64)


def stats(mean: float, count: int = 1) -> Stats:
    return Stats(count, mean * count, mean, mean, mean, 0.0, mean, mean, mean)


@needs_tensorboard
def test_every_region_and_statistic_reads_back_at_the_report_step(
    tmp_path: Path, clock: FakeClock
) -> None:
    reporter = instrument.Reporter(
        every=None, sinks=[TensorBoard(tmp_path)], warmup=0, memory=False
    )
    for forward in (0.010, 0.020):
        work(clock, forward)
        reporter.flush()
    reporter.close()
    found = read(tmp_path)
    assert set(found) == {
        *(f"time/{p}/{s}" for p in ("step", "step/forward") for s in ("total_ms", "mean_ms")),
        *(f"time/{p}/{s}" for p in ("step", "step/forward") for s in ("max_ms", "p90_ms")),
        *(f"time/{p}/{s}" for p in ("step", "step/forward") for s in ("self_ms", "count")),
        *(f"step_time/{s}" for s in ("total_ms", "mean_ms", "max_ms", "p90_ms", "count")),
        "step_time/other_ms",
        "step_time/flush_ms",
        *(f"instrument/{s}" for s in ("share", "regions", "region_ns", "flush_ms")),
        *(f"throughput/{f}" for f in ("steps_per_sec", "samples_per_sec", "tokens_per_sec")),
        *(f"diagnosis/{kind}" for kind in (*instrument.diagnosis.KINDS, "verdict")),
    }  # no tflops / mfu: unknown without a FLOP count, so never written
    assert found["time/step/forward/mean_ms"] == [(2, pytest.approx(10.0)), (4, pytest.approx(20))]
    assert found["time/step/total_ms"] == [(2, pytest.approx(22.0)), (4, pytest.approx(42.0))]
    assert found["time/step/self_ms"] == [(2, pytest.approx(2.0)), (4, pytest.approx(2.0))]
    assert found["time/step/forward/count"] == [(2, 2.0), (4, 2.0)]
    assert found["step_time/mean_ms"][1] == (4, pytest.approx(25.0))
    assert found["step_time/other_ms"][1] == (4, pytest.approx(8.0))  # 2 x 4 ms outside "step"
    assert found["throughput/samples_per_sec"][0] == (2, pytest.approx(8 / 0.030))


@needs_tensorboard
def test_tags_match_the_pure_scalars_of_the_report(tmp_path: Path, clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, sinks=[TensorBoard(tmp_path)], warmup=0)
    work(clock, 0.010)
    report = reporter.flush()
    reporter.close()
    expected = scalars(report)
    assert any(tag.startswith("memory/host_rss") for tag in expected)  # sampled on Linux
    found = read(tmp_path)
    assert set(found) == set(expected)
    for tag, value in expected.items():
        assert found[tag] == [(2, pytest.approx(value, rel=1e-6))], tag


@needs_tensorboard
def test_region_names_become_readable_valid_tags(tmp_path: Path, clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, sinks=[TensorBoard(tmp_path)], memory=False)
    for name in ("all_reduce (async)", "all_reduce_async", "model.layers.0", "ü [x]"):
        with instrument.timed(name):
            clock.advance(0.003)
    reporter.flush()
    reporter.close()
    found = read(tmp_path)
    assert all(TAG.match(tag) for tag in found), sorted(found)
    assert found["time/all_reduce_async/mean_ms"] == [(1, pytest.approx(3.0))]
    assert "time/all_reduce_async_2/mean_ms" in found  # a second name cleaning to the same tag
    assert "time/model.layers.0/mean_ms" in found
    assert "time/ü_x/count" in found


@pytest.mark.parametrize(
    ("name", "segment"),
    [
        ("forward", "forward"),
        ("all_reduce (async)", "all_reduce_async"),
        ("a  b\tc", "a_b_c"),
        ("_private", "_private"),
        ("layer-1.attn", "layer-1.attn"),
        ("()", "_"),
    ],
)
def test_tag_segment(name: str, segment: str) -> None:
    assert tag_segment(name) == segment


def test_children_of_a_renamed_parent_stay_under_it() -> None:
    host = stats(0.001)
    report = Report(
        nodes=tuple(Node(path=p, host=host) for p in ("a b", "a_b", "a b/x", "a_b/x")),
        index=1,
    )
    tags = {tag.rpartition("/")[0] for tag in scalars(report)}
    assert tags == {"time/a_b", "time/a_b_2", "time/a_b/x", "time/a_b_2/x"}


@needs_tensorboard
def test_the_step_is_the_report_index_when_no_step_was_marked(
    tmp_path: Path, clock: FakeClock
) -> None:
    reporter = instrument.Reporter(every=None, sinks=[TensorBoard(tmp_path)], memory=False)
    for _ in range(2):
        with instrument.timed("eval"):
            clock.advance(0.5)
        reporter.flush()
    reporter.close()
    assert read(tmp_path)["time/eval/total_ms"] == [(1, 500.0), (2, 500.0)]
    assert global_step(Report(index=3, step=7)) == 7
    assert global_step(Report(index=3, step=0)) == 3


def test_host_and_device_time_are_both_written() -> None:
    node = Node(path="forward", host=stats(0.002, 3), device=stats(0.005, 3), self_time=0.015)
    found = scalars(Report(nodes=(node,), index=1))
    assert found["time/forward/mean_ms"] == pytest.approx(5.0)  # primary: the device time
    assert found["time/forward/self_ms"] == pytest.approx(15.0)
    assert found["time/forward/count"] == 3.0
    assert found["time_device/forward/total_ms"] == pytest.approx(15.0)
    assert found["time_host/forward/total_ms"] == pytest.approx(6.0)
    assert found["time_host/forward/p90_ms"] == pytest.approx(2.0)
    assert "time_host/forward/count" not in found
    host_only = scalars(Report(nodes=(Node(path="data", host=stats(0.001)),)))
    assert not [tag for tag in host_only if tag.startswith(("time_host", "time_device"))]


def test_ranks_memory_and_values_across_ranks() -> None:
    across = RankStats(0.1, 0.3, 0.2, rank_argmin=2, rank_argmax=1, ranks_present=3)
    nodes = (
        Node(path="forward", host=stats(0.1), ranks=across),
        Node(path="only_on_1", host=Stats.empty(), ranks=across),  # this rank never ran it
    )
    memory = {"host_rss": 3 * 2**29, "device_ooms": 2}
    rates = RankStats(100.0, 300.0, 200.0, 1, 0, 3)
    peak = RankStats(2.0**30, 2.0**31, 1.5 * 2**30, 0, 2, 3)
    report = Report(
        nodes=nodes,
        memory=memory,
        across={
            "throughput.tokens_per_sec": rates,
            "memory.device_peak_allocated": peak,
            "own.step/backward": RankStats(0.01, 0.04, 0.025, 0, 1, 2),
        },
    )
    found = scalars(report)
    assert found["time/forward/rank_max_ms"] == pytest.approx(300.0)
    assert found["time/forward/rank_min_ms"] == pytest.approx(100.0)
    assert found["time/forward/rank_mean_ms"] == pytest.approx(200.0)
    assert found["time/forward/rank_argmax"] == 1.0
    assert sorted(t for t in found if t.startswith("time/only_on_1/")) == [
        "time/only_on_1/rank_argmax",
        "time/only_on_1/rank_max_ms",
        "time/only_on_1/rank_mean_ms",
        "time/only_on_1/rank_min_ms",
    ]  # never a zero mean for a region this rank did not run
    assert found["memory/host_rss_gib"] == 1.5
    assert found["memory/device_ooms"] == 2.0
    assert found["across/throughput/tokens_per_sec/rank_min"] == 100.0
    assert found["across/throughput/tokens_per_sec/rank_argmin"] == 1.0
    assert found["across/memory/device_peak_allocated_gib/rank_max"] == 2.0
    assert found["across/memory/device_peak_allocated_gib/rank_argmax"] == 2.0
    assert found["across/own/step/backward_ms/rank_max"] == pytest.approx(40.0)  # ms, as time/
    assert found["across/own/step/backward_ms/rank_argmax"] == 1.0


def test_non_finite_values_are_left_out() -> None:
    rates = instrument.Throughput(steps=1, seconds=0.5, mfu=float("nan"), tflops=float("inf"))
    bad = Stats(1, float("inf"), float("inf"), 0.0, float("nan"), 0.0, 0.0, 0.0, 0.0)
    found = scalars(Report(nodes=(Node(path="x", host=bad),), throughput=rates))
    assert all(math.isfinite(v) for v in found.values())
    assert "throughput/mfu" not in found
    assert "throughput/tflops" not in found
    assert "time/x/total_ms" not in found
    assert found["time/x/count"] == 1.0


@needs_tensorboard
def test_nothing_is_created_before_the_first_report(tmp_path: Path) -> None:
    log_dir = tmp_path / "runs" / "exp"
    sink = TensorBoard(log_dir)
    assert sink.writer is None
    assert not log_dir.exists()
    sink.write(Report(nodes=(Node(path="x", host=stats(0.25)),), index=1))
    assert type(sink.writer).__name__ == "SummaryWriter"
    assert [p.name.startswith("events.out.tfevents") for p in log_dir.iterdir()] == [True]
    sink.flush()  # on disk now, before close
    assert read(log_dir)["time/x/mean_ms"] == [(1, 250.0)]
    sink.close()


@needs_tensorboard
def test_close_closes_the_created_writer_and_a_later_report_opens_another(
    tmp_path: Path,
) -> None:
    sink = TensorBoard(str(tmp_path), flush_secs=3600)
    sink.write(Report(nodes=(Node(path="x", host=stats(0.25)),), index=1))
    first = sink.writer
    sink.close()
    assert sink.writer is None
    assert first.file_writer is None  # SummaryWriter.close() drops its file writer
    assert read(tmp_path)["time/x/mean_ms"] == [(1, 250.0)]
    sink.write(Report(nodes=(Node(path="x", host=stats(0.5)),), index=2))
    sink.close()
    assert len(list(tmp_path.iterdir())) == 2
    assert read(tmp_path)["time/x/mean_ms"] == [(1, 250.0), (2, 500.0)]


@needs_tensorboard
def test_a_writer_passed_in_is_flushed_but_never_closed(tmp_path: Path, clock: FakeClock) -> None:
    writer = summary_writer(tmp_path)
    writer.add_scalar("loss", 1.5, global_step=2)
    reporter = instrument.Reporter(every=None, sinks=[TensorBoard(writer=writer)], memory=False)
    work(clock, 0.010)
    reporter.close()  # flushes, then closes the sink: the writer stays open and flushed
    assert writer.file_writer is not None
    found = read(tmp_path)
    assert found["loss"] == [(2, 1.5)]
    assert found["time/step/forward/mean_ms"] == [(2, pytest.approx(10.0))]
    writer.add_scalar("loss", 1.0, global_step=4)  # the user's writer goes on working
    writer.close()
    assert read(tmp_path)["loss"] == [(2, 1.5), (4, 1.0)]


class Broken:
    def write(self, report: Report) -> None:
        raise OSError("disk full")


@needs_tensorboard
def test_a_failing_sink_is_reported_once_and_tensorboard_gets_every_report(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sinks = [Broken(), TensorBoard(tmp_path)]
    with caplog.at_level(logging.ERROR, logger="instrument"):
        reporter = instrument.Reporter(every=2, sinks=sinks, memory=False)
        for forward in (0.010, 0.020, 0.030):
            work(clock, forward)
        reporter.close()
    assert read(tmp_path)["time/step/forward/mean_ms"] == [
        (2, pytest.approx(10.0)),
        (4, pytest.approx(20.0)),
        (6, pytest.approx(30.0)),
    ]
    (record,) = caplog.records
    assert "failed and was skipped" in record.getMessage()
    assert "Broken" in record.getMessage()


@needs_tensorboard
def test_rank_placeholder_and_per_rank_directories(tmp_path: Path) -> None:
    node = Node(path="x", host=stats(0.25))
    on_rank_1 = Report(nodes=(node,), index=1, rank=1, world_size=2)
    placeholder = TensorBoard(tmp_path / "a" / "rank{rank}", only_ranks="all")
    shared = TensorBoard(tmp_path / "b", only_ranks="all")
    single = TensorBoard(tmp_path / "c", only_ranks=1)
    for sink in (placeholder, shared, single):
        sink.write(on_rank_1)
        sink.close()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["rank1"]
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["rank1"]
    assert read(tmp_path / "c")["time/x/mean_ms"] == [(1, 250.0)]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((), {}, ValueError, "exactly one of log_dir or writer, got neither"),
        (("runs",), {"writer": object()}, ValueError, "got both"),
        ((), {"writer": object()}, TypeError, "must have add_scalar"),
        ((42,), {}, TypeError, "log_dir must be a text path, got 42"),
        ((b"runs",), {}, TypeError, "log_dir must be a text path, got b'runs'"),
        (("",), {}, ValueError, "got an empty string"),
        (("runs",), {"flush_secs": 0}, ValueError, "flush_secs must be > 0, got 0"),
        (("runs",), {"flush_secs": "10"}, TypeError, "flush_secs must be a number"),
        (("runs",), {"ranks": "some"}, ValueError, "unknown ranks 'some'"),
    ],
)
def test_bad_arguments_are_refused(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        TensorBoard(*args, **kwargs)


def test_missing_tensorboard_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=HINT) as caught:
        TensorBoard(tmp_path)
    assert caught.value.name == "tensorboard"
    TensorBoard(writer=Writer()).write(Report(index=1))  # your own writer needs no import


@needs_tensorboard
def test_tensorboard_is_imported_when_the_sink_is_made_never_at_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = TensorBoard(tmp_path)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    sink.write(Report(index=1))  # a flush imports nothing (a fork there could hang)
    sink.close()
    with pytest.raises(ModuleNotFoundError, match=HINT):  # the sink says so when it is made
        TensorBoard(tmp_path)


class Writer:
    """Any object with ``add_scalar`` can stand in for a SummaryWriter."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int, float | None]] = []

    def add_scalar(
        self, tag: str, value: float, global_step: int, walltime: float | None = None
    ) -> None:
        self.scalars.append((tag, value, global_step, walltime))


def test_any_writer_with_add_scalar_gets_every_scalar_at_the_report_step() -> None:
    writer = Writer()
    report = Report(nodes=(Node(path="x", host=stats(0.25)),), index=2, step=8, end_time=5.0)
    sink = TensorBoard(writer=writer)
    sink.write(report)
    sink.flush()  # a writer without flush() is fine
    sink.close()
    assert [(tag, value) for tag, value, _, _ in writer.scalars] == list(scalars(report).items())
    assert {(step, walltime) for _, _, step, walltime in writer.scalars} == {(8, 5.0)}


@needs_tensorboard
def test_repr() -> None:
    assert repr(TensorBoard("runs/exp")) == "TensorBoard('runs/exp')"


def rank_worker(rank: int, world_size: int, folder: str) -> None:
    clock = FakeClock()
    sinks = [
        TensorBoard(f"{folder}/job"),  # rank 0 only: one run per job
        TensorBoard(f"{folder}/each/rank{{rank}}", only_ranks="all"),
    ]
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=sinks, ranks="minmax", memory=False)
        with instrument.timed("forward"):
            clock.advance(0.1 * (rank + 1))  # rank 1 is the slowest
        instrument.step()
        reporter.flush()
        reporter.close()


@needs_tensorboard
@pytest.mark.slow  # two spawned processes: about 5 s
@pytest.mark.timeout(60)
def test_rank_zero_writes_the_job_and_every_rank_its_own_directory(tmp_path: Path) -> None:
    run_ranks(rank_worker, 2, str(tmp_path), timeout=50)
    assert sorted(p.name for p in (tmp_path / "each").iterdir()) == ["rank0", "rank1"]
    job = read(tmp_path / "job")
    assert len(list((tmp_path / "job").iterdir())) == 1  # rank 1 wrote nothing there
    assert job["time/forward/mean_ms"] == [(1, pytest.approx(100.0))]  # rank 0's own time
    assert job["time/forward/rank_max_ms"] == [(1, pytest.approx(200.0))]
    assert job["time/forward/rank_argmax"] == [(1, 1.0)]
    one = read(tmp_path / "each" / "rank1")
    assert one["time/forward/mean_ms"] == [(1, pytest.approx(200.0))]


# -- which regions get tags ----------------------------------------------------------------


def deep_report(clock: FakeClock) -> Report:
    """``forward`` over 12 layers (layer<i> takes i ms, with a 0.1 ms ``attn`` in it), and
    ``backward``: 26 regions."""
    reporter = instrument.Reporter(every=None, sinks=[], memory=False)
    with instrument.timed("forward"):
        for i in range(12):
            with instrument.timed(f"layer{i}"):
                clock.advance(i / 1e3)
                with instrument.timed("attn"):
                    clock.advance(0.0001)
    with instrument.timed("backward"):
        clock.advance(0.05)
    instrument.step()
    return reporter.flush()


def tagged(values: dict[str, float]) -> set[str]:
    """The region paths with ``time/`` tags."""
    return {tag[5:].rpartition("/")[0] for tag in values if tag.startswith("time/")}


def test_top_keeps_the_top_level_and_the_regions_with_the_most_time(clock: FakeClock) -> None:
    report = deep_report(clock)
    every = scalars(report)
    assert len(tagged(every)) == 26
    three = scalars(report, top=3)
    assert tagged(three) == {"forward", "backward", *(f"forward/layer{i}" for i in (9, 10, 11))}
    assert tagged(scalars(report, top=0)) == {"forward", "backward"}
    rest = {tag: value for tag, value in every.items() if not tag.startswith("time/")}
    assert rest  # step time, self-cost, diagnosis: written whatever ``top``
    assert {tag: v for tag, v in three.items() if not tag.startswith("time/")} == rest
    assert all(every[tag] == value for tag, value in three.items())


def test_the_sink_writes_ten_deeper_regions_by_default_and_every_one_on_request(
    clock: FakeClock,
) -> None:
    report = deep_report(clock)
    default, every = Writer(), Writer()
    TensorBoard(writer=default).write(report)
    TensorBoard(writer=every, top=None).write(report)
    assert len(tagged({tag: value for tag, value, _, _ in default.scalars})) == 2 + 10
    assert {tag for tag, _, _, _ in every.scalars} == set(scalars(report))
    for bad in (-1, 2.5, True, "all"):
        with pytest.raises(ValueError, match=r"top must be an int >= 0, or None for every region"):
            TensorBoard(writer=Writer(), top=bad)  # type: ignore[arg-type]
