"""``instrument.auto(model, optimizer)``: one line that times a whole training loop."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from instrument import clocks, config, throughput
from instrument.hooks import backward as backward_hooks
from instrument.hooks import data as data_hooks
from instrument.hooks import modules as module_hooks
from instrument.hooks import optim as optim_hooks
from instrument.region import check_level
from instrument.reporter import Reporter
from instrument.sinks.console import Console

_installed: weakref.WeakKeyDictionary[nn.Module, AutoHandle] = weakref.WeakKeyDictionary()


class FlopMeter:
    """Ticks the reporter, and counts the FLOPs of the second step (between the first and
    second ticks) into ``reporter.flops_per_step``."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter
        self._ticks = 0
        self._counter: contextlib.AbstractContextManager[list[float]] | None = None
        self._total: list[float] = []

    def step(self) -> None:
        """End a step: start counting after the first, stop after the second."""
        self._ticks += 1
        if self._ticks == 2:
            self._stop()
            if self._total:
                self._reporter.flops_per_step = self._total[0]
        self._reporter.step()
        if self._ticks == 1:
            self._counter = throughput.count_flops()
            self._total = self._counter.__enter__()

    def _stop(self) -> None:
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)

    def cancel(self) -> None:
        """Stop counting (``remove()`` before the second step ended)."""
        self._stop()


def installed_handles() -> tuple[AutoHandle, ...]:
    """The handles of every ``auto()`` not yet removed."""
    return tuple(_installed.values())


