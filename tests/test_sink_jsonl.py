"""JSONL: one strict-JSON report per line, appended and flushed at every write."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import timed_step
from distributed_helpers import run_ranks

import instrument
from instrument.sinks.jsonl import JSONL
from instrument.testing import FakeClock, use_clock


def lines(path: Path) -> list[dict[str, Any]]:
    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not strict JSON")

    return [json.loads(line, parse_constant=no_constants) for line in path.read_text().splitlines()]


def test_every_report_reads_back_exactly_one_per_line(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.jsonl"
    reporter = instrument.Reporter(every=None, sinks=[JSONL(path)], normalizer="steps")
    flushed = []
    for forward in (0.010, 0.020):
        timed_step(clock, "forward", forward)
        flushed.append(reporter.flush())
    reporter.close()
    read = [instrument.Report.from_dict(data) for data in lines(path)]
    assert read == flushed
    assert read[1]["step/forward"].total == pytest.approx(0.020)
    assert [r.index for r in read] == [1, 2]
    assert path.read_text().endswith("\n")


def test_a_line_is_on_disk_as_soon_as_the_report_is_written(
    tmp_path: Path, clock: FakeClock
) -> None:
    sink = JSONL(tmp_path / "run.jsonl")
    reporter = instrument.Reporter(every=1, sinks=[sink])
    timed_step(clock, "forward", 0.010)  # step() flushes: the sink is still open
    assert sink._file is not None
    assert not sink._file.closed
    (line,) = lines(tmp_path / "run.jsonl")
    assert line["nodes"][1]["path"] == "step/forward"
    timed_step(clock, "forward", 0.010)
    assert len(lines(tmp_path / "run.jsonl")) == 2
    reporter.close()


def test_a_removed_directory_is_created_again_and_said_once(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "logs" / "run.jsonl"
    reporter = instrument.Reporter(every=None, sinks=[JSONL(path)])
    timed_step(clock, "forward", 0.010)
    reporter.flush()
    shutil.rmtree(path.parent)  # a cleanup job, a full disk handled by hand, ...
    for forward in (0.020, 0.030):
        timed_step(clock, "forward", forward)
        reporter.flush()
        shutil.rmtree(path.parent)
        path.parent.mkdir()  # gone, then an empty directory of the same name: still a new file
    timed_step(clock, "forward", 0.040)
    reporter.close()
    assert [line["index"] for line in lines(path)] == [4]
    warned = [r.getMessage() for r in caplog.records if "was removed or moved" in r.getMessage()]
    assert len(warned) == 1
    assert str(path) in warned[0]


def test_a_renamed_file_is_created_again(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.jsonl"
    reporter = instrument.Reporter(every=None, sinks=[JSONL(path)])
    timed_step(clock, "forward", 0.010)
    reporter.flush()
    path.rename(tmp_path / "run.jsonl.1")  # log rotation
    timed_step(clock, "forward", 0.020)
    reporter.close()
    assert [line["index"] for line in lines(tmp_path / "run.jsonl.1")] == [1]
    assert [line["index"] for line in lines(path)] == [2]


def test_nothing_is_created_before_the_first_report(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "run.jsonl"
    sink = JSONL(str(path))
    assert not path.parent.exists()
    sink.write(instrument.Report())
    assert path.is_file()  # parent directories made on the first write
    assert sink.written == path
    sink.close()


def test_appends_across_reporters_and_after_close(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"earlier": "content"}\n')
    shared = JSONL(path)
    for forward in (0.010, 0.020):  # two reporters, one after the other, one sink
        with instrument.Reporter(every=None, sinks=[shared]) as reporter:
            timed_step(clock, "forward", forward)
            reporter.flush()
    assert shared._file is None  # each reporter closed it; the second write reopened it
    other = JSONL(path)  # a second sink on the same file appends too
    other.write(instrument.Report(index=9))
    other.close()
    found = path.read_text().splitlines()
    assert found[0] == '{"earlier": "content"}'
    assert [json.loads(line).get("index") for line in found[1:]] == [1, 1, 9]


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    rates = instrument.Throughput(steps=1, seconds=0.5, mfu=float("nan"), tflops=float("inf"))
    report = instrument.Report(steps=1, throughput=rates)
    JSONL(tmp_path / "r.jsonl").write(report)
    (line,) = lines(tmp_path / "r.jsonl")  # parse_constant would fail on NaN / Infinity
    assert line["throughput"]["mfu"] is None
    assert line["throughput"]["tflops"] is None
    back = instrument.Report.from_dict(line)
    assert back.throughput == dataclasses.replace(rates, mfu=None, tflops=None)


def test_a_rank_placeholder_is_filled_in_a_single_process(tmp_path: Path) -> None:
    sink = JSONL(tmp_path / "run-{rank}.jsonl")
    sink.write(instrument.Report())
    sink.close()
    assert [p.name for p in tmp_path.iterdir()] == ["run-0.jsonl"]


@pytest.mark.parametrize(
    ("path", "error", "match"),
    [
        (42, TypeError, "JSONL needs a file path .*got 42"),
        (b"run.jsonl", TypeError, "JSONL needs a file path"),
        ("", ValueError, "empty string"),
    ],
)
def test_bad_paths_are_refused(path: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        JSONL(path)  # type: ignore[arg-type]


def test_bad_ranks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown ranks 'some'"):
        JSONL(tmp_path / "x.jsonl", only_ranks="some")


def test_repr_names_the_path() -> None:
    assert repr(JSONL("logs/run.jsonl")) == "JSONL('logs/run.jsonl')"


def rank_worker(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    clock = FakeClock()
    sinks = [
        JSONL(f"{folder}/run.jsonl"),  # every rank, ".rank<R>" before the suffix
        JSONL(f"{folder}/r{{rank}}/run.jsonl", only_ranks=[1]),  # rank 1 only, placeholder filled
    ]
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=sinks, ranks="minmax", memory=False)
        with instrument.timed("forward"):
            clock.advance(0.1 * (rank + 1))
        instrument.step()
        report = reporter.flush()
        reporter.close()
        return report.to_dict()


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_each_rank_writes_its_own_file(tmp_path: Path) -> None:
    flushed = run_ranks(rank_worker, 2, str(tmp_path), timeout=90)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl")) == [
        "r1/run.jsonl",
        "run.rank0.jsonl",
        "run.rank1.jsonl",
    ]
    for rank in (0, 1):
        (line,) = lines(tmp_path / f"run.rank{rank}.jsonl")
        assert line == flushed[rank]
        report = instrument.Report.from_dict(line)
        assert (report.rank, report.world_size) == (rank, 2)
        assert report["forward"].rank_max == pytest.approx(0.2)
    assert lines(tmp_path / "r1" / "run.jsonl") == [flushed[1]]
