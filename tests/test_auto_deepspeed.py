"""instrument.auto on a real DeepSpeed engine (ZeRO 0, 2 and 3, CPU, 2 gloo processes).

The engine's ``backward()`` and ``step()`` do work of their own around autograd and the
torch optimizer (loss scaling, gradient reduction into partitions, clipping, copying and
gathering the parameters back): timed only at autograd and the torch optimizer, it read
as ``(other)`` — about half of a ZeRO-2 step on CPU.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks

import instrument

pytest.importorskip("deepspeed", reason="deepspeed is not installed")

DELAY = 0.02  # work injected into the engine outside autograd and the torch optimizer
MICRO_STEPS = 8


def deepspeed_worker(rank: int, world_size: int, stage: int, accumulation: int) -> dict[str, Any]:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ["DS_ACCELERATOR"] = "cpu"  # the gloo group's device, also where CUDA is
    warnings.simplefilter("ignore")
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    # the engine's own work around autograd and around the torch optimizer's step
    epilogue, update = engine._backward_epilogue, engine._take_model_step
    engine._backward_epilogue = lambda *a, **k: (time.sleep(DELAY), epilogue(*a, **k))[1]
    engine._take_model_step = lambda *a, **k: (time.sleep(DELAY), update(*a, **k))[1]
    handle = instrument.auto(engine, every=None, sinks=[], normalizer=1.0)  # optimizer found
    for _ in range(MICRO_STEPS):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    report = handle.reporter.flush()
    handle.remove()
    return {
        "report": report.to_dict(),
        "left": sorted({"step", "backward"} & set(vars(engine))),  # the class's again?
    }


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("stage", "accumulation"), [(0, 1), (2, 2), (3, 1)])
def test_the_engines_backward_and_step_are_the_lines(stage: int, accumulation: int) -> None:
    for result in run_ranks(deepspeed_worker, 2, stage, accumulation, timeout=200):
        report = instrument.Report.from_dict(result["report"])
        steps = MICRO_STEPS // accumulation
        assert report.steps == steps  # one per update, found without passing the optimizer
        assert report["forward"].count == MICRO_STEPS
        backward, optimizer = report["backward"], report["optimizer"]
        assert backward.count == MICRO_STEPS  # one region: autograd's call inside is no other
        assert "backward/backward" not in report
        assert optimizer.count == steps  # the micro-steps' step() updates nothing: untimed
        assert backward.total >= MICRO_STEPS * DELAY  # the engine's own work, in its line
        assert optimizer.total >= steps * DELAY
        assert report.other is not None
        # left out of the lines, the engine's work would be (other): at least 8 x 20 ms
        assert report.other < MICRO_STEPS * DELAY / 2
        reduced = [n for n in report.nodes if n.path.startswith("backward/") and n.bytes]
        assert reduced  # the gradients' reduction, below backward
        assert result["left"] == []  # remove() took the engine's timing off


def test_an_engine_whose_optimizer_holds_no_torch_optimizer_says_so() -> None:
    """Nothing to end the steps at: said once, naming the optimizer; the rest is timed."""

    class DeepSpeedEngine(torch.nn.Module):  # what auto() recognises an engine by
        __module__ = "deepspeed.runtime.engine"

        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Linear(2, 2)
            self.optimizer = object()  # not a torch optimizer, holding none

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)  # type: ignore[no-any-return]

    engine = DeepSpeedEngine()
    with pytest.warns(RuntimeWarning, match=r"optimizer \(object\) holds no torch.optim"):
        handle = instrument.auto(engine, every=None, sinks=[])
    engine(torch.ones(1, 2)).sum().backward()
    report = handle.reporter.flush()
    handle.remove()
    assert (report["forward"].count, report["backward"].count, report.steps) == (1, 1, 0)
