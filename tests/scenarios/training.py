"""A tiny real training loop under ``instrument.auto``, with one problem injected.

Each scenario runs :data:`STEPS` optimizer steps of an MLP regression (a ``DataLoader`` over
a synthetic ``Dataset``, MSE loss, SGD with momentum) under exactly the ``auto`` call a user
writes, and writes its reports (one every :data:`EVERY` steps) to a JSONL file. A scenario
has two sizes: ``big``, where the problem is clearly there (about twice a healthy step's
work), and ``small``, the same problem at a thirtieth of that (or its harmless form), far
below anything worth reporting.

A problem is a fixed amount of CPU work (:func:`work`: matmuls the size of the model's
own), not a sleep: on a busy machine the steps slow down and so does the work, so a
problem's share of the step stays what it is on an idle one, where a sleep's would shrink.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

import instrument

STEPS = 80
EVERY = 10
BATCH = 64
FEATURES = 2048
HIDDEN = 32
#: A big problem's work in units of :func:`work`: about twice a healthy step's.
BIG = 60
#: A small problem's work: a thirtieth of a big one's, a fifteenth of a healthy step.
SMALL = 2

_gen = torch.Generator().manual_seed(0)
_A = torch.randn(BATCH, FEATURES, generator=_gen)
_B = torch.randn(FEATURES, HIDDEN, generator=_gen)


def work(units: int) -> None:
    """``units`` matmuls the size of the model's first layer's (a fraction of a ms each)."""
    for _ in range(units):
        torch.mm(_A, _B)


@dataclass(frozen=True)
class Problem:
    """What one run injects (all zero: a healthy run); work in units of :func:`work`.

    ``slow_rank``: where set, only that rank does the data and forward work.
    """

    data_work: int = 0  # per batch, in the DataLoader's collate
    forward_work: int = 0  # per forward, in a module of the model
    forward_growth: float = 0.0  # per forward, times the step number
    optimizer_work: int = 0  # per step, in the optimizer's step
    untimed_work: int = 0  # per step, after optimizer.step(), in no region
    checkpoint_floats: int = 0  # torch.save of this many floats every 20 steps
    keep: str = ""  # "graph": keep each step's loss and outputs, with their graph;
    # "copy": keep a detached copy of each loss (4 bytes)
    slow_rank: int | None = None

    def on(self, rank: int) -> Problem:
        """The problem as ``rank`` has it (without the work of another rank)."""
        if self.slow_rank is None or rank == self.slow_rank:
            return self
        return replace(self, data_work=0, forward_work=0, forward_growth=0.0)


SINGLE: dict[str, tuple[Problem, Problem]] = {
    "healthy": (Problem(), Problem()),
    "slow_data": (Problem(data_work=BIG), Problem(data_work=SMALL)),
    "untimed_work": (Problem(untimed_work=BIG), Problem(untimed_work=SMALL)),
    "heavy_optimizer": (Problem(optimizer_work=BIG), Problem(optimizer_work=SMALL)),
    "checkpoint": (
        Problem(checkpoint_floats=20_000_000),  # 80 MB, and the model's 0.5 MB
        Problem(checkpoint_floats=10_000),
    ),
    "slowdown": (  # BIG (half of SMALL) more at the last step than at the first: where a
        # unit is a larger part of the step (2 units: 15-18 % of an AMD EPYC VM's healthy
        # step), SMALL itself, with the machine's noise, comes near a slowdown's 25 %
        Problem(forward_growth=BIG / STEPS),
        Problem(forward_growth=SMALL / 2 / STEPS),
    ),
    "memory_leak": (Problem(keep="graph"), Problem(keep="copy")),  # run last
}
"""Single-rank scenarios: (big, small)."""

TWO_RANKS: dict[str, tuple[Problem, Problem]] = {
    "compute_straggler": (
        Problem(forward_work=BIG, slow_rank=1),
        Problem(forward_work=SMALL, slow_rank=1),
    ),
    "input_straggler": (
        Problem(data_work=BIG, slow_rank=1),
        Problem(data_work=SMALL, slow_rank=1),
    ),
}
"""Scenarios on two ranks (gloo, DDP): (big, small)."""

SIZES = ("big", "small")


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``STEPS * BATCH`` synthetic (input, target) pairs, drawn from a fixed pool."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(256, FEATURES, generator=gen)
        self.targets = torch.randn(256, FEATURES, generator=gen)

    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = index % len(self.inputs)
        return self.inputs[row], self.targets[row]


class SlowCollate:
    """The default collate, then ``units`` of work (a heavy input pipeline)."""

    def __init__(self, units: int) -> None:
        self.units = units

    def __call__(self, samples: list[Any]) -> Any:
        batch = default_collate(samples)
        work(self.units)
        return batch


class Slow(nn.Module):
    """A layer that works ``units + growth * step`` units in its forward (the model's slow
    part); ``step`` is set by the loop."""

    def __init__(self, units: int, growth: float) -> None:
        super().__init__()
        self.units = units
        self.growth = growth
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        work(self.units + round(self.growth * self.step))
        return x


class BookkeepingSGD(torch.optim.Optimizer):
    """SGD with momentum, then ``units`` of work each step (as an optimizer that checks or
    logs its parameters would spend)."""

    def __init__(self, params: Any, lr: float, momentum: float, units: int) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        self.units = units

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].get("momentum")
                if buf is None:
                    buf = self.state[p]["momentum"] = p.grad.clone()
                else:
                    buf.mul_(group["momentum"]).add_(p.grad)
                p.add_(buf, alpha=-group["lr"])
        work(self.units)
        return None


def build(
    spec: Problem, rank: int, distributed: bool
) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader[Any], Slow | None]:
    """The model (DDP-wrapped when ``distributed``), its optimizer and loader, as ``rank``
    has them (every rank has the same modules)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN), nn.ReLU()]
    mine = spec.on(rank)
    slow = None
    if spec.forward_work or spec.forward_growth:
        slow = Slow(mine.forward_work, mine.forward_growth)
        layers.append(slow)
    layers.append(nn.Linear(HIDDEN, FEATURES))
    model: nn.Module = nn.Sequential(*layers)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer: torch.optim.Optimizer
    if mine.optimizer_work:
        optimizer = BookkeepingSGD(model.parameters(), 0.01, 0.9, mine.optimizer_work)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    collate = SlowCollate(mine.data_work) if mine.data_work else default_collate
    loader = DataLoader(Samples(seed=rank), batch_size=BATCH, collate_fn=collate)
    return model, optimizer, loader, slow


