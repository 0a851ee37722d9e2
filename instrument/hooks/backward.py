"""The ``backward`` region: ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
timed while installed, and the node that work on autograd's own threads attaches to."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from instrument import registry
from instrument.hooks import collectives, patches
from instrument.hooks.eager import compile_callback, outside
from instrument.regions import native
from instrument.regions.decorators import direct_call, in_region
from instrument.regions.frames import get_top
from instrument.regions.region import region_for
from instrument.registry import PathNode

# True only while Dynamo traces the caller (AOTAutograd and export never call backward())
tracing = torch.compiler.is_dynamo_compiling
# -1 outside autograd's engine; inside it (a reentrant checkpoint's backward) a task id
_graph_task = torch._C._current_graph_task_id

NAME = "backward"
#: The node the running (or last) ``backward`` region was opened under.
_parent: PathNode | None = None


def anchor() -> PathNode:
    """The path of the running (or last) ``backward`` region: where per-module backward
    regions and DDP's gradient all-reduce, which run on autograd's threads, are recorded."""
    parent = _parent
    if parent is not None:  # the region's node, or its parent's where it was switched off
        node = parent.children.get(NAME)
        return node if node is not None else parent
    return registry.steps_own(NAME)


def install(clock: object = None) -> Callable[[], None]:
    """Time every ``backward()`` as a ``backward`` region; returns the undo."""
    region = region_for(NAME, clock)
    return patches.patch(torch.autograd, "backward", lambda original: _timed(original, region))


def time_method(obj: object, name: str, clock: object = None) -> Callable[[], None]:
    """Time ``obj.name()`` (a trainer's own backward: a DeepSpeed engine's, which scales the
    loss, runs autograd and reduces the gradients) as the same ``backward`` region, so the
    autograd call inside it is no second one; returns the undo."""
    region = region_for(NAME, clock)
    return patches.put_on_instance(obj, name, _timed(getattr(obj, name), region))


def _own_errors(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original``, raising a failed DDP bucket's error as the process group raised it,
    not as the timed bucket's future callback passed it on."""

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            cause = collectives.bucket_error(error)
            if cause is None or error.__traceback__ is None:
                raise
            raise cause.with_traceback(error.__traceback__.tb_next) from None

    return backward


def _timed(original: Callable[..., Any], region: Any) -> Callable[..., Any]:
    """``original`` in the ``backward`` region, unless one is open already."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        original = _own_errors(original)  # DDP's buckets may fail (one frame more)
    timed = direct_call(original, region)  # C: entered, called and left in one call
    if timed is None:
        timed = in_region(original, region)

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        global _parent
        if tracing():  # in a compiled function, inlined or between its graphs: the
            return eager(*args, **kwargs)  # graph breaks here, before our C calls
        top = get_top()
        # a backward inside backward (a reentrant checkpoint's, which may run below a
        # module's backward region with backward="modules", or autograd's inside a
        # trainer's own backward): one region
        if top.owner is region or _graph_task() != -1:
            return original(*args, **kwargs)
        _parent = top.node
        return timed(*args, **kwargs)

    eager = outside(backward)
    # with C: one call that does what ``backward`` does when nothing is compiled
    return native.backward_call(
        backward, region, original, compile_callback, _graph_task, globals()
    )
