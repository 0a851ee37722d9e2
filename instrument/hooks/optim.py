"""The ``optimizer`` and ``zero_grad`` regions, and the end of an iteration.

``optimizer.step()`` is timed by the optimizer's own step pre/post hooks; the post hook of
the *ticking* optimizer (the last one given) then ends the iteration — so with gradient
accumulation an iteration is one optimizer step. ``GradScaler.step(optimizer)`` is timed
whole (unscaling and the inf check included) and ends the iteration even when the scaler
skips the step because of infs or NaNs; the skipped steps are counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import wrapt

from instrument.hooks import patches
from instrument.region import _get, abandon, decorate, region_for

compiling = torch.compiler.is_compiling

# optimizer -> its hooks (what the GradScaler patch consults)
_tracked: weakref.WeakKeyDictionary[torch.optim.Optimizer, OptimizerHooks] = (
    weakref.WeakKeyDictionary()
)


def check_optimizers(optimizer: object) -> list[torch.optim.Optimizer]:
    """``None``, one optimizer or a sequence of them → a list; ``TypeError`` otherwise."""
    if optimizer is None:
        return []
    items = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else optimizer
    try:
        out = list(items)  # type: ignore[call-overload]
    except TypeError:
        out = [optimizer]
    checked: list[torch.optim.Optimizer] = []
    for item in out:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer or a list of them, "
                f"got {type(item).__name__}"
            )
        checked.append(item)
    return checked


class OptimizerHooks:
    """Times ``step()`` and ``zero_grad()`` of some optimizers and calls ``on_step`` after
    the last one's step (the end of an iteration)."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        on_step: Callable[[], object],
        *,
        clock: object = None,
    ) -> None:
        self.skipped_steps = 0
        self._region = region_for("optimizer", clock)
        self._on_step = on_step
        self._ticker = optimizers[-1] if optimizers else None
        self._scaled = False  # inside GradScaler.step: that wrapper times and ticks
        self._stepped = False
        self._undo: list[Callable[[], None]] = []
        zero_grad = region_for("zero_grad", clock)
        for opt in optimizers:
            if opt in _tracked:
                raise RuntimeError(
                    f"instrument.auto is already timing this {type(opt).__name__}; "
                    "call remove() on the first handle before installing again"
                )
            _tracked[opt] = self
            self._undo.append(opt.register_step_pre_hook(self._pre).remove)
            self._undo.append(opt.register_step_post_hook(self._post).remove)
            self._undo.append(_patch_zero_grad(opt, decorate(opt.zero_grad, zero_grad)))
            self._undo.append(_forget(opt))
        if optimizers:
            self._undo.append(patches.patch(torch.amp.GradScaler, "step", _make_scaler_step))

    def _pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._scaled or compiling():
            return
        if _get()[3] is self._region:  # a step that raised never ran its post hook
            abandon(self._region)
        self._region.__enter__()

    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._scaled:
            self._stepped = True
            return
        if compiling():
            return
        self._region.__exit__(None, None, None)
        if optimizer is self._ticker:
            self._on_step()

    def scaler_step(
        self, optimizer: torch.optim.Optimizer, call: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        """``GradScaler.step(optimizer)``: time it whole; end the iteration even if skipped."""
        if self._scaled or _get()[3] is self._region:
            return call(*args, **kwargs)
        self._scaled, self._stepped = True, False
        try:
            with self._region:
                result = call(*args, **kwargs)
        finally:
            self._scaled = False
        if not self._stepped:
            self.skipped_steps += 1
        if optimizer is self._ticker:
            self._on_step()
        return result

    def remove(self) -> None:
        """Take every hook and patch off (idempotent)."""
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()


def _forget(opt: torch.optim.Optimizer) -> Callable[[], None]:
    """The undo that forgets ``opt`` in the GradScaler lookup."""

    def forget() -> None:
        _tracked.pop(opt, None)

    return forget


def _patch_zero_grad(opt: torch.optim.Optimizer, timed_zero_grad: Any) -> Callable[[], None]:
    """Put a timed ``zero_grad`` on this optimizer instance; the undo restores what was there."""
    had = "zero_grad" in opt.__dict__
    before = opt.__dict__.get("zero_grad")
    opt.__dict__["zero_grad"] = timed_zero_grad

    def undo() -> None:
        if opt.__dict__.get("zero_grad") is not timed_zero_grad:
            return
        if had:
            opt.__dict__["zero_grad"] = before
        else:
            del opt.__dict__["zero_grad"]

    return undo


def _make_scaler_step(original: Callable[..., Any]) -> Any:
    def scaler_step(wrapped: Callable[..., Any], scaler: Any, args: Any, kwargs: Any) -> Any:
        optimizer = args[0] if args else kwargs.get("optimizer")
        hooks = _tracked.get(optimizer) if optimizer is not None else None
        if hooks is None or compiling():
            return wrapped(*args, **kwargs)
        return hooks.scaler_step(optimizer, wrapped, args, kwargs)

    return wrapt.FunctionWrapper(original, scaler_step)
