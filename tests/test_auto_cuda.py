"""instrument.auto on a GPU: device times, no host sync in the hot path, autograd threads."""

from __future__ import annotations

import warnings

import pytest
import torch
from models import TinyLM
from torch import nn

import instrument
from instrument.sinks import InMemory

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    logits = model(tokens)
    nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    opt.step()
    opt.zero_grad()


def setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM(vocab=512, d=128).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    tokens = torch.randint(0, 512, (8, 64), device="cuda")
    step(model, opt, tokens)  # warm up (lazy optimizer state, cuBLAS handles)
    torch.cuda.synchronize()
    return model, opt, tokens


def test_auto_never_synchronizes_in_training_steps() -> None:
    model, opt, tokens = setup()
    sink = InMemory()
    with instrument.auto(model, opt, every=None, sinks=[sink]) as handle:
        instrument.configure(clock="cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                step(model, opt, tokens)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        report = handle.reporter.flush()
    assert report.steps == 3
    forward = report["forward"]
    assert forward.device is not None
    assert forward.clock == "cuda"
    assert report["forward/encoder/layers.0/self_attn"].device is not None
    assert report["backward"].device is not None
    assert report["optimizer"].count == 3


def test_backward_modules_attach_to_backward_from_autograd_threads() -> None:
    model, opt, tokens = setup()
    sink = InMemory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with instrument.auto(model, opt, every=None, sinks=[sink], backward="modules") as h:
            for _ in range(2):
                step(model, opt, tokens)
            report = h.reporter.flush()
    paths = report.paths()
    assert "backward/encoder/layers.0/self_attn" in paths
    assert "backward/head" in paths
    # nothing floats as a separate root from autograd's device thread
    assert all(p.split("/")[0] in {"forward", "backward", "optimizer", "zero_grad"} for p in paths)
    assert report["backward/encoder"].count == 2


def test_results_match_uninstrumented_on_gpu() -> None:
    def train(instrumented: bool) -> list[torch.Tensor]:
        model, opt, tokens = setup()
        handle = instrument.auto(model, opt, sinks=[]) if instrumented else None
        for _ in range(3):
            step(model, opt, tokens)
        if handle is not None:
            handle.remove()
        return [p.detach().clone() for p in model.parameters()]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # deterministic backward, so results compare exactly
        plain, timed = train(False), train(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, timed, strict=True))


def test_forked_dataloader_workers_survive_inherited_cuda_events() -> None:
    reporter = instrument.Reporter(every=None, sinks=[])
    instrument.configure(clock="cuda")
    with instrument.timed("x"):
        torch.ones(1, device="cuda")
    reporter.flush()  # the pool now holds free events
    with instrument.timed("y"):
        torch.ones(1, device="cuda")  # and these are pending
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    assert sum(len(batch) for (batch,) in loader) == 8  # workers did not abort
    assert reporter.flush()["y"].device is not None


def test_regions_in_a_forked_child_use_the_host_clock() -> None:
    import os

    instrument.configure(clock="cuda")
    torch.ones(1, device="cuda")  # CUDA initialised in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: CUDA is unusable here
        try:
            with instrument.timed("child"), instrument.timed("explicit", clock="cuda"):
                pass
            report = instrument.Reporter(every=None).flush()
            os.write(write, f"{report.paths()} {report['child'].clock}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == "('child', 'child/explicit') cpu"


def test_closure_step_on_the_cuda_clock_times_the_update_alone() -> None:
    """Device time of ``optimizer`` under ``step(closure)`` leaves out the closure's work."""
    model, opt, tokens = setup()
    sink = InMemory()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        return loss

    with instrument.auto(model, opt, every=4, sinks=[sink], clock="cuda", collectives=False):
        for _ in range(4):
            opt.step(closure)
    report = sink.reports[0]
    assert not any(p.startswith("optimizer/") for p in report.paths())
    optimizer = report["optimizer"]
    assert optimizer.device is not None
    assert optimizer.device.count == 4
    assert optimizer.count == report["forward"].count == report["backward"].count == 4
    # the update alone is far shorter than forward + backward, on both clocks
    assert optimizer.device.total < report["backward"].device.total  # type: ignore[union-attr]
