"""Clocks: selection, fallbacks, injection; CUDA behaviour on a GPU (marked ``cuda``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import instrument
from instrument import _state, clocks
from instrument.testing import FakeClock, use_clock

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_auto_is_cpu_without_cuda_initialised() -> None:
    if clocks.cuda_ready():
        pytest.skip("CUDA is initialised in this process")
    instrument.configure(clock="auto")
    assert _state.mode == "cpu"
    assert type(instrument.timed("x")).__name__ == "CpuRegion"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
@pytest.mark.parametrize("name", ["cuda", "sync"])
def test_explicit_device_clock_without_cuda_warns_once_and_uses_cpu(
    name: str, reporter: instrument.Reporter
) -> None:
    with pytest.warns(RuntimeWarning, match=f"clock='{name}' asked for but CUDA is not available"):
        instrument.configure(clock=name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        instrument.configure(clock=name)  # once only
        with instrument.timed("x"), instrument.timed("y", clock=name):
            pass
    report = reporter.flush()
    assert report["x"].clock == "cpu"
    assert report["x"].device is None


def test_injected_clock_drives_regions_and_steps(reporter: instrument.Reporter) -> None:
    clock = FakeClock(100.0)
    with use_clock(clock):
        with instrument.timed("x"):
            clock.advance(0.5)
        reporter.step()
    report = reporter.flush()
    assert report["x"].total == 0.5
    assert _state.now is not clock.now_ns  # restored


def test_fake_clock_cannot_go_backwards() -> None:
    with pytest.raises(ValueError, match="cannot go backwards"):
        FakeClock().advance(-1)


@pytest.mark.cuda
@needs_cuda
def test_cuda_clock_never_synchronizes_in_the_hot_path(reporter: instrument.Reporter) -> None:
    torch.cuda.init()
    x = torch.randn(1024, 1024, device="cuda")
    instrument.configure(clock="cuda")
    with instrument.timed("warmup"):
        x @ x
    reporter.flush()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            with instrument.timed("step"):
                with instrument.timed("matmul"):
                    y = x @ x
                with instrument.timed("add"):
                    y = y + 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    report = reporter.flush()
    node = report["step/matmul"]
    assert node.clock == "cuda"
    assert node.device is not None
    assert node.device.count == 20
    assert node.host.count == 20
    assert node.total == node.device.total


@pytest.mark.cuda
@needs_cuda
def test_cuda_times_match_hand_made_events(reporter: instrument.Reporter) -> None:
    torch.cuda.init()
    x = torch.randn(4096, 4096, device="cuda")
    x @ x
    torch.cuda.synchronize()
    instrument.configure(clock="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reporter.flush()
    start.record()
    with instrument.timed("mm"):
        for _ in range(10):
            x @ x
    end.record()
    end.synchronize()
    reference = start.elapsed_time(end) / 1e3
    measured = reporter.flush()["mm"].total
    assert measured == pytest.approx(reference, rel=0.05)


@pytest.mark.cuda
@needs_cuda
def test_sync_clock_waits_for_the_device(reporter: instrument.Reporter) -> None:
    torch.cuda.init()
    x = torch.randn(4096, 4096, device="cuda")
    with instrument.timed("sync", clock="sync"):
        for _ in range(10):
            x @ x
    with instrument.timed("host", clock="cpu"):
        for _ in range(10):
            x @ x
    torch.cuda.synchronize()
    report = reporter.flush()
    assert report["sync"].clock == "sync"
    assert report["sync"].total > report["host"].total


@pytest.mark.cuda
@needs_cuda
def test_auto_picks_cuda_once_initialised(reporter: instrument.Reporter) -> None:
    torch.cuda.init()
    instrument.configure(clock="auto")
    assert _state.mode == "cuda"
    with instrument.timed("x"):
        torch.ones(10, device="cuda").sum()
    assert reporter.flush()["x"].device is not None
