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
from instrument.hooks.modules import held_chain
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
    for current in held_chain(module):  # DDP(compile(model)) and the like
        found = _zeroed.get(current)
        if found is not None:
            return found
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
    the undo. Any object with a ``step`` method works (torch's schedulers, HF's, ...).

    torch's schedulers save their ``__dict__`` as their state (``state_dict()``, which
    Trainers checkpoint): the instance's ``state_dict`` is wrapped too, so the state it
    returns is what it would be without instrument (no timed method in a checkpoint)."""
    step = getattr(scheduler, "step", None)
    if not callable(step):
        raise TypeError(
            f"lr_scheduler must have a step() method (a torch.optim.lr_scheduler.LRScheduler "
            f"or the like), got {type(scheduler).__name__}"
        )
    own = vars(scheduler)
    before: dict[str, Any] = {name: own[name] for name in ("step", "state_dict") if name in own}
    put: dict[str, Any] = {"step": decorate(step, region_for("lr_scheduler", clock))}
    undo_step = patches.put_on_instance(scheduler, "step", put["step"])
    state_dict = getattr(scheduler, "state_dict", None)
    if not callable(state_dict):
        return undo_step
    put["state_dict"] = _state_without(state_dict, put, before)
    undo_state = patches.put_on_instance(scheduler, "state_dict", put["state_dict"])

    def undo() -> None:
        undo_state()
        undo_step()

    return undo


def _state_without(
    state_dict: Callable[..., Any], put: dict[str, Any], before: dict[str, Any]
) -> Callable[..., Any]:
    """``state_dict`` whose result leaves out the instance attributes instrument ``put``
    (read when called), with what they replaced (``before``) back in their place."""

    @functools.wraps(state_dict)
    def without(*args: Any, **kwargs: Any) -> Any:
        state = state_dict(*args, **kwargs)
        if isinstance(state, dict):
            for name, value in put.items():
                if state.get(name) is value:
                    if name in before:
                        state[name] = before[name]
                    else:
                        del state[name]
        return state

    return without
