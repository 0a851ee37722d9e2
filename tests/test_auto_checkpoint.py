"""Activation checkpointing under auto(): recompute lands in backward/recompute/<full path>."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import instrument
from instrument.sinks import InMemory


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.tanh(self.attn(x)))


class SelfCheckpointing(Block):
    """Checkpoints its own forward from inside, as HF's ``GradientCheckpointingLayer`` does."""

    reentrant = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = functools.partial(Block.forward, self)
        return checkpoint(inner, x, use_reentrant=self.reentrant)  # type: ignore[no-any-return]


class Net(nn.Module):
    """``style`` says how each block is checkpointed."""

    def __init__(self, style: str, reentrant: bool) -> None:
        super().__init__()
        self.body = nn.Module()
        kind = SelfCheckpointing if style == "inside-block" else Block
        self.body.blocks = nn.ModuleList([kind(), kind()])
        for block in self.body.blocks:
            block.reentrant = reentrant
        self.style = style
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.body.blocks:
            if self.style == "inside-block":
                x = block(x)
                continue
            fn = block if self.style == "module" else block.forward
            x = checkpoint(fn, x, use_reentrant=self.reentrant)
        return x.sum()


@pytest.mark.parametrize("backward", [True, "modules"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("style", ["module", "inside-block", "bound-forward"])
def test_recompute_is_attributed_to_each_block(
    style: str, reentrant: bool, backward: bool | str
) -> None:
    """Also with ``backward="modules"``: a non-reentrant checkpoint recomputes inside the
    first hooked module's backward, and its recompute was filed below that module
    (``backward/blocks.1/mlp/recompute/...``)."""
    torch.manual_seed(0)
    model = Net(style, reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemory()
    x = torch.randn(4, 8, requires_grad=True)
    auto = instrument.auto(model, opt, every=2, sinks=[sink], collectives=False, backward=backward)
    with auto:
        for _ in range(2):
            model(x).backward()
            opt.step()
            opt.zero_grad()
    report = sink.reports[0]
    paths = set(report.paths())
    for i in (0, 1):
        # the same path below backward/recompute as below forward ("body" never runs)
        block = f"backward/recompute/blocks.{i}"
        assert {f"{block}/attn", f"{block}/mlp"} <= paths, sorted(paths)
        assert report[block].count == 2
        assert report[f"forward/blocks.{i}/attn"].count == 2  # the forward, once a step
    assert report["backward/recompute"].count == 4
    assert f"{block}/blocks.{i}" not in paths  # the block is not opened twice
    assert not any(p.startswith(("backward/attn", "backward/mlp")) for p in paths)
    assert all(p.startswith("backward/recompute") for p in paths if "recompute" in p)


def test_checkpoint_of_a_plain_function_is_one_recompute_line() -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin)
    sink = InMemory()
    x = torch.randn(2, 4, requires_grad=True)
    with instrument.auto(model, every=None, sinks=[sink], collectives=False) as handle:
        checkpoint(lambda t: torch.tanh(model(t)), x, use_reentrant=False).sum().backward()
        report = handle.reporter.flush()
    assert "backward/recompute" in report.paths()
    assert report["backward/recompute/forward"].count == 1  # the model, run from a lambda


def test_checkpoint_patches_are_undone() -> None:
    import torch.utils.checkpoint as torch_checkpoint

    before = vars(torch_checkpoint.CheckpointFunction)["forward"]
    name = "_checkpoint_without_reentrant_generator"  # what torch's checkpoint calls
    if hasattr(torch_checkpoint, name + "_impl"):  # torch 2.15
        name += "_impl"
    generator = getattr(torch_checkpoint, name)
    model = Net("module", True)
    with instrument.auto(model, sinks=[], collectives=False):
        assert getattr(torch_checkpoint, name) is not generator
    assert vars(torch_checkpoint.CheckpointFunction)["forward"] is before
    assert getattr(torch_checkpoint, name) is generator
