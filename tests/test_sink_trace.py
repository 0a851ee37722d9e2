"""ChromeTrace: a Perfetto / chrome://tracing file of the regions, bounded in memory."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks

import instrument
from instrument import observe
from instrument.regions import region as region_module
from instrument.regions.frames import Frame
from instrument.regions.region import CpuRegion, ObservedCpuRegion
from instrument.report import FLUSH_ROW
from instrument.sinks import ChromeTrace, trace
from instrument.testing import FakeClock


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def spans(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The regions' events (the reporter's own flushes left out)."""
    return [e for e in document["traceEvents"] if e["ph"] == "X" and e["name"] != FLUSH_ROW]


def flushes(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e["ph"] == "X" and e["name"] == FLUSH_ROW]


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


def test_a_trace_sink_dropped_unclosed_stops_tracing_when_collected(tmp_path: Path) -> None:
    region = instrument.timed("x", clock="cpu")
    kept = ChromeTrace(tmp_path / "kept.json")
    sink = ChromeTrace(tmp_path / "t.json")
    with region:
        pass
    sink.write(instrument.Report())
    del sink
    gc.collect()
    assert type(region) is ObservedCpuRegion  # the other sink still traces
    with region:
        pass
    kept.close()  # the drain after the collection feeds only the live sink
    assert len(spans(load(tmp_path / "kept.json"))) == 2
    assert len(spans(load(tmp_path / "t.json"))) == 1  # valid JSON as last written
    assert type(region) is CpuRegion
    dropped = ChromeTrace(tmp_path / "dropped.json")
    assert type(region) is ObservedCpuRegion
    del dropped
    gc.collect()
    assert type(region) is CpuRegion
    assert observe.trace is None


@pytest.mark.timeout(60)
def test_a_trace_sink_collected_inside_a_locked_region_section_never_deadlocks(
    tmp_path: Path,
) -> None:
    region = instrument.timed("x", clock="cpu")
    sink = ChromeTrace(tmp_path / "t.json")
    with region_module.lock:  # as if the collection ran while this thread created a region
        del sink
        gc.collect()
    deadline = time.monotonic() + 30
    while type(region) is not CpuRegion and time.monotonic() < deadline:
        time.sleep(0.01)
    assert type(region) is CpuRegion


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_the_parents_trace_alone(tmp_path: Path) -> None:
    region = instrument.timed("x", clock="cpu")
    sink = ChromeTrace(tmp_path / "t.json")
    with region:
        pass
    sink.write(instrument.Report())
    pid = os.fork()
    if pid == 0:  # the child: fast regions, the parent's file untouched by its close
        code = 0 if type(region) is CpuRegion and observe.trace is None else 3
        with region:
            pass
        sink.close()
        os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with region:
        pass
    sink.close()
    assert len(spans(load(tmp_path / "t.json"))) == 2


def test_decorated_functions_timers_and_exceptions_are_traced(tmp_path: Path) -> None:
    sink = ChromeTrace(tmp_path / "t.json")

    @instrument.timed("f")
    def f() -> int:
        return 1

    assert f() == 1
    manual = instrument.Timer("manual")
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


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(60)
def test_each_rank_writes_its_own_file(tmp_path: Path) -> None:
    run_ranks(_rank_traces, 2, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.rank0.json", "trace.rank1.json"]
    for rank in (0, 1):
        document = load(tmp_path / f"trace.rank{rank}.json")
        assert [(e["name"], e["pid"]) for e in spans(document)] == [(f"work_on_rank_{rank}", rank)]


# -- incremental writes ---------------------------------------------------------------------


def check_format(document: dict[str, Any]) -> None:
    """The Trace Event Format's rules for what we write: metadata ("M") events name a
    process or thread; complete ("X") events have a name, numeric pid/tid and ts/dur >= 0
    in microseconds, and on one thread they nest (a later event starts after an earlier
    one ended, or ends inside it)."""
    assert isinstance(document["traceEvents"], list)
    assert document["displayTimeUnit"] in ("ms", "ns")
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in document["traceEvents"]:
        assert isinstance(event["pid"], int)
        assert isinstance(event["tid"], int)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "thread_name")
            assert isinstance(event["args"], dict)
            continue
        assert event["ph"] == "X"
        assert isinstance(event["name"], str)
        assert event["name"]
        assert event["dur"] >= 0
        assert event["ts"] > 0
        by_thread.setdefault((event["pid"], event["tid"]), []).append(
            (event["ts"], event["ts"] + event["dur"])
        )
    for spans_ in by_thread.values():
        open_: list[float] = []
        for start, end in sorted(spans_, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1] <= start + 1e-3:
                open_.pop()
            assert not open_ or end <= open_[-1] + 1e-3, "overlapping events on one thread"
            open_.append(end)


