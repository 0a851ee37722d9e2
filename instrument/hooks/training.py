"""What trainers do around the step, each under its own name: ``clip_grad_norm``
(``torch.nn.utils.clip_grad_norm_``, which Accelerate's and Lightning's clipping call),
``lr_scheduler`` (the scheduler's ``step()``) and ``zero_grad`` for ``model.zero_grad()``
(what HF's Trainer calls), also through the wrappers that hold the model (DDP,
``torch.compile``)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from instrument.hooks import patches
from instrument.hooks.modules import held_module
from instrument.regions.decorators import decorate
from instrument.regions.region import Region, region_for

compiling = torch.compiler.is_compiling

# model -> its zero_grad region, for the nn.Module.zero_grad patch
_zeroed: weakref.WeakKeyDictionary[nn.Module, Region] = weakref.WeakKeyDictionary()


def time_clipping(clock: object = None) -> Callable[[], None]:
    """Time ``torch.nn.utils.clip_grad_norm_`` as ``clip_grad_norm``; returns the undo."""
    region = region_for("clip_grad_norm", clock)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            with region:
                return original(*args, **kwargs)

        return clip_grad_norm_

    return patches.patch(torch.nn.utils, "clip_grad_norm_", make)


def _model_of(module: nn.Module) -> Region | None:
    """The zero_grad region of the instrumented model ``module`` is or wraps, if any."""
    current: nn.Module | None = module
    for _ in range(4):  # DDP(compile(model)) and the like
        if current is None:
            return None
        found = _zeroed.get(current)
        if found is not None:
            return found
        current = held_module(current)
    return None


def time_model_zero_grad(model: nn.Module, clock: object = None) -> Callable[[], None]:
    """Time ``model.zero_grad()`` (and that of any wrapper holding ``model``) as
    ``zero_grad``; returns the undo."""
    _zeroed[model] = region_for("zero_grad", clock)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            region = None if compiling() else _model_of(self)
            if region is None:
                return original(self, *args, **kwargs)
            with region:
                return original(self, *args, **kwargs)

        return zero_grad

    undo_patch = patches.patch(nn.Module, "zero_grad", make)

    def undo() -> None:
        _zeroed.pop(model, None)
        undo_patch()

    return undo


def time_scheduler(scheduler: object, clock: object = None) -> Callable[[], None]:
    """Time ``scheduler.step()`` as ``lr_scheduler`` (a method put on the instance); returns
    the undo. Any object with a ``step`` method works (torch's schedulers, HF's, ...)."""
    step = getattr(scheduler, "step", None)
    if not callable(step):
        raise TypeError(
            f"lr_scheduler must have a step() method (a torch.optim.lr_scheduler.LRScheduler "
            f"or the like), got {type(scheduler).__name__}"
        )
    had = "step" in vars(scheduler)
    before = vars(scheduler).get("step")
    timed = decorate(step, region_for("lr_scheduler", clock))
    vars(scheduler)["step"] = timed

    def undo() -> None:
        if vars(scheduler).get("step") is not timed:
            return
        if had:
            vars(scheduler)["step"] = before
        else:
            del vars(scheduler)["step"]

    return undo
