"""``instrument.auto(model, optimizer)``: one line that times a whole training loop."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from instrument import _state, clocks, config, registry, throughput
from instrument._warn import warn_once
from instrument.diagnosis import Thresholds
from instrument.hooks import backward as backward_hooks
from instrument.hooks import checkpoint as checkpoint_hooks
from instrument.hooks import cost as hook_cost
from instrument.hooks import data as data_hooks
from instrument.hooks import deepspeed as deepspeed_hooks
from instrument.hooks import modules as module_hooks
from instrument.hooks import optim as optim_hooks
from instrument.hooks import training as training_hooks
from instrument.regions.region import check_level
from instrument.reporter import Reporter

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


#: The one-time warning that the model's forward was never timed (an integration that knows
#: why warns under this key first, with its own advice).
FORWARD_UNSEEN = "auto:forward-unseen"


class ForwardCheck:
    """Ticks through to ``tick``; at the second tick, if no region of the model's modules
    (``names``: its ``forward`` and its submodules', since a LightningModule's
    ``training_step`` may call ``self.net(x)`` alone) has recorded yet, warns once: the model
    runs where instrument cannot see it (inside a function compiled by ``torch.compile``, or
    another module than the one passed). Once it has decided, it calls ``done(tick)``, which
    puts ``tick`` in its place (the later steps pay nothing for the check)."""

    def __init__(
        self,
        tick: Callable[[], object],
        names: Iterable[str],
        done: Callable[[Callable[[], object]], None] = lambda tick: None,
        model: nn.Module | None = None,
    ) -> None:
        self._tick = tick
        self._names = frozenset(names)
        self._done = done
        self._model = None if model is None else weakref.ref(model)
        self._ticks = 0
        self._seen = False

    def step(self) -> None:
        """One optimizer step ended (steps taken while instrument is disabled, when no
        region records, do not count)."""
        if not self._seen and _state.enabled:
            self._ticks += 1
            self._seen = any(
                node.name in self._names and node.has_records() for node in registry.walk()
            )
            if self._seen:
                self._done(self._tick)
            elif self._ticks >= 2:
                self._seen = True
                self._done(self._tick)
                model = None if self._model is None else self._model()
                if model is not None and module_hooks.compiled_over_timing(model):
                    why = (
                        "Its forward was replaced by torch.compile(model.forward) after auto(): "
                        "the compiled function traces through instrument's timed forward. "
                        "Compile the model itself instead (model.compile() or "
                        "torch.compile(model), before or after auto)"
                    )
                else:
                    why = (
                        "The model is probably called inside a function compiled with "
                        "torch.compile (torch.compile(train_step)), which instrument cannot "
                        "see into: compile the model itself instead (torch.compile(model) or "
                        "model.compile(), before or after auto), or pass auto() the module "
                        "the loop really calls"
                    )
                warn_once(
                    FORWARD_UNSEEN,
                    "instrument.auto: the model's forward was not timed in the first "
                    f"optimizer steps, so it is in '(other)'. {why}",
                    stacklevel=None,  # the loop's optimizer.step()
                )
        self._tick()


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

    def remove(self, *, local: bool = False) -> None:
        """Undo everything :func:`auto` did (idempotent). ``local``: the last flush of the
        reporter ``auto`` made waits for no other rank (see :meth:`Reporter.close`); leaving
        a ``with`` block on an exception removes this way."""
        if self._removed:
            return
        self._removed = True
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
        model = self._model()
        if model is not None and _installed.get(model) is self:
            del _installed[model]
        self.reporter.ticked_by_optimizer = False
        if self._owns_reporter:
            # what follows the last optimizer step (its zero_grad) is not an iteration:
            # without a step to report it is dropped, so nothing is left in the registry
            hooks = self._optimizer_hooks
            flush = hooks is None or self.reporter.steps > 0
            self.reporter.close(flush=flush, local=local)
            if not flush:
                registry.collect()

    def __enter__(self) -> AutoHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove(local=exc_type is not None)  # on an error, other ranks may be gone

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
    lr_scheduler: object = None,
    count_batch: Callable[[Any], tuple[int | None, int | None]] | None = None,
    clock: object = "auto",
    sinks: Iterable[Any] | None = None,
    reporter: Reporter | None = None,
    normalizer: float | str = "steps",
    flops_per_step: float | str | None = None,
    peak_flops: float | None = None,
    ranks: str = "local",
    diagnose: bool | Thresholds = True,
) -> AutoHandle:
    """Time every module, backward, the optimizer step, data loading and collectives.

    Every ``every`` optimizer steps a tree of where the steps' time went goes to the sinks
    (the console by default): ``forward`` and its modules, ``backward``, ``optimizer``,
    ``zero_grad`` (the optimizer's and ``model.zero_grad()``), ``clip_grad_norm``, ``data``,
    ``lr_scheduler``, collectives, ``backward/recompute/...`` for activation checkpointing,
    and ``(other)`` for what no region covered. ``optimizer.step(closure)`` is timed like a
    plain loop: the closure's regions where a loop puts them, ``optimizer`` the update alone.

    Args:
        model: The model; DDP, FSDP and ``torch.compile`` wrappers are seen through, and
            compiling it (or a block) after ``auto`` keeps its region.
        optimizer: One optimizer or a list; each step of the last one ends an iteration.
            Wrappers holding the real optimizer as ``.optimizer`` (Accelerate's
            ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) are seen through.
            For a DeepSpeed engine, ``None`` is the engine's optimizer, and the engine's
            ``backward()`` and boundary ``step()`` are the ``backward`` and ``optimizer``
            regions (:mod:`instrument.hooks.deepspeed`).
        every: Steps between reports (``None``: only ``handle.reporter.flush()``).
        depth: Module levels timed below ``forward`` (``None``: all, 0: only ``forward``).
        include: Glob patterns on dotted module names (``"encoder.*"``) or module types; only
            matching modules (and what is below them) are timed.
        exclude: The same, for modules (and what is below them) to leave out.
        backward: ``True`` times ``backward()``; ``"modules"`` also times each module's
            backward (full backward hooks; see the docs for the caveats); ``False`` neither.
        collectives: Time ``torch.distributed`` collectives and DDP's gradient all-reduce.
        dataloader: A loader (or iterable object) to time ``next()`` on, in place
            (Accelerate's ``DataLoaderShard`` / ``DataLoaderDispatcher`` too).
        lr_scheduler: A scheduler whose ``step()`` is timed as ``lr_scheduler``.
        count_batch: Called with each batch ``dataloader`` yields; returns ``(samples,
            tokens)`` (either may be None), added to the current step for throughput.
        clock: "auto" follows ``instrument.configure(clock=...)``; "cpu", "cuda", "sync".
        sinks: Sinks for the reporter ``auto`` makes (default: the console).
        reporter: Use this reporter instead of making one (then ``every``, ``sinks`` and
            ``normalizer`` must be left alone); ``remove()`` does not close it.
        normalizer: The made reporter's normalizer; "steps" reports times per step.
        flops_per_step: FLOPs of one step on this device for TFLOP/s and MFU, or "auto":
            counted once, on the second optimizer step, with ``FlopCounterMode`` (that step
            runs slower; it is a warm-up step by default). A passed ``reporter`` whose
            ``flops_per_step`` is "auto" is measured the same way.
        peak_flops: The device's peak FLOP/s for MFU (default: looked up for CUDA devices).
        ranks: The made reporter's ``ranks``: "max", "minmax" or "all" add each region's
            min, max and slowest rank across the process group (every rank reports at the
            same steps, so the collective flush lines up).
        diagnose: The made reporter's ``diagnose``: a verdict and findings in every report
            and a summary at the end (docs/diagnosis.md); a ``Thresholds`` sets the rules'
            thresholds, ``False`` turns it off.

    Raises:
        RuntimeError: ``auto`` is already installed on this model, on a model it is part
            of, or on one of its submodules (remove that first).
        TypeError: ``model`` is not an ``nn.Module``, or is a TorchScript module.

    Example:
        >>> handle = instrument.auto(model, optimizer, every=10)
        >>> for batch in loader:
        ...     loss = model(batch).sum(); loss.backward(); optimizer.step(); optimizer.zero_grad()
        >>> handle.remove()
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto() needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            f"auto() cannot hook a TorchScript module ({type(model).__name__}): TorchScript "
            "runs no Python hooks. Call auto() on the eager module before torch.jit.script, "
            "or time the scripted call with `with instrument.timed('forward'):`"
        )
    engine = deepspeed_hooks.is_engine(model)
    if optimizer is None and engine:  # a DeepSpeed engine steps the optimizer it holds
        optimizer = deepspeed_hooks.engine_optimizer(model)
    given = optim_hooks.given_optimizers(optimizer)
    optimizers = [inner for _, inner in given]
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
        or peak_flops is not None
        or ranks != "local"
        or diagnose is not True
    )
    if reporter is not None and changed:
        raise ValueError(
            "pass either reporter= or every=/sinks=/normalizer=/flops_per_step=/peak_flops=/"
            "ranks=/diagnose= (they configure the reporter auto() makes), not both"
        )
    _check_not_instrumented(model)

    owns = reporter is None
    if reporter is None:
        reporter = Reporter(
            every=every,
            sinks=sinks,
            normalizer=normalizer,
            flops_per_step=flops_per_step,
            peak_flops=peak_flops,
            ranks=ranks,
            diagnose=diagnose,
        )
    config.refresh_auto_clock()
    handle = AutoHandle(model, reporter, owns)
    try:
        _install(
            handle,
            model,
            optimizers,
            given=given,
            targets=module_hooks.plan(model, depth=depth, include=include, exclude=exclude),
            backward=backward,
            collectives=collectives,
            dataloader=dataloader,
            lr_scheduler=lr_scheduler,
            count_batch=count_batch,
            clock=region_clock,
            engine=engine,
        )
    except BaseException:
        handle.remove()
        raise
    _installed[model] = handle
    return handle


