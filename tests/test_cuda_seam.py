"""The CUDA paths — event pool, pending-event resolution at flush, the "sync" clock and the
"auto" clock's refresh — driven through their real code by a fake device (tests/fake_cuda.py),
so they are tested on every machine. The same paths on a real GPU: test_clocks.py and
test_auto_cuda.py (marked ``cuda``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fake_cuda import FakeCuda, fake_cuda

import instrument
from instrument import clocks, config, registry
from instrument.regions.span import Span
from instrument.registry import ROOT
from instrument.testing import FakeClock


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake host clock behind the named clocks ("cuda", "sync", "auto")."""
    fake = FakeClock()
    fake_time = SimpleNamespace(perf_counter_ns=fake.now_ns, time=time.time)
    monkeypatch.setattr(config, "time", fake_time)
    monkeypatch.setattr(clocks, "time", fake_time)
    return fake


@pytest.fixture
def gpu() -> Iterator[FakeCuda]:
    with fake_cuda() as fake:
        yield fake
    instrument.configure(clock="auto")


def _run(host: FakeClock, gpu: FakeCuda, *, host_s: float, gpu_s: float, name: str = "fwd") -> None:
    with instrument.timed(name):
        host.advance(host_s)
        gpu.gpu.advance(gpu_s)


def test_cuda_regions_resolve_device_time_at_flush_from_a_reused_pool(
    host: FakeClock, gpu: FakeCuda
) -> None:
    instrument.configure(clock="cuda")
    reporter = instrument.Reporter(every=None, memory=False)
    for interval in range(3):
        for _ in range(2):
            _run(host, gpu, host_s=0.001, gpu_s=0.004)
        assert gpu.event_waits == 2 * interval  # recording never waits; only flushes do
        report = reporter.flush()
        fwd = report["fwd"]
        assert fwd.clock == "cuda"
        assert fwd.device is not None
        assert (fwd.count, fwd.total, fwd.device.total, fwd.host.total) == (
            2,
            pytest.approx(0.008),
            pytest.approx(0.008),
            pytest.approx(0.002),
        )
    assert gpu.records == 12
    assert gpu.created == 4  # two pairs in flight per interval, then reused from the pool
    assert gpu.device_syncs == 0  # the "cuda" clock never synchronizes the device
    assert sorted(clocks.events._free) == [0]
    assert len(clocks.events._free[0]) == 4
    reporter.close()


def test_events_go_back_to_the_pool_of_their_device(host: FakeClock, gpu: FakeCuda) -> None:
    instrument.configure(clock="cuda")
    reporter = instrument.Reporter(every=None, memory=False)
    _run(host, gpu, host_s=0.001, gpu_s=0.002)
    gpu.device = 1
    _run(host, gpu, host_s=0.001, gpu_s=0.003)
    assert reporter.flush()["fwd"].device.total == pytest.approx(0.005)  # type: ignore[union-attr]
    assert {d: len(evs) for d, evs in clocks.events._free.items()} == {0: 2, 1: 2}
    reporter.close()


def test_a_device_record_appended_after_a_flush_swapped_the_list_lands_next(
    host: FakeClock, gpu: FakeCuda
) -> None:
    """A thread that loaded ``registry.pending`` before a flush swapped it appends to the old
    list: the next flush still resolves that pair (late records land, never nowhere)."""
    instrument.configure(clock="cuda")
    reporter = instrument.Reporter(every=None, memory=False)
    _run(host, gpu, host_s=0.001, gpu_s=0.002)
    stale = registry.pending  # what the exiting region holds when the flush swaps it
    first = reporter.flush()
    start = clocks.record_event()
    gpu.gpu.advance(0.007)
    node = ROOT.children["fwd"]
    node.add(1_000_000)
    stale.append((node, start, clocks.record_event(), 0))
    second = reporter.flush()
    assert first["fwd"].device.total == pytest.approx(0.002)  # type: ignore[union-attr]
    assert second["fwd"].device.total == pytest.approx(0.007)  # type: ignore[union-attr]
    assert reporter.flush().get("fwd") is None  # resolved once, not again
    reporter.close()


