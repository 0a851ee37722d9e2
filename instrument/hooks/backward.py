"""The ``backward`` region: ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
timed while installed, and the node that work on autograd's own threads attaches to."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from instrument.hooks import patches
from instrument.regions.frames import _get
from instrument.regions.region import region_for
from instrument.registry import ROOT, PathNode

compiling = torch.compiler.is_compiling

_last: PathNode | None = None


def anchor() -> PathNode:
    """The path of the running (or last) ``backward`` region: where per-module backward
    regions and DDP's gradient all-reduce, which run on autograd's threads, are recorded."""
    if _last is not None:
        return _last
    return ROOT.children.get("backward") or ROOT.child("backward", 0, "cpu")


def install(clock: object = None) -> Callable[[], None]:
    """Time every ``backward()`` as a ``backward`` region; returns the undo."""
    region = region_for("backward", clock)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            global _last
            if compiling() or _get()[3] is region:
                return original(*args, **kwargs)
            with region:
                _last = _get()[0]
                return original(*args, **kwargs)

        return backward

    return patches.patch(torch.autograd, "backward", make)
