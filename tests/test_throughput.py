"""Throughput and memory in the same interval as the timers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import instrument
from instrument import throughput
from instrument.sinks import InMemory
from instrument.testing import FakeClock


def run_steps(clock: FakeClock, n: int, seconds: float = 0.5, **counts: int) -> None:
    for _ in range(n):
        clock.advance(seconds)
        instrument.step(**counts)


def test_known_counts_and_times_give_known_rates(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=4, sinks=[sink], warmup=0)
    run_steps(clock, 4, samples=32, tokens=4096)
    rates = sink.last.throughput
    assert rates is not None
    assert (rates.steps, rates.seconds, rates.samples, rates.tokens) == (4, 2.0, 128, 16384)
    assert rates.steps_per_sec == pytest.approx(2.0)
    assert rates.samples_per_sec == pytest.approx(64.0)
    assert rates.tokens_per_sec == pytest.approx(8192.0)
    assert rates.tflops is None
    assert rates.mfu is None
    assert reporter.steps == 0


def test_warmup_steps_are_skipped_at_the_start_of_the_run_only(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=4, sinks=[sink])  # default warm-up: 2 steps
    assert reporter.warmup == 2
    clock.advance(5.0)  # a slow first step (compilation, say)
    instrument.step(samples=10)
    run_steps(clock, 3, samples=10)
    run_steps(clock, 4, samples=10)
    first, second = (r.throughput for r in sink.reports)
    assert first is not None
    assert second is not None
    assert (first.warmup_steps, first.steps, first.samples) == (2, 2, 20)
    assert first.samples_per_sec == pytest.approx(20.0)
    assert (second.warmup_steps, second.steps) == (0, 4)
    # the timers still see every step
    assert sink.reports[0].step_time is not None
    assert sink.reports[0].step_time.count == 4


def test_warmup_longer_than_an_interval(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[sink], warmup=3)  # held: ticked weakly
    run_steps(clock, 4, samples=1)
    assert reporter.steps == 0
    first, second = (r.throughput for r in sink.reports)
    assert first is not None
    assert first.steps == 0
    assert first.samples_per_sec is None
    assert second is not None
    assert (second.warmup_steps, second.steps) == (1, 1)


def test_default_warmup_keeps_rates_in_the_first_report() -> None:
    assert instrument.Reporter(every=1).warmup == 0
    assert instrument.Reporter(every=2).warmup == 1
    assert instrument.Reporter(every=None).warmup == 2


def test_count_adds_to_the_open_step(clock: FakeClock) -> None:
    sink = InMemory()
    reporter = instrument.Reporter(every=None, sinks=[sink], warmup=0)
    for _ in range(4):  # gradient accumulation: four micro-batches, one step
        instrument.count(samples=8, tokens=100)
    clock.advance(1.0)
    reporter.step(tokens=1)
    rates = reporter.flush().throughput
    assert rates is not None
    assert (rates.samples, rates.tokens) == (32, 401)


def test_flops_and_peak_give_tflops_and_mfu(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, warmup=0, flops_per_step=3e12, peak_flops=10e12)
    run_steps(clock, 4, seconds=0.5)
    rates = reporter.flush().throughput
    assert rates is not None
    assert rates.tflops == pytest.approx(6.0)  # 3 TFLOP per 0.5 s
    assert rates.peak_tflops == pytest.approx(10.0)
    assert rates.mfu == pytest.approx(0.6)


def test_flop_count_of_a_matmul_is_2mnk() -> None:
    m, n, k = 16, 32, 64
    layer = nn.Linear(k, n, bias=False)
    x = torch.randn(m, k)
    with throughput.count_flops() as flops:
        layer(x)
    assert flops == [2 * m * n * k]


def test_auto_measures_flops_per_step_once() -> None:
    m, n, k = 16, 32, 64
    model = nn.Linear(k, n, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(m, k)
    with instrument.auto(model, opt, every=None, sinks=[], flops_per_step="auto") as handle:
        assert handle.reporter.flops_per_step == "auto"
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
        # forward 2mnk + the weight gradient 2mnk (the input needs no gradient)
        assert handle.reporter.flops_per_step == 4 * m * n * k
        report = handle.reporter.flush()
    assert report.throughput is not None
    assert report.throughput.flops_per_step == 4 * m * n * k
    assert report.throughput.tflops is not None
    assert report.throughput.tflops > 0


def test_measure_flops_on_a_manual_reporter() -> None:
    reporter = instrument.Reporter(every=None, flops_per_step="auto")
    layer = nn.Linear(8, 4, bias=False)
    with reporter.measure_flops():
        layer(torch.randn(2, 8))
    assert reporter.flops_per_step == 2 * 2 * 4 * 8


def test_report_carries_throughput_and_memory_everywhere(clock: FakeClock) -> None:
    reporter = instrument.Reporter(every=None, warmup=0, flops_per_step=1e9)
    with instrument.timed("forward"):
        clock.advance(0.25)
    instrument.step(samples=4)
    report = reporter.flush()
    assert report.memory["host_rss"] > 1_000_000
    assert report.memory["host_peak_rss"] >= report.memory["host_rss"] // 2
    text = report.render()
    assert "throughput: 4 steps/s · 16 samples/s · 0.004 TFLOP/s" in text
    assert "memory: host rss" in text
    again = instrument.Report.from_dict(report.to_dict())
    assert again == report
    assert again.throughput == report.throughput
    assert again.memory == report.memory


def test_memory_can_be_turned_off() -> None:
    assert instrument.Reporter(every=None, memory=False).flush().memory == {}


def test_bad_throughput_options_name_the_problem() -> None:
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        instrument.Reporter(warmup=-1)
    with pytest.raises(ValueError, match="flops_per_step must be a number > 0"):
        instrument.Reporter(flops_per_step=0)
    with pytest.raises(ValueError, match="flops_per_step must be a number > 0"):
        instrument.Reporter(flops_per_step="measure")
    with pytest.raises(ValueError, match="unknown peak_dtype 'int8'"):
        instrument.Reporter(peak_dtype="int8")
    with pytest.raises(ValueError, match="samples must be an int >= 0"):
        instrument.Reporter(every=None).step(samples=-1)
    with pytest.raises(ValueError, match="tokens must be an int >= 0"):
        instrument.Reporter(every=None).step(tokens=1.5)  # type: ignore[arg-type]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_run_reports_mfu_and_device_memory() -> None:
    from instrument.peak_flops import device_peak_flops

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096, bias=False), nn.Linear(4096, 4096, bias=False))
    model = model.to("cuda", torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with instrument.auto(model, opt, every=None, sinks=[], flops_per_step="auto") as handle:
        for _ in range(8):
            model(x).float().sum().backward()
            opt.step()
            opt.zero_grad()
        report = handle.reporter.flush()
    rates = report.throughput
    assert rates is not None
    # two forward matmuls + two weight gradients + one input gradient (layer 2's input)
    assert rates.flops_per_step == 5 * 2 * 4096**3
    peak = device_peak_flops("bf16")
    if peak is None:
        assert rates.mfu is None  # a GPU missing from the table: unknown, not made up
    else:
        assert rates.peak_tflops == pytest.approx(peak / 1e12)
        assert rates.mfu is not None
        assert 0.0 < rates.mfu < 1.0
    memory = report.memory
    assert memory["device_peak_allocated"] >= 3 * 4096 * 4096 * 2  # x and both weights
    assert memory["device_reserved"] >= memory["device_allocated"] > 0
    assert "MFU" in report.render() or peak is None
