"""C hooks while Dynamo traces nothing; their Python twins from the first compilation on.

Inside a real training step a Python frame around each timed module call costs about
0.5 µs — the step's own work has evicted it from the caches — several times what the
region costs (docs/performance.md, "auto per step"). So while nothing is compiled, a timed
module's ``forward`` is the C timed call itself, with no Python frame of ours around it.

Dynamo cannot trace a C callable: it would break the graph at every timed module. Each such
hook therefore has a Python twin that asks ``torch.compiler.is_compiling()`` and, when
traced, calls straight through. The first compilation in the process — Dynamo's
compile-start callback, which runs before anything is traced — puts every twin in place,
and every later install uses the twins at once. ``torch._dynamo.reset()`` clears Dynamo's
callbacks; while C hooks are live it is patched to register ours again.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

from instrument.hooks import patches

_lock = threading.Lock()
#: token -> the swap that puts one hook owner's Python twins in place
_swaps: dict[object, Callable[[], None]] = {}
#: Set by the first compilation seen (or when the callback cannot be registered).
_traced = False
_undo_reset_patch: Callable[[], None] | None = None


def c_hooks_allowed() -> bool:
    """Whether a new hook may be the C callable (nothing compiled since instrument looked)."""
    return not _traced


def until_traced(swap: Callable[[], None]) -> Callable[[], None]:
    """Call ``swap`` (it puts the Python twins in place) when Dynamo starts compiling
    anything; returns the undo that forgets it (call it when the hooks come off)."""
    global _undo_reset_patch
    key = object()
    with _lock:
        if not _traced:
            _swaps[key] = swap
            if _undo_reset_patch is None and _register():
                import torch._dynamo

                _undo_reset_patch = patches.patch(torch._dynamo, "reset", _reset_keeping_ours)
    if _traced:  # compiling started meanwhile, or there is no callback to wait for
        _forget(key)
        swap()

    def forget() -> None:
        _forget(key)

    return forget


def _forget(key: object) -> None:
    global _undo_reset_patch
    with _lock:
        _swaps.pop(key, None)
        if _swaps or _undo_reset_patch is None:
            return
        undo, _undo_reset_patch = _undo_reset_patch, None
        _unregister()
    undo()


def _callbacks() -> Any:
    import torch._dynamo.callback

    return torch._dynamo.callback.callback_handler


def _register() -> bool:
    """Register the compile-start callback; where torch has none, every hook is a twin."""
    global _traced
    try:
        handler = _callbacks()
        if _on_compile_start not in handler.start_callbacks:
            handler.register_start_callback(_on_compile_start)
    except Exception:  # another torch: no callback, no C hooks
        from instrument._torch_support import degraded

        _traced = True
        degraded(
            "Dynamo's compile-start callback (torch._dynamo.callback)",
            "2.6",
            "timed modules run through Python hooks (about 0.5 us more per module call)",
        )
        return False
    return True


def _unregister() -> None:
    try:
        handler = _callbacks()
        if _on_compile_start in handler.start_callbacks:
            handler.remove_start_callback(_on_compile_start)
    except Exception:  # nothing registered to remove
        pass


def make_traceable() -> None:
    """Every live C hook becomes its Python twin, for good: Dynamo is about to trace, or a
    compiled module is called (Dynamo skips ``nn.Module.__call__``'s own frame, so it would
    run the root's C forward eagerly and trace from inside it)."""
    global _traced
    if _traced:
        return
    with _lock:
        _traced = True
        swaps = list(_swaps.values())
        _swaps.clear()
    for swap in swaps:
        try:
            swap()
        except Exception as error:  # never break the compilation
            warnings.warn(
                f"instrument: could not make a hook traceable for torch.compile: {error!r}",
                RuntimeWarning,
                stacklevel=2,
            )


def _on_compile_start(args: object = None) -> None:
    """Dynamo's compile-start callback."""
    make_traceable()


def _reset_keeping_ours(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reset(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                if _swaps and not _traced:
                    _register()

    return reset


def forget_compilations() -> None:
    """New hooks may be C again (``instrument.testing.reset``): a compilation that comes
    later still swaps them, so this is safe whatever Dynamo has cached."""
    global _traced
    with _lock:
        _traced = False