def test_each_write_appends_only_the_new_events_and_the_file_stays_json(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = ChromeTrace(tmp_path / "t.json", max_events=100_000)
    formatted: list[int] = []
    original = ChromeTrace._format

    def counting(self: ChromeTrace, final: bool) -> list[str]:
        lines = original(self, final)
        formatted.append(sum('"ph":"X"' in line for line in lines))
        return lines

    monkeypatch.setattr(ChromeTrace, "_format", counting)
    reporter = instrument.Reporter(every=None, sinks=[sink])
    for _ in range(20_000):
        with instrument.timed("busy"):
            clock.advance(1e-6)
    reporter.flush()
    size = (tmp_path / "t.json").stat().st_size
    reporter.flush()  # no region since: only the first flush's own event is new
    added = (tmp_path / "t.json").stat().st_size - size
    assert 0 < added < 250  # one event, nothing rewritten
    for name in ("a", "b", "c"):
        with instrument.timed(name):
            clock.advance(0.001)
    reporter.flush()
    assert formatted == [20_000, 1, 4]  # each write: what ran since, the flush before it too
    document = load(tmp_path / "t.json")
    check_format(document)
    assert [e["name"] for e in spans(document)][-4:] == ["busy", "a", "b", "c"]
    assert len(spans(document)) == 20_003
    assert len(flushes(document)) == 2
    assert sink.events_written == 20_005
    reporter.close()
    assert len(spans(load(tmp_path / "t.json"))) == 20_003


def test_two_sinks_each_get_every_event(tmp_path: Path, clock: FakeClock) -> None:
    first, second = ChromeTrace(tmp_path / "1.json"), ChromeTrace(tmp_path / "2.json")
    reporter = instrument.Reporter(every=None, sinks=[first])
    with instrument.timed("x"):
        clock.advance(0.001)
    reporter.flush()  # the first sink writes; the second keeps its events for later
    with instrument.timed("y"):
        clock.advance(0.001)
    first.close()
    second.close()
    assert [e["name"] for e in spans(load(tmp_path / "1.json"))] == ["x", "y"]
    assert [e["name"] for e in spans(load(tmp_path / "2.json"))] == ["x", "y"]


# -- device tracks --------------------------------------------------------------------------


class FakeDevice:
    """A device clock (ns) that the test moves, and the events it timestamps."""

    def __init__(self) -> None:
        self.now = 5_000_000
        self.busy_from: int | None = None  # events recorded from then on have not completed


class FakeEvent:
    """What the trace uses of ``torch.cuda.Event``: record, query, synchronize,
    elapsed_time (ms)."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: int | None = None

    def record(self) -> None:
        self.at = self.device.now

    def query(self) -> bool:
        assert self.at is not None
        return self.device.busy_from is None or self.at < self.device.busy_from

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None
        assert end.at is not None
        return (end.at - self.at) / 1e6


def gpu_region(name: str, clock: FakeClock, device: FakeDevice, host_s: float, gpu_ns: int,
               lag_ns: int) -> None:  # fmt: skip
    """What a "cuda"-clock region does while traced: open (its frame holds a start event),
    run ``host_s`` on the host while the device, ``lag_ns`` behind, runs ``gpu_ns``."""
    from instrument import registry

    node = registry.ROOT.child(name, 0, "cuda")
    region = instrument.timed(name, clock="cpu")
    device.now += lag_ns
    frame = Frame(node, clock.now_ns(), None, region, object())
    observe.entered(region, frame)
    clock.advance(host_s)
    device.now += gpu_ns
    observe.exited(frame, clock.now_ns())


def test_cuda_regions_get_a_device_track_placed_by_the_reference_event(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = FakeDevice()
    monkeypatch.setattr(observe, "device_event", lambda: _recorded(FakeEvent(device)))
    monkeypatch.setattr(observe, "current_stream", lambda: (0, 7))
    sink = ChromeTrace(tmp_path / "t.json")
    reference = _recorded(FakeEvent(device))  # the device reached it at host time 1 s
    sink.anchor(0, reference, host_ns=clock.now_ns())
    gpu_region("matmul", clock, device, host_s=0.0001, gpu_ns=3_000_000, lag_ns=2_000_000)
    device.busy_from = device.now + 1  # the next one has not run on the device at the write
    gpu_region("late", clock, device, host_s=0.0001, gpu_ns=1_000_000, lag_ns=0)
    sink.write(instrument.Report())
    document = load(tmp_path / "t.json")
    check_format(document)
    host = {e["name"]: e for e in spans(document) if e["tid"] < trace.DEVICE_TID}
    gpu = {e["name"]: e for e in spans(document) if e["tid"] >= trace.DEVICE_TID}
    assert set(host) == {"matmul", "late"}
    assert set(gpu) == {"matmul"}  # "late" waits: no synchronization before it completed
    matmul = gpu["matmul"]
    assert matmul["dur"] == pytest.approx(3000.0)  # µs of device time, not the host's 100
    assert matmul["ts"] - host["matmul"]["ts"] == pytest.approx(2000.0)  # 2 ms behind
    assert matmul["args"] == {"path": "matmul", "clock": "device"}
    names = {e["tid"]: e["args"]["name"] for e in document["traceEvents"]
             if e["name"] == "thread_name"}  # fmt: skip
    assert names[matmul["tid"]] == "cuda:0 stream 7"
    device.busy_from = None
    sink.close()
    gpu = {e["name"]: e for e in spans(load(tmp_path / "t.json")) if e["tid"] >= trace.DEVICE_TID}
    assert set(gpu) == {"matmul", "late"}
    assert gpu["late"]["dur"] == pytest.approx(1000.0)


def _recorded(event: FakeEvent) -> FakeEvent:
    event.record()
    return event


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_cuda_region_has_a_device_track(tmp_path: Path) -> None:
    torch.cuda.init()
    x = torch.randn(2048, 2048, device="cuda")
    sink = ChromeTrace(tmp_path / "t.json")
    reporter = instrument.Reporter(every=None, sinks=[sink])
    stream = torch.cuda.Stream()
    for _ in range(3):
        with instrument.timed("matmul", clock="cuda"):
            x @ x
        with torch.cuda.stream(stream), instrument.timed("side", clock="cuda"):
            x + x
    reporter.flush()
    reporter.close()
    document = load(tmp_path / "t.json")
    check_format(document)
    gpu = [e for e in spans(document) if e["tid"] >= trace.DEVICE_TID]
    assert sorted({e["name"] for e in gpu}) == ["matmul", "side"]
    assert len({e["tid"] for e in gpu}) == 2  # one track per stream
    host = {(e["name"], round(e["ts"])): e for e in spans(document) if e["tid"] < trace.DEVICE_TID}
    first_matmul = min(e["ts"] for e in gpu if e["name"] == "matmul")
    first_host = min(ts for (name, ts) in host if name == "matmul")
    assert first_matmul >= first_host - 50  # the device starts after the launch (µs)
    assert all(e["dur"] > 0 for e in gpu)
