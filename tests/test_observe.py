"""Regions seen by other tools: torch.profiler ranges, NVTX ranges, and the flush at exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import instrument
from instrument import observe
from instrument.regions.region import CpuRegion, ObservedCpuRegion


def profiled_names(prof: torch.profiler.profile) -> list[str]:
    return [event.name for event in prof.events() if event.name.startswith("r_")]


def test_regions_appear_in_a_running_torch_profiler() -> None:
    @instrument.timed("r_decorated")
    def decorated() -> torch.Tensor:
        return torch.ones(2) * 2

    cpu_only = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu_only) as prof, instrument.timed("r_outer"):
        with instrument.timed("r_inner"):
            torch.ones(3).sum()
        decorated()
    assert sorted(profiled_names(prof)) == ["r_decorated", "r_inner", "r_outer"]
    outer = next(e for e in prof.events() if e.name == "r_outer")
    inner = next(e for e in prof.events() if e.name == "r_inner")
    assert outer.time_range.start <= inner.time_range.start
    assert inner.time_range.end <= outer.time_range.end


def test_no_profiler_no_cost_and_the_old_profiler_api_works_too() -> None:
    region = instrument.timed("r_x", clock="cpu")  # "auto" is CUDA once CUDA is up
    assert type(region) is CpuRegion
    assert not observe.profiling
    with torch.autograd.profiler.profile() as prof:
        assert observe.profiling
        assert type(region) is ObservedCpuRegion
        with region:
            pass
    assert not observe.profiling
    assert type(region) is CpuRegion
    assert [e.name for e in prof.function_events if e.name.startswith("r_")] == ["r_x"]


def test_a_region_open_across_the_profiler_start_still_records(
    reporter: instrument.Reporter,
) -> None:
    with instrument.timed("r_around"):  # noqa: SIM117 - open before the profiler starts
        with torch.profiler.profile() as prof, instrument.timed("r_in"):
            pass
    assert profiled_names(prof) == ["r_in"]
    assert set(reporter.flush().paths()) == {"r_around", "r_around/r_in"}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def push(self, name: str) -> None:
        self.calls.append(f"push {name}")

    def pop(self) -> None:
        self.calls.append("pop")


@pytest.fixture
def nvtx(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """torch.cuda.nvtx as a CUDA build has it, recording its calls (no Nsight here)."""
    recorder = Recorder()
    monkeypatch.setattr(observe, "nvtx_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", recorder.push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", recorder.pop)
    return recorder


def test_configure_nvtx_pushes_a_range_per_region(nvtx: Recorder) -> None:
    instrument.configure(nvtx=True)
    with instrument.timed("step"):
        with instrument.timed("forward"):
            pass
        with pytest.raises(ValueError), instrument.timed("fails"):
            raise ValueError
    assert nvtx.calls == ["push step", "push forward", "pop", "push fails", "pop", "pop"]
    instrument.configure(nvtx=False)
    with instrument.timed("step"):
        pass
    assert len(nvtx.calls) == 6


def test_nvtx_for_one_region(nvtx: Recorder) -> None:
    with instrument.timed("a", nvtx=True), instrument.timed("b"):
        pass
    with instrument.timed("a"):  # the name keeps its NVTX range
        pass
    assert nvtx.calls == ["push a", "pop", "push a", "pop"]
    assert type(instrument.timed("b", clock="cpu")) is CpuRegion


def test_nvtx_without_a_cuda_build_warns_once_and_does_nothing() -> None:
    if observe.nvtx_available():
        pytest.skip("this torch has NVTX")
    with pytest.warns(RuntimeWarning, match="NVTX ranges need a CUDA build"):
        instrument.configure(nvtx=True)
    with instrument.timed("a", nvtx=True):
        pass
    assert type(instrument.timed("a")) is CpuRegion
    with pytest.raises(ValueError, match="nvtx must be True or False"):
        instrument.configure(nvtx="yes")  # type: ignore[arg-type]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_nvtx_ranges_on_cuda(reporter: instrument.Reporter) -> None:
    torch.ones(1, device="cuda")
    instrument.configure(nvtx=True)
    with instrument.timed("step"), instrument.timed("matmul"):
        x = torch.randn(256, 256, device="cuda")
        x @ x
    instrument.configure(nvtx=False)
    assert observe.open_ranges == {}
    assert set(reporter.flush().paths()) == {"step", "step/matmul"}


def test_live_reporters_flush_and_close_their_sinks_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import instrument
        from instrument.sinks import ChromeTrace
        reporter = instrument.Reporter(every=1000, sinks=[
            instrument.sinks.Console(),
            ChromeTrace({str(tmp_path / "trace.json")!r}),
        ])
        for _ in range(3):
            with instrument.timed("left_over"):
                pass
            instrument.step()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "left_over" in done.stdout
    assert "3 steps" in done.stdout
    assert (tmp_path / "trace.json").read_text().count('"name":"left_over"') == 3
