"""ChromeTrace: a Perfetto / chrome://tracing file of the regions, bounded in memory."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks

import instrument
from instrument import observe
from instrument.region import CpuRegion, ObservedCpuRegion
from instrument.sinks import ChromeTrace
from instrument.testing import FakeClock


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def spans(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e["ph"] == "X"]


def test_complete_events_nest_as_the_regions_ran(tmp_path: Path, clock: FakeClock) -> None:
    sink = ChromeTrace(tmp_path / "run.json")
    with instrument.Reporter(every=None, sinks=[sink]) as reporter:
        with instrument.timed("step"):
            clock.advance(0.001)
            with instrument.timed("forward"):
                clock.advance(0.004)
            with instrument.timed("backward"):
                clock.advance(0.002)
        reporter.flush()
    events = {e["args"]["path"]: e for e in spans(load(tmp_path / "run.json"))}
    assert set(events) == {"step", "step/forward", "step/backward"}
    step, forward, backward = events["step"], events["step/forward"], events["step/backward"]
    assert (step["name"], forward["name"]) == ("step", "forward")
    assert step["dur"] == pytest.approx(7000.0)  # microseconds
    assert forward["dur"] == pytest.approx(4000.0)
    assert forward["ts"] - step["ts"] == pytest.approx(1000.0)
    assert backward["ts"] == pytest.approx(forward["ts"] + forward["dur"])
    assert {e["pid"] for e in events.values()} == {0}
    assert {e["tid"] for e in events.values()} == {threading.get_native_id()}


def test_the_file_opens_at_every_report_and_names_rank_and_threads(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "trace.json"
    reporter = instrument.Reporter(every=None, sinks=[ChromeTrace(path)])

    def work() -> None:
        with instrument.timed("loader"):
            pass

    thread = threading.Thread(target=work, name="loader-thread")
    thread.start()
    thread.join()
    with instrument.timed("step"):
        pass
    reporter.flush()
    first = load(path)  # written by the flush, before close
    assert {e["args"]["path"] for e in spans(first)} == {"loader", "step"}
    meta = {(e["name"], e["tid"]): e["args"] for e in first["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "rank 0"}
    assert {"name": "MainThread"} in meta.values()
    assert first["otherData"]["dropped_events"] == 0
    reporter.close()
    assert not list(path.parent.glob("*.partial"))


def test_the_ring_is_bounded_and_counts_what_it_dropped(tmp_path: Path) -> None:
    sink = ChromeTrace(tmp_path / "t.json", max_events=5)
    for i in range(12):
        with instrument.timed(f"r{i}"):
            pass
    sink.close()
    document = load(tmp_path / "t.json")
    assert [e["name"] for e in spans(document)] == ["r7", "r8", "r9", "r10", "r11"]
    assert document["otherData"]["dropped_events"] == 7
    assert document["otherData"]["max_events"] == 5


def test_regions_are_traced_only_while_a_trace_sink_is_open(tmp_path: Path) -> None:
    region = instrument.timed("x", clock="cpu")  # "auto" is CUDA once CUDA is up
    assert type(region) is CpuRegion
    sink = ChromeTrace(tmp_path / "t.json")
    assert type(region) is ObservedCpuRegion
    sink.close()
    sink.close()  # idempotent
    assert type(region) is CpuRegion
    assert observe.trace is None


def test_decorated_functions_timers_and_exceptions_are_traced(tmp_path: Path) -> None:
    sink = ChromeTrace(tmp_path / "t.json")

    @instrument.timed("f")
    def f() -> int:
        return 1

    assert f() == 1
    manual = instrument.timer("manual")
    manual.start()
    manual.stop()
    with pytest.raises(KeyError), instrument.timed("fails"):
        raise KeyError("boom")
    sink.close()
    assert [e["name"] for e in spans(load(tmp_path / "t.json"))] == ["f", "manual", "fails"]
    assert instrument.current_path() == ""


def test_timings_are_the_same_with_a_trace_open(tmp_path: Path, clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, sinks=[ChromeTrace(tmp_path / "t.json")])
    with instrument.timed("a"):
        clock.advance(0.5)
    assert reporter.flush()["a"].total == 0.5


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="max_events"):
        ChromeTrace("t.json", max_events=0)
    with pytest.raises(ValueError, match="file path"):
        ChromeTrace("")


def _rank_traces(rank: int, world_size: int, directory: str) -> None:
    sink = ChromeTrace(Path(directory) / "trace.json")
    reporter = instrument.Reporter(every=None, sinks=[sink])
    with instrument.timed(f"work_on_rank_{rank}"):
        torch.ones(4).sum()
    reporter.flush()
    reporter.close()


@pytest.mark.timeout(60)
def test_each_rank_writes_its_own_file(tmp_path: Path) -> None:
    run_ranks(_rank_traces, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.rank0.json", "trace.rank1.json"]
    for rank in (0, 1):
        document = load(tmp_path / f"trace.rank{rank}.json")
        assert [(e["name"], e["pid"]) for e in spans(document)] == [(f"work_on_rank_{rank}", rank)]