def test_sync_clock_synchronizes_at_both_ends(host: FakeClock, gpu: FakeCuda) -> None:
    instrument.configure(clock="sync")
    reporter = instrument.Reporter(every=None, memory=False)
    _run(host, gpu, host_s=0.003, gpu_s=0.009, name="synced")
    assert gpu.device_syncs == 2
    assert gpu.records == 0
    fwd = reporter.flush()["synced"]
    assert (fwd.clock, fwd.device, fwd.total) == ("sync", None, pytest.approx(0.003))
    reporter.close()


def test_auto_clock_turns_to_cuda_at_the_flush_after_cuda_initialises(
    host: FakeClock, gpu: FakeCuda
) -> None:
    gpu.initialized = False
    instrument.configure(clock="auto")
    reporter = instrument.Reporter(every=None, memory=False)
    _run(host, gpu, host_s=0.001, gpu_s=0.004, name="auto")
    gpu.initialized = True  # e.g. the model moved to the GPU
    # still host: "auto" is resolved once, not per call
    _run(host, gpu, host_s=0.001, gpu_s=0.004, name="auto")
    first = reporter.flush()  # the flush re-resolves "auto"
    assert (first["auto"].clock, first["auto"].device, gpu.records) == ("cpu", None, 0)
    _run(host, gpu, host_s=0.001, gpu_s=0.004, name="auto")
    second = reporter.flush()
    assert second["auto"].clock == "cuda"
    assert second["auto"].total == pytest.approx(0.004)
    assert second["auto"].host.total == pytest.approx(0.001)
    reporter.close()


def test_open_cuda_region_is_split_at_the_flush_on_host_time(
    host: FakeClock, gpu: FakeCuda
) -> None:
    instrument.configure(clock="cuda")
    reporter = instrument.Reporter(every=None, memory=False)
    with instrument.timed("epoch"):
        _run(host, gpu, host_s=0.001, gpu_s=0.001)
        host.advance(0.001)
        first = reporter.flush()
        host.advance(0.002)
        gpu.gpu.advance(0.005)
    second = reporter.flush()
    assert (first["epoch"].open, first["epoch"].total) == (True, pytest.approx(0.002))
    epoch = second["epoch"]
    assert epoch.device is not None
    assert (epoch.count, epoch.device.max) == (1, pytest.approx(0.006))
    assert epoch.device.total == pytest.approx(0.006 - 0.002)  # minus what was reported


def test_concurrent_time_is_in_device_time_when_the_spans_have_it(
    host: FakeClock, gpu: FakeCuda
) -> None:
    """The spans' union is taken on the host clock, then scaled by their device / host
    totals: the same units as the parent's (device) total."""
    instrument.configure(clock="cuda")
    reporter = instrument.Reporter(every=None, memory=False)
    with instrument.timed("backward"):
        first = Span("ddp_all_reduce")
        host.advance(1.0)
        gpu.gpu.advance(0.5)
        second = Span("ddp_all_reduce")
        host.advance(1.0)
        gpu.gpu.advance(0.5)
        first.end()  # host 0..2
        host.advance(1.0)
        gpu.gpu.advance(0.5)
        second.end()  # host 1..3: 3 s covered, 4 s summed, on the host
        host.advance(1.0)
        gpu.gpu.advance(0.5)
    report = reporter.flush()
    backward = report["backward"]
    assert backward.clock == "cuda"
    assert (backward.total, backward.host.total) == (pytest.approx(2.0), pytest.approx(4.0))
    assert report["backward/ddp_all_reduce"].total == pytest.approx(2.0)  # device: half
    assert backward.concurrent_time == pytest.approx(1.5)  # 3 s of host time, at 2.0 / 4.0
    reporter.close()