def _check_not_instrumented(model: nn.Module) -> None:
    """``RuntimeError`` if ``auto`` already times ``model``, a model it is part of, or one
    of its submodules (two handles would nest regions twice: ``forward/forward/...``)."""
    for module in (model, module_hooks.held_module(model)):
        if module is not None and module in _installed:
            raise RuntimeError(
                f"instrument.auto is already installed on this {type(model).__name__}; "
                "call remove() on the first handle (or leave its with-block) first"
            )
    for name, module in model.named_modules():
        found = module_hooks._timed.get(module)
        if found is None:
            continue
        where = (
            "this module is part of a model"
            if module is model
            else f"its submodule {name!r} is already timed by"
        )
        raise RuntimeError(
            f"instrument.auto cannot time this {type(model).__name__}: {where} another "
            "instrument.auto handle (its region is "
            f"{found[0].name!r}); remove() that handle first, or keep the one on the whole "
            "model (its tree already shows every submodule)"
        )


def _hand_over(hooks: optim_hooks.OptimizerHooks) -> Callable[[Callable[[], object]], None]:
    """What :class:`ForwardCheck` calls once it is done: its tick takes its place."""

    def done(tick: Callable[[], object]) -> None:
        hooks.on_step = tick

    return done


def _count(reporter: Reporter, count_batch: Callable[[Any], Any]) -> Callable[[Any], None]:
    def on_batch(batch: Any) -> None:
        samples, tokens = count_batch(batch)
        reporter.count(samples=samples, tokens=tokens)

    return on_batch


