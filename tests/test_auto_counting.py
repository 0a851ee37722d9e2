"""Counting and undo under auto(), and the one-time warnings that say what is not measured."""

from __future__ import annotations

import warnings

import pytest
import torch
from fake_cuda import fake_cuda
from torch import nn

import instrument
from instrument import registry
from instrument.sinks import InMemory
from instrument.testing import FakeClock


def parts() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def one_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_instrument_step_under_auto_counts_without_a_second_tick(clock: FakeClock) -> None:
    model, opt = parts()
    sink = InMemory()

    def train() -> None:
        for _ in range(5):
            one_step(model, opt)
            clock.advance(0.1)
            instrument.step(samples=2, tokens=16)

    with (
        instrument.auto(model, opt, every=5, sinks=[sink], collectives=False),
        pytest.warns(RuntimeWarning, match=r"not ended twice.*instrument\.count"),
    ):
        train()
    report = sink.reports[0]
    assert report.steps == 5  # not 10
    assert report["forward"].count == 5
    rates = report.throughput
    assert rates is not None
    assert rates.samples == 2 * rates.steps
    assert rates.tokens == 16 * rates.steps


def test_instrument_step_ticks_again_once_auto_is_removed() -> None:
    model, opt = parts()
    handle = instrument.auto(model, opt, every=None, sinks=[], collectives=False)
    handle.remove()
    with instrument.Reporter(every=None) as reporter:
        instrument.step()
        assert reporter.steps == 1


def test_remove_leaves_nothing_in_the_registry() -> None:
    model, opt = parts()
    sink = InMemory()
    with instrument.auto(model, opt, every=2, sinks=[sink], collectives=False):
        for _ in range(2):
            one_step(model, opt)  # its zero_grad comes after the step that flushed
    assert len(sink.reports) == 1
    assert not any(node.has_records() for node in registry.walk())
    with instrument.Reporter(every=None) as reporter:
        assert reporter.flush().paths() == ()


def test_auto_on_a_submodule_of_an_instrumented_model_is_refused() -> None:
    model, opt = parts()
    with (
        instrument.auto(model, opt, sinks=[], collectives=False),
        pytest.raises(RuntimeError, match=r"part of a model.*\(its region is '0'\)"),
    ):
        instrument.auto(model[0])
    inner = nn.Sequential(nn.Linear(2, 2))
    outer = nn.Sequential(inner)
    with (
        instrument.auto(inner, sinks=[], collectives=False),
        pytest.raises(RuntimeError, match=r"its submodule '0' is already timed"),
    ):
        instrument.auto(outer)


def test_script_module_is_refused_and_a_scripted_child_is_part_of_its_parent() -> None:
    with pytest.raises(TypeError, match=r"cannot hook a TorchScript module"):
        instrument.auto(torch.jit.script(nn.Linear(2, 2)))
    model = nn.Sequential(nn.Linear(2, 2), torch.jit.script(nn.Linear(2, 2)))
    with instrument.auto(model, every=None, sinks=[], collectives=False) as handle:
        model(torch.randn(1, 2))
        report = handle.reporter.flush()
    assert set(report.paths()) == {"forward", "forward/0"}


# -- the one-time warnings -----------------------------------------------------------------


def test_flops_auto_never_measured_is_warned_once() -> None:
    with instrument.Reporter(every=None, flops_per_step="auto") as reporter:
        for _ in range(3):
            instrument.step()
        with pytest.warns(RuntimeWarning, match=r"no FLOPs were measured.*measure_flops"):
            reporter.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            instrument.step()
            reporter.flush()  # once only


def test_no_known_peak_is_quiet_on_a_cpu_and_names_peak_flops_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = {"every": None, "flops_per_step": 1e9, "sinks": [], "memory": False, "warmup": 0}
    with instrument.Reporter(**options) as reporter, warnings.catch_warnings():
        warnings.simplefilter("error")
        instrument.step()
        instrument.step()
        rates = reporter.flush().throughput
    assert rates is not None
    assert rates.tflops is not None
    assert rates.mfu is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Unlisted GPU 9")
    with fake_cuda(), instrument.Reporter(**options) as reporter:
        instrument.step()
        with pytest.warns(RuntimeWarning, match=r"no MFU.*Unlisted GPU 9.*Reporter\(peak_flops="):
            reporter.flush()
    with (
        instrument.Reporter(**options, peak_flops=1e12) as reporter,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        instrument.step()
        instrument.step()
        rates = reporter.flush().throughput
    assert rates is not None
    assert rates.mfu is not None


def test_loader_already_iterated_is_warned() -> None:
    combined_loader = pytest.importorskip("lightning.pytorch.utilities.combined_loader")
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    loader = combined_loader.CombinedLoader(torch.utils.data.DataLoader(data, batch_size=2))
    iter(loader)  # as Lightning's fit loop does before callbacks see the loader
    model, opt = parts()
    with pytest.warns(RuntimeWarning, match=r"already being iterated.*instrument\.data"):
        handle = instrument.auto(model, opt, sinks=[], dataloader=loader, collectives=False)
    handle.remove()