def train(spec: Problem, path: Path, rank: int = 0, distributed: bool = False) -> None:
    """Train ``STEPS`` steps with ``spec`` injected; the reports go to ``path`` (JSONL)."""
    model, optimizer, loader, slow = build(spec, rank, distributed)
    spec = spec.on(rank)
    kept: list[torch.Tensor] = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = {"model": model.state_dict(), "extra": torch.zeros(spec.checkpoint_floats)}
        handle = instrument.auto(
            model,
            optimizer,
            dataloader=loader,
            every=EVERY,
            sinks=[instrument.sinks.JSONL(path)],
            ranks="minmax",
        )
        try:
            for step, (inputs, targets) in enumerate(loader, start=1):
                if slow is not None:
                    slow.step = step
                outputs = model(inputs)
                loss = nn.functional.mse_loss(outputs, targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if spec.keep == "graph":  # for epoch metrics, forgetting detach()
                    kept += (loss, outputs)
                elif spec.keep == "copy":  # (mse_loss's loss shares a batch-sized storage)
                    kept.append(loss.detach().clone())
                work(spec.untimed_work)
                if spec.checkpoint_floats and step % 20 == 0:
                    torch.save(checkpoint, Path(tmp) / "checkpoint.pt")
        finally:
            handle.remove()
    kept.clear()