def _install(
    handle: AutoHandle,
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    *,
    given: list[tuple[object, torch.optim.Optimizer]],
    targets: list[module_hooks.Target],
    backward: bool | str,
    collectives: bool,
    dataloader: Iterable[Any] | None,
    lr_scheduler: object,
    count_batch: Callable[[Any], Any] | None,
    clock: object,
    engine: bool,
) -> None:
    undo = handle._undo
    modules = module_hooks.ModuleHooks(
        targets,
        clock=clock,
        backward_modules=backward == "modules",
        backward_anchor=backward_hooks.anchor,
    )
    undo.append(modules.remove)
    modules.watch_compile()
    undo.append(training_hooks.time_model_zero_grad(model, clock))
    if backward:
        undo.append(backward_hooks.install(clock))
        undo.append(checkpoint_hooks.install(backward_hooks.anchor))
        if engine and callable(getattr(model, "backward", None)):
            undo.append(backward_hooks.time_method(model, "backward", clock))
    if optimizers:
        undo.append(training_hooks.time_clipping(clock))
        tick: Callable[[], object] = handle.reporter.end_step
        if handle.reporter.flops_per_step == "auto":
            meter = FlopMeter(handle.reporter)
            undo.append(meter.cancel)
            tick = meter.step
        hooks = optim_hooks.OptimizerHooks(optimizers, tick, clock=clock, wrappers=given)
        check = ForwardCheck(tick, [t.name for t in targets], done=_hand_over(hooks), model=model)
        hooks.on_step = check.step
        handle._optimizer_hooks = hooks
        handle.reporter.ticked_by_optimizer = True
        undo.append(hooks.remove)
        if engine and callable(getattr(model, "step", None)):
            undo.append(deepspeed_hooks.time_step(model, hooks, optimizers[-1]))
    if lr_scheduler is not None:
        undo.append(training_hooks.time_scheduler(lr_scheduler, clock))
    if dataloader is not None:
        on_batch = None if count_batch is None else _count(handle.reporter, count_batch)
        undo.append(data_hooks.time_in_place(dataloader, clock=clock, on_batch=on_batch))
    elif count_batch is not None:
        raise ValueError("count_batch= counts the batches of dataloader=; pass the loader too")
    if collectives:
        from instrument.hooks import collectives as collective_hooks

        undo.append(collective_hooks.install())
        collective_hooks.anchor = backward_hooks.anchor
        if not collective_hooks.hook_ddp(model):  # a DDP made around the model, maybe
            undo.append(collective_hooks.hook_enclosing_ddp(model))
    undo.append(
        hook_cost.count(targets, backward, optimizers, lr_scheduler, dataloader, collectives)
    )
