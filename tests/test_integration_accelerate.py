"""Accelerate: auto() on what accelerator.prepare(...) returns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

accelerate = pytest.importorskip("accelerate")

import instrument  # noqa: E402
from instrument.hooks import optim as optim_hooks  # noqa: E402
from instrument.sinks import InMemory  # noqa: E402

N_BATCHES = 8


@pytest.fixture(autouse=True)
def _fresh_accelerator_state() -> None:
    """Accelerate keeps its state in process-wide singletons (``AcceleratorState``,
    ``GradientState``): a transformers ``Trainer(torch_compile=True)`` run earlier in the
    process left its dynamo plugin there, and the next ``Accelerator()`` compiled the model
    it prepared (one compiled ``forward``, no module regions below it). Start each test from
    a fresh state, as Accelerate's own tests do."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def parts() -> tuple[nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader[object]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = torch.utils.data.TensorDataset(
        torch.randn(4 * N_BATCHES, 4), torch.randn(4 * N_BATCHES, 1)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), loader


def test_prepared_objects_with_accumulation_give_one_interval_per_optimizer_step() -> None:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt, loader = parts()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    assert type(opt).__name__ == "AcceleratedOptimizer"
    assert type(loader).__name__ == "DataLoaderShard"
    assert loader.__class__ is torch.utils.data.DataLoader  # Accelerate's disguise
    sink = InMemory()
    handle = instrument.auto(
        model,
        opt,
        every=None,
        sinks=[sink],
        dataloader=loader,
        lr_scheduler=sched,
        count_batch=lambda batch: (len(batch[0]), None),
        collectives=False,
    )
    assert optim_hooks.inner_optimizer(opt) is opt.optimizer
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
    report = handle.reporter.flush()
    handle.remove()

    steps = N_BATCHES // 2
    assert report.steps == steps
    assert report["forward"].count == report["backward"].count == N_BATCHES
    assert report["data"].count == N_BATCHES
    assert report["forward/0"].count == N_BATCHES
    assert report["optimizer"].count == steps  # AcceleratedOptimizer steps only on sync
    assert report["zero_grad"].count == steps
    assert report["clip_grad_norm"].count == N_BATCHES  # called every micro-batch here
    assert report["lr_scheduler"].count == N_BATCHES
    assert report.throughput is not None
    assert report.throughput.samples == report.throughput.steps * 2 * 4

    assert type(loader).__name__ == "DataLoaderShard"  # class swapped back
    assert type(loader).__module__ == "accelerate.data_loader"
    assert "zero_grad" not in vars(opt.optimizer)
    assert "step" not in vars(sched)


def test_dispatcher_loader_is_timed_in_place() -> None:
    config = accelerate.utils.DataLoaderConfiguration(dispatch_batches=True)
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=config)
    model, opt, loader = parts()
    model, opt, loader = accelerator.prepare(model, opt, loader)
    assert type(loader).__name__ == "DataLoaderDispatcher"
    sink = InMemory()
    with instrument.auto(model, opt, every=None, sinks=[sink], dataloader=loader) as handle:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        report = handle.reporter.flush()
    assert report["data"].count == N_BATCHES
    assert report.steps == N_BATCHES
    assert type(loader).__name__ == "DataLoaderDispatcher"


def test_any_wrapper_holding_an_optimizer_is_seen_through() -> None:
    model, opt, _ = parts()

    class Wrapper(torch.optim.Optimizer):  # passes isinstance, never ran Optimizer.__init__
        def __init__(self, inner: torch.optim.Optimizer) -> None:
            self._optimizer = inner

        def step(self, closure: object = None) -> None:  # type: ignore[override]
            self._optimizer.step()

    wrapped = Wrapper(opt)
    assert optim_hooks.inner_optimizer(wrapped) is opt
    with instrument.auto(model, wrapped, every=None, sinks=[], collectives=False) as handle:
        model(torch.randn(2, 4)).sum().backward()
        wrapped.step()
        assert handle.reporter.steps == 1
    with pytest.raises(TypeError, match=r"wrapper holding one as \.optimizer"):
        instrument.auto(model, object())  # type: ignore[arg-type]


def test_lightning_optimizer_is_followed_to_the_real_optimizer() -> None:
    lightning_optimizer = pytest.importorskip("lightning.pytorch.core.optimizer")
    model, opt, _ = parts()
    wrapped = lightning_optimizer.LightningOptimizer(opt)
    assert isinstance(wrapped, torch.optim.Optimizer)  # it copies the real one's attributes
    assert optim_hooks.inner_optimizer(wrapped) is opt
    with instrument.auto(model, wrapped, every=None, sinks=[], collectives=False) as handle:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        report = handle.reporter.flush()
    assert report["optimizer"].count == report["zero_grad"].count == 1


def test_auto_before_prepare_with_mixed_precision_says_remove_cannot_undo_it() -> None:
    """``prepare(model)`` with mixed precision wraps ``model.forward`` on top of auto's
    timed one: ``remove()`` cannot take the timing out from under it, and says so."""
    accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
    model, opt, loader = parts()
    handle = instrument.auto(model, opt, every=None, sinks=[], collectives=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    x, _ = next(iter(loader))
    model(x)
    with pytest.warns(RuntimeWarning, match="remove\\(\\) cannot take the timing out") as said:
        handle.remove()
    assert said[0].filename == __file__  # it names the remove() call
    model(x)
    assert instrument.Reporter(every=None, sinks=[]).flush().paths() == ("forward",)


def test_auto_after_prepare_with_mixed_precision_removes_cleanly() -> None:
    accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
    model, opt, loader = accelerator.prepare(*parts())
    handle = instrument.auto(model, opt, every=None, sinks=[], collectives=False)
    x, _ = next(iter(loader))
    model(x)
    assert handle.reporter.flush()["forward"].count == 1
    handle.remove()
    model(x)
    assert instrument.Reporter(every=None, sinks=[]).flush().paths() == ()
