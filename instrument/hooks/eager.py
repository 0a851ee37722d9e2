"""Hooks that run as plain Python when they are reached from code ``torch.compile`` runs.

A function compiled with ``torch.compile`` (PyTorch's recipe for compiling the optimizer,
or a whole ``train_step``) calls our hooks two ways, and neither may compile them:

- **traced**: Dynamo inlines the hook while it builds a graph (``optimizer.step()``'s
  pre/post hooks). The hook sees ``torch.compiler.is_dynamo_compiling()`` and calls
  :func:`outside`'s version instead, which Dynamo cannot trace: the graph breaks there and
  the hook runs as Python (traced, a clock read would be a constant).
- **between graphs**: after a graph break Dynamo runs the rest as Python but still offers
  every new Python frame to the compiler (``loss.backward()`` inside the function reaches
  our ``torch.autograd.backward`` wrapper that way). :func:`never_compiled` marks a hook's
  code so Dynamo runs it as it is; :func:`compile_callback` tells a hook that it runs
  there, so it hands the rest of its work (a flush) to :func:`outside`.

Neither costs anything when nothing is compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

#: Not None while Python frames are offered to Dynamo (inside a call of a compiled function).
compile_callback: Callable[[], object] = getattr(
    torch._C._dynamo.eval_frame, "get_eval_frame_callback", lambda: None
)


def never_compiled(func: F) -> F:
    """Mark ``func``'s code so that Dynamo runs its frames as Python instead of compiling
    them (what it calls is still offered to Dynamo); returns ``func`` unchanged."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # another torch: its hooks see is_dynamo_compiling() and call through
        return func
    skip_code(func.__code__)
    return func


@never_compiled  # called between graphs (a hook's first flush): no compile attempt
def outside(func: F) -> F:
    """``func``, and everything it calls, run as Python even from compiled code."""
    return torch.compiler.disable(func, recursive=True)  # type: ignore[no-untyped-call,no-any-return]
