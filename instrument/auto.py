"""``instrument.auto(model, optimizer)``: one line that times a whole training loop."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from instrument import _state, config, registry, throughput
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
from instrument.options import DEFAULTS, AutoOptions
from instrument.reporter import Reporter
from instrument.throughput import BatchCounter

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
    every: int | None = DEFAULTS.every,
    depth: int | None = DEFAULTS.depth,
    include: str | type | Iterable[str | type] | None = DEFAULTS.include,
    exclude: str | type | Iterable[str | type] | None = DEFAULTS.exclude,
    backward: bool | str = DEFAULTS.backward,
    collectives: bool = DEFAULTS.collectives,
    dataloader: Iterable[Any] | None = None,
    lr_scheduler: object = None,
    count_batch: BatchCounter | str | None = None,
    clock: object = DEFAULTS.clock,
    sinks: Iterable[Any] | None = DEFAULTS.sinks,
    reporter: Reporter | None = DEFAULTS.reporter,
    normalizer: float | str = DEFAULTS.normalizer,
    flops_per_step: float | str | None = DEFAULTS.flops_per_step,
    peak_flops: float | None = DEFAULTS.peak_flops,
    ranks: str = DEFAULTS.ranks,
    diagnose: bool | Thresholds = DEFAULTS.diagnose,
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
        count_batch: Counts the samples and tokens of each batch ``dataloader`` yields into
            the current step, for throughput: a function returning ``(samples, tokens)``
            (either may be None), or "auto" (:func:`instrument.throughput.batch_counts`:
            the batch's first dimension, and ``input_ids``' elements).
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
        ranks: The made reporter's ``ranks``: "minmax" or "all" add each region's min, max
            and slowest rank across the process group (every rank reports at the same
            steps, so the collective flush lines up).
        diagnose: The made reporter's ``diagnose``: a verdict and findings in every report
            and a summary at the end (docs/diagnosis.md); a ``Thresholds`` sets the rules'
            thresholds, ``False`` turns it off.

    The options from ``every`` on except ``dataloader``, ``lr_scheduler`` and
    ``count_batch`` are :class:`instrument.options.AutoOptions`, which the integrations take
    too.

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
    check_model(model)
    options = AutoOptions(
        every=every,
        depth=depth,
        include=include,
        exclude=exclude,
        backward=backward,
        collectives=collectives,
        clock=clock,
        sinks=sinks,
        reporter=reporter,
        normalizer=normalizer,
        flops_per_step=flops_per_step,
        peak_flops=peak_flops,
        ranks=ranks,
        diagnose=diagnose,
    )
    loop = Loop(dataloader, lr_scheduler, count_batch)
    return auto_with(model, optimizer, options, loop)


def check_count_batch(counter: object) -> BatchCounter | str | None:
    """``count_batch`` checked: ``"auto"``, None, or a function of the batch."""
    if counter is not None and counter != "auto" and not callable(counter):
        raise TypeError(
            "count_batch must be 'auto', None, or a function of the batch returning "
            f"(samples, tokens), got {counter!r}"
        )
    return counter


@dataclasses.dataclass(frozen=True)
class Loop:
    """What of the training loop ``auto`` times besides the model and optimizers: the
    ``dataloader`` (its batches counted by ``count_batch``) and the ``lr_scheduler``."""

    dataloader: Iterable[Any] | None = None
    lr_scheduler: object = None
    count_batch: BatchCounter | str | None = None

    def __post_init__(self) -> None:
        counter = check_count_batch(self.count_batch)
        if self.dataloader is None and callable(counter):
            raise ValueError("count_batch= counts the batches of dataloader=; pass the loader too")

    def counter(self) -> BatchCounter | None:
        """The batch counter (``"auto"`` resolved), or None."""
        if self.count_batch == "auto":
            return throughput.batch_counts
        return self.count_batch if callable(self.count_batch) else None


@dataclasses.dataclass(frozen=True)
class Training:
    """What ``auto`` times, resolved: the model, the optimizers (each as given and the real
    one behind a wrapper), and whether the model is a DeepSpeed engine."""

    model: nn.Module
    given: list[tuple[object, torch.optim.Optimizer]]
    engine: bool

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The real optimizers, in order (each step of the last one ends an iteration)."""
        return [inner for _, inner in self.given]


def auto_with(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
    options: AutoOptions,
    loop: Loop | None = None,
) -> AutoHandle:
    """:func:`auto` with its options as one :class:`AutoOptions` (what the integrations
    call): resolve what to time, choose the hooks, install them, hand back the handle."""
    check_model(model)
    training = resolve(model, optimizer)
    _check_not_instrumented(model)
    targets = module_hooks.plan(
        model, depth=options.depth, include=options.include, exclude=options.exclude
    )
    owns = options.reporter is None
    reporter = options.make_reporter() if options.reporter is None else options.reporter
    config.refresh_auto_clock()
    handle = AutoHandle(model, reporter, owns)
    try:
        install(handle, training, targets, options, loop or Loop())
    except BaseException:
        handle.remove()
        raise
    _installed[model] = handle
    return handle