class AutoHandle:
    """What :func:`auto` installed: ``reporter``, ``remove()``, and a context manager.

    ``remove()`` takes off every hook and patch and, if ``auto`` made the reporter, closes
    it: one last report of the steps since the last one (without optimizers: of whatever
    was recorded). It is idempotent.
    """

    def __init__(self, model: nn.Module, reporter: Reporter, owns_reporter: bool) -> None:
        self.reporter = reporter
        self._model = weakref.ref(model)
        self._owns_reporter = owns_reporter
        self._undo: list[Callable[[], None]] = []
        self._optimizer_hooks: optim_hooks.OptimizerHooks | None = None
        self._removed = False

    @property
    def model(self) -> nn.Module | None:
        """The instrumented model (held weakly)."""
        return self._model()

    @property
    def removed(self) -> bool:
        """True after :meth:`remove`."""
        return self._removed

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps a ``GradScaler`` skipped (inf/NaN gradients) so far."""
        hooks = self._optimizer_hooks
        return 0 if hooks is None else hooks.skipped_steps

    def remove(self) -> None:
        """Undo everything :func:`auto` did (idempotent)."""
        if self._removed:
            return
        self._removed = True
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
        model = self._model()
        if model is not None and _installed.get(model) is self:
            del _installed[model]
        if self._owns_reporter:
            # what follows the last optimizer step (its zero_grad) is not an iteration
            hooks = self._optimizer_hooks
            self.reporter.close(flush=hooks is None or self.reporter.steps > 0)

    def __enter__(self) -> AutoHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self._removed else "installed"
        model = self._model()
        name = type(model).__name__ if model is not None else "<gone>"
        return f"<AutoHandle {name} {state}>"


def auto(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    *,
    every: int | None = 50,
    depth: int | None = None,
    include: str | type | Iterable[str | type] | None = None,
    exclude: str | type | Iterable[str | type] | None = None,
    backward: bool | str = True,
    collectives: bool = True,
    dataloader: Iterable[Any] | None = None,
    clock: object = "auto",
    sinks: Iterable[Any] | None = None,
    reporter: Reporter | None = None,
    normalizer: float | str = "steps",
    flops_per_step: float | str | None = None,
    ranks: str = "local",
) -> AutoHandle:
    """Time every module, backward, the optimizer step, data loading and collectives.

    Every ``every`` optimizer steps a tree of where the steps' time went goes to the sinks
    (the console by default): ``forward`` and its modules, ``backward``, ``optimizer``,
    ``zero_grad``, ``data``, collectives, and ``(other)`` for what no region covered.

    Args:
        model: The model; DDP, FSDP and ``torch.compile`` wrappers are seen through.
        optimizer: One optimizer or a list; each step of the last one ends an iteration.
        every: Steps between reports (``None``: only ``handle.reporter.flush()``).
        depth: Module levels timed below ``forward`` (``None``: all, 0: only ``forward``).
        include: Glob patterns on dotted module names (``"encoder.*"``) or module types; only
            matching modules (and what is below them) are timed.
        exclude: The same, for modules (and what is below them) to leave out.
        backward: ``True`` times ``backward()``; ``"modules"`` also times each module's
            backward (full backward hooks; see the docs for the caveats); ``False`` neither.
        collectives: Time ``torch.distributed`` collectives and DDP's gradient all-reduce.
        dataloader: A loader (or iterable object) to time ``next()`` on, in place.
        clock: "auto" follows ``instrument.configure(clock=...)``; "cpu", "cuda", "sync".
        sinks: Sinks for the reporter ``auto`` makes (default: the console).
        reporter: Use this reporter instead of making one (then ``every``, ``sinks`` and
            ``normalizer`` must be left alone); ``remove()`` does not close it.
        normalizer: The made reporter's normalizer; "steps" reports times per step.
        flops_per_step: FLOPs of one step on this device for TFLOP/s and MFU, or "auto":
            counted once, on the second optimizer step, with ``FlopCounterMode`` (that step
            runs slower; it is a warm-up step by default). A passed ``reporter`` whose
            ``flops_per_step`` is "auto" is measured the same way.
        ranks: The made reporter's ``ranks``: "max", "minmax" or "all" add each region's
            min, max and slowest rank across the process group (every rank reports at the
            same steps, so the collective flush lines up).

    Raises:
        RuntimeError: ``auto`` is already installed on this model (remove that first).

    Example:
        >>> handle = instrument.auto(model, optimizer, every=10)
        >>> for batch in loader:
        ...     loss = model(batch).sum(); loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> handle.remove()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto() needs an nn.Module, got {type(model).__name__}")
    optimizers = optim_hooks.check_optimizers(optimizer)
    if depth is not None:
        check_level(depth)
    if not (backward is True or backward is False or backward == "modules"):
        raise ValueError(f"unknown backward {backward!r}; expected one of True, False, 'modules'")
    clocks.check_clock(clock)
    region_clock = None if clock == "auto" else clock
    changed = (
        sinks is not None
        or every != 50
        or normalizer != "steps"
        or flops_per_step is not None
        or ranks != "local"
    )
    if reporter is not None and changed:
        raise ValueError(
            "pass either reporter= or every=/sinks=/normalizer=/flops_per_step=/ranks= (they "
            "configure the reporter auto() makes), not both"
        )
    for module in (model, module_hooks.held_module(model)):
        if module is not None and module in _installed:
            raise RuntimeError(
                f"instrument.auto is already installed on this {type(model).__name__}; "
                "call remove() on the first handle (or leave its with-block) first"
            )

    owns = reporter is None
    if reporter is None:
        reporter = Reporter(
            every=every,
            sinks=[Console()] if sinks is None else sinks,
            normalizer=normalizer,
            flops_per_step=flops_per_step,
            ranks=ranks,
        )
    config.refresh_auto_clock()
    handle = AutoHandle(model, reporter, owns)
    try:
        _install(
            handle,
            model,
            optimizers,
            targets=module_hooks.plan(model, depth=depth, include=include, exclude=exclude),
            backward=backward,
            collectives=collectives,
            dataloader=dataloader,
            clock=region_clock,
        )
    except BaseException:
        handle.remove()
        raise
    _installed[model] = handle
    return handle


def _install(
    handle: AutoHandle,
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    *,
    targets: list[module_hooks.Target],
    backward: bool | str,
    collectives: bool,
    dataloader: Iterable[Any] | None,
    clock: object,
) -> None:
    undo = handle._undo
    modules = module_hooks.ModuleHooks(
        targets,
        clock=clock,
        backward_modules=backward == "modules",
        backward_anchor=backward_hooks.anchor,
    )
    undo.append(modules.remove)
    if backward:
        undo.append(backward_hooks.install(clock))
    if optimizers:
        tick: Callable[[], object] = handle.reporter.step
        if handle.reporter.flops_per_step == "auto":
            meter = FlopMeter(handle.reporter)
            undo.append(meter.cancel)
            tick = meter.step
        hooks = optim_hooks.OptimizerHooks(optimizers, tick, clock=clock)
        handle._optimizer_hooks = hooks
        undo.append(hooks.remove)
    if dataloader is not None:
        undo.append(data_hooks.time_in_place(dataloader, clock=clock))
    if collectives:
        from instrument.hooks import collectives as collective_hooks

        undo.append(collective_hooks.install())
        collective_hooks.anchor = backward_hooks.anchor
        collective_hooks.hook_ddp(model)
