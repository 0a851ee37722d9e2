"""Activation checkpointing: the forward that backward recomputes is recorded as
``backward/recompute/<full path of the checkpointed module>/...`` (for example
``backward/recompute/transformer/h.0/attn``), never as the blocks' own backward and never
merged across blocks.

``torch.utils.checkpoint`` hands the checkpointed function to ``CheckpointFunction``
(reentrant) or ``_checkpoint_without_reentrant_generator`` (non-reentrant); both are
patched while installed to wrap that function, noting the regions open below ``forward``
at that moment (the forward pass). Calls outside backward run as is; a call during
backward (the recompute) opens ``recompute`` — on autograd's own threads under the
``backward`` region — and then the noted regions, so the recomputed modules get the same
path under ``backward/recompute`` as under ``forward``, whether the checkpointed function
is the module, its bound ``forward`` or ``partial(forward, module)`` (what HF transformers'
``GradientCheckpointingLayer`` passes, from inside the block's own region).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

from instrument.hooks import patches
from instrument.regions.frames import Frame, get_top, set_top
from instrument.regions.region import Region, region_for
from instrument.registry import ROOT, PathNode

compiling = torch.compiler.is_compiling
_in_backward = torch._C._current_graph_task_id


def _open_regions() -> list[Region]:
    """The regions open in this context below the model's ``forward`` (outermost first)."""
    out: list[Region] = []
    frame: Frame | None = get_top()
    while frame is not None and frame.node is not ROOT:
        owner = frame.owner
        if getattr(owner, "name", None) == "forward" or not isinstance(owner, Region):
            break
        out.append(owner)
        frame = frame.parent
    out.reverse()
    return out


def attributed(fn: Callable[..., Any], anchor: Callable[[], PathNode]) -> Callable[..., Any]:
    """``fn``, whose calls during backward are timed as ``recompute/...`` below the regions
    open now (in the forward pass, where torch's checkpoint receives ``fn``)."""
    recompute = region_for("recompute")
    chain = _open_regions()

    def run(*args: Any, **kwargs: Any) -> Any:
        if compiling() or _in_backward() == -1:
            return fn(*args, **kwargs)
        # below the backward region's node itself: not floating on an autograd thread (no
        # region open there), and not below a module's backward region that happens to be
        # open (a non-reentrant checkpoint recomputes when a saved tensor is unpacked,
        # inside the first hooked module's backward, with backward="modules")
        top, node = get_top(), anchor()
        anchored = top.node is not node
        if anchored:
            frame = Frame(node, 0, top, anchor, None)
            set_top(frame)
        opened: list[Region] = []
        try:
            for region in (recompute, *chain):
                region.__enter__()
                opened.append(region)
            return fn(*args, **kwargs)
        finally:
            for region in reversed(opened):
                region.__exit__(None, None, None)
            if anchored and get_top().owner is anchor:
                set_top(get_top().parent)

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

    # torch 2.15 runs the non-reentrant checkpoint through ..._impl (the older name wraps it)
    name = "_checkpoint_without_reentrant_generator"
    if hasattr(torch_checkpoint, name + "_impl"):
        name += "_impl"
    undo_generator = patches.patch(torch_checkpoint, name, make_generator)
    undo_forward = patches.patch(torch_checkpoint.CheckpointFunction, "forward", make_forward)

    def undo() -> None:
        undo_forward()
        undo_generator()

    return undo