def check_model(model: object) -> None:
    """``TypeError`` unless ``model`` is an eager ``nn.Module`` (hooks run on it)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto() needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            f"auto() cannot hook a TorchScript module ({type(model).__name__}): TorchScript "
            "runs no Python hooks. Call auto() on the eager module before torch.jit.script, "
            "or time the scripted call with `with instrument.timed('forward'):`"
        )


def resolve(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
) -> Training:
    """The model and optimizers to time: a DeepSpeed engine steps the optimizer it holds
    (``optimizer=None``), and optimizer wrappers are seen through."""
    engine = deepspeed_hooks.is_engine(model)
    if optimizer is None and engine:
        optimizer = deepspeed_hooks.engine_optimizer(model)
    return Training(model, optim_hooks.given_optimizers(optimizer), engine)


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
        found = module_hooks.timing_region(module)
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
            f"{found.name!r}); remove() that handle first, or keep the one on the whole "
            "model (its tree already shows every submodule)"
        )


def install(
    handle: AutoHandle,
    training: Training,
    targets: list[module_hooks.Target],
    options: AutoOptions,
    loop: Loop,
) -> None:
    """Install every hook ``options`` ask for; each one's undo goes on ``handle``."""
    clock = options.region_clock
    _hook_model(handle, training, targets, options.backward, clock)
    if training.optimizers:
        _hook_optimizers(handle, training, targets, clock)
    _hook_loop(handle, loop, clock)
    if options.collectives:
        _hook_collectives(handle, training.model)
    handle._undo.append(
        hook_cost.count(
            targets,
            options.backward,
            training.optimizers,
            loop.lr_scheduler,
            loop.dataloader,
            options.collectives,
        )
    )


def _hook_model(
    handle: AutoHandle,
    training: Training,
    targets: list[module_hooks.Target],
    backward: bool | str,
    clock: object,
) -> None:
    """The modules' forwards (and backwards), ``zero_grad``, ``backward`` and recompute."""
    undo, model = handle._undo, training.model
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
        if training.engine and callable(getattr(model, "backward", None)):
            undo.append(backward_hooks.time_method(model, "backward", clock))


def _hook_optimizers(
    handle: AutoHandle,
    training: Training,
    targets: list[module_hooks.Target],
    clock: object,
) -> None:
    """``optimizer`` and ``clip_grad_norm``; the last optimizer's step ends each step (and
    counts the FLOPs of one with ``flops_per_step="auto"``)."""
    undo, reporter, optimizers = handle._undo, handle.reporter, training.optimizers
    undo.append(training_hooks.time_clipping(clock))
    tick: Callable[[], object] = reporter.end_step
    if reporter.flops_per_step == "auto":
        meter = FlopMeter(reporter)
        undo.append(meter.cancel)
        tick = meter.step
    hooks = optim_hooks.OptimizerHooks(optimizers, tick, clock=clock, wrappers=training.given)
    check = ForwardCheck(
        tick, [t.name for t in targets], done=_hand_over(hooks), model=training.model
    )
    hooks.on_step = check.step
    handle._optimizer_hooks = hooks
    reporter.ticked_by_optimizer = True
    undo.append(hooks.remove)
    model = training.model
    if training.engine and callable(getattr(model, "step", None)):
        undo.append(deepspeed_hooks.time_step(model, hooks, optimizers[-1]))


def _hook_loop(handle: AutoHandle, loop: Loop, clock: object) -> None:
    """``lr_scheduler`` and ``data`` (counting each batch's samples and tokens)."""
    if loop.lr_scheduler is not None:
        handle._undo.append(training_hooks.time_scheduler(loop.lr_scheduler, clock))
    if loop.dataloader is not None:
        counter = loop.counter()
        on_batch = None if counter is None else _count(handle.reporter, counter)
        handle._undo.append(
            data_hooks.time_in_place(loop.dataloader, clock=clock, on_batch=on_batch)
        )


def _hook_collectives(handle: AutoHandle, model: nn.Module) -> None:
    """``torch.distributed`` collectives and DDP's gradient all-reduce."""
    from instrument.hooks import collectives as collective_hooks

    handle._undo.append(collective_hooks.install())
    collective_hooks.anchor = backward_hooks.anchor
    if not collective_hooks.hook_ddp(model):  # a DDP made around the model, maybe
        handle._undo.append(collective_hooks.hook_enclosing_ddp(model))


def _hand_over(hooks: optim_hooks.OptimizerHooks) -> Callable[[Callable[[], object]], None]:
    """What :class:`ForwardCheck` calls once it is done: its tick takes its place."""

    def done(tick: Callable[[], object]) -> None:
        hooks.on_step = tick

    return done


def _count(reporter: Reporter, count_batch: BatchCounter) -> Callable[[Any], None]:
    def on_batch(batch: Any) -> None:
        samples, tokens = count_batch(batch)
        reporter.count_into_step(samples, tokens)

    return on_batch
