"""Hooks that run as plain Python when they are reached from code ``torch.compile`` runs.

A function compiled with ``torch.compile`` (PyTorch's recipe for compiling the optimizer,
or a whole ``train_step``) calls our hooks two ways, and neither may compile them:

- **traced**: Dynamo inlines the hook while it builds a graph (``optimizer.step()``'s
  pre/post hooks, ``torch.autograd.backward(loss)``). The hook sees
  ``torch.compiler.is_dynamo_compiling()`` first thing and calls its :func:`outside`
  version instead, which Dynamo cannot trace: the graph breaks there and the hook runs as
  Python (traced, a clock read would be a constant).
- **between graphs**: after a graph break Dynamo runs the rest as Python but still offers
  every new Python frame to the compiler (``loss.backward()`` inside the function reaches
  our ``torch.autograd.backward`` wrapper that way): the hook is then traced, as above.
  :func:`compile_callback` tells a hook that it runs there, so it hands the rest of its
  work (a flush) to an :func:`outside` version.

Neither costs anything when nothing is compiled. Making an :func:`outside` version imports
Dynamo (about 0.8 s, once), so it happens when a hook is installed (``auto()``), never at
``import instrument``; a process that has imported Dynamo exits with status 1, not by
SIGINT, on an uncaught ``KeyboardInterrupt`` (PyTorch's behaviour, as with any
``torch.compile``).
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


def outside(func: F) -> F:
    """``func``, and everything it calls, run as Python even from compiled code
    (``torch.compiler.disable``). Made when a hook is installed, never while Dynamo traces
    (making one there is a graph break of its own)."""
    return torch.compiler.disable(func, recursive=True)  # type: ignore[no-untyped-call,no-any-return]
