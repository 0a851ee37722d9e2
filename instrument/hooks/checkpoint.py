"""Activation checkpointing: the forward that backward recomputes is recorded as
``backward/recompute/<full path of the checkpointed module>/...`` (for example
``backward/recompute/transformer/h.0/attn``), never as the blocks' own backward and never
merged across blocks.

``torch.utils.checkpoint`` hands the checkpointed function to ``CheckpointFunction``
(reentrant) or ``_checkpoint_without_reentrant_generator`` (non-reentrant); both are
patched while installed to wrap that function. Its first call (the forward) runs as is;
a call during backward (the recompute) opens ``recompute`` — on autograd's own threads
under the ``backward`` region — and then the regions of the module's timed ancestors, so
the modules inside keep their full names. The module is found from the function:
the module itself, a bound method of it, or ``partial(forward, module)`` (what HF
transformers' ``GradientCheckpointingLayer`` passes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from instrument.hooks import modules, patches
from instrument.region import ROOT_FRAME, Frame, Region, _get, _set, region_for
from instrument.registry import ROOT, PathNode

compiling = torch.compiler.is_compiling
_in_backward = torch._C._current_graph_task_id
_REENTERING = ("__call__", "_call_impl", "_wrapped_call_impl")


def _target(fn: Any) -> tuple[nn.Module | None, bool]:
    """The module ``fn`` runs, and whether calling ``fn`` goes through the module's own
    (timed) call — else the recompute opens the module's region itself."""
    if isinstance(fn, nn.Module):
        return fn, True
    if isinstance(fn, functools.partial):
        if fn.args and isinstance(fn.args[0], nn.Module):
            return fn.args[0], _reenters(fn.func)
        return _target(fn.func)
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, nn.Module):
        return owner, _reenters(getattr(fn, "__func__", fn))
    return None, False


def _reenters(func: Any) -> bool:
    return getattr(func, "__name__", "") in _REENTERING or bool(
        getattr(func, "_instrument_forward", False)
    )


def _chain(fn: Any) -> tuple[Region, ...]:
    """The regions a recompute of ``fn`` opens below ``recompute``."""
    module, reenters = _target(fn)
    found = modules._timed.get(module) if module is not None else None
    if found is None:
        return ()
    region, hooks = found
    ancestors = hooks.ancestors.get(module, ())  # type: ignore[arg-type]
    return ancestors if reenters else (*ancestors, region)


def attributed(fn: Callable[..., Any], anchor: Callable[[], PathNode]) -> Callable[..., Any]:
    """``fn``, whose calls during backward are timed as ``recompute/...``."""
    recompute = region_for("recompute")

    def run(*args: Any, **kwargs: Any) -> Any:
        if compiling() or _in_backward() == -1:
            return fn(*args, **kwargs)
        anchored = _get()[0] is ROOT  # an autograd thread: attach to the backward region
        if anchored:
            frame: Frame = (anchor(), 0, ROOT_FRAME, anchor, None)
            _set(frame)
        opened: list[Region] = []
        try:
            recompute.__enter__()
            opened.append(recompute)
            for region in _chain(fn):
                region.__enter__()
                opened.append(region)
            return fn(*args, **kwargs)
        finally:
            for region in reversed(opened):
                region.__exit__(None, None, None)
            if anchored and _get()[3] is anchor:
                _set(_get()[2])

    return run


def install(anchor: Callable[[], PathNode]) -> Callable[[], None]:
    """Patch torch's checkpoint entry points (reference-counted); returns the undo."""

    def make_generator(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def generator(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return original(attributed(fn, anchor), *args, **kwargs)

        return generator

    def make_forward(original: Any) -> Any:
        forward = original.__func__

        @functools.wraps(forward)
        def checkpoint_forward(ctx: Any, run_function: Any, *args: Any) -> Any:
            return forward(ctx, attributed(run_function, anchor), *args)

        return staticmethod(checkpoint_forward)

    undo_generator = patches.patch(
        torch_checkpoint, "_checkpoint_without_reentrant_generator", make_generator
    )
    undo_forward = patches.patch(torch_checkpoint.CheckpointFunction, "forward", make_forward)

    def undo() -> None:
        undo_forward()
        undo_generator()

    return undo
