"""HF transformers: ``Trainer(..., callbacks=[InstrumentCallback()])``.

The callback calls :func:`instrument.auto` when training begins, on the objects the
Trainer really uses: the model (a ``torch.compile`` wrapper, ``torch_compile=True``, keeps
it timed as ``forward``), the optimizer behind Accelerate's ``AcceleratedOptimizer``, the
prepared train loader (``data``, and samples/tokens counted from its batches), and the LR
scheduler. ``model.zero_grad()``, gradient clipping, activation-checkpoint recomputation
and collectives get their own lines; an evaluation during training (``eval_strategy``)
is one ``evaluate`` region, with its forwards below it (``evaluate/forward/...``), never
mixed into training's ``forward``, and a checkpoint save one ``checkpoint`` region. One
report interval is ``every`` optimizer steps (gradient accumulation counted once per
optimizer step), and each report's figures are
added to the Trainer's next ``logs`` (``on_log``), so its log history and every
``report_to`` backend receive them. Training end removes everything.

Example:
    >>> from instrument.integrations.transformers import InstrumentCallback
    >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[InstrumentCallback()])
    >>> trainer.train()     # a timing tree every `logging_steps` optimizer steps
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from instrument._warn import deprecated, warn_once
from instrument.auto import AutoHandle, Loop, auto_with, check_count_batch
from instrument.diagnosis import Thresholds
from instrument.hooks import data as data_hooks
from instrument.hooks import patches
from instrument.hooks.collectives import hook_ddp
from instrument.integrations.figures import LOG_MODES, figures
from instrument.options import DEFAULTS, AutoOptions
from instrument.regions.region import Region, region_for
from instrument.report import Report
from instrument.reporter import Reporter
from instrument.sinks.console import Console
from instrument.throughput import BatchCounter


def count_batch(batch: Any) -> tuple[int | None, int | None]:
    """Samples and tokens of one HF batch: ``input_ids``' rows and elements (padding
    included, like ``include_num_input_tokens_seen="all"``; reading shapes never waits for
    the device). A tensor batch gives its rows; anything else counts nothing."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else batch
    if isinstance(ids, torch.Tensor) and ids.dim() > 0:
        return int(ids.shape[0]), int(ids.numel()) if ids.dim() > 1 else None
    return None, None


class InstrumentCallback(TrainerCallback):
    """Times HF ``Trainer.train()`` with :func:`instrument.auto` (see the module doc).

    Args:
        every: Optimizer steps per report; ``None``: the Trainer's ``logging_steps`` when
            logging by steps (so each log gets a fresh report), else 50.
        depth, include, exclude, backward, collectives, clock, sinks, reporter,
            normalizer, flops_per_step, peak_flops, ranks, diagnose: As for
            :func:`instrument.auto` (:class:`instrument.options.AutoOptions`: the same names
            and defaults). A given ``reporter`` also feeds the Trainer's logs and is not
            closed at the end.
        count_batch: ``"auto"`` counts samples and tokens from each batch's ``input_ids``
            (:func:`count_batch`); a function ``batch -> (samples, tokens)``; or None.
        log: Add each report's figures to the Trainer's logs: "compact" (region times down
            to ``log_depth``, step time, throughput), "all" (every scalar) or "none".
        log_depth: Path levels logged in "compact" mode.
        count_tokens: Deprecated: ``False`` is ``count_batch=None``.

    Distributed: construct it on every rank; with ``ranks`` other than "local" each flush
    is collective, and every rank flushes at the same optimizer steps.
    """

    def __init__(
        self,
        every: int | None = None,
        *,
        depth: int | None = DEFAULTS.depth,
        include: str | type | Iterable[str | type] | None = DEFAULTS.include,
        exclude: str | type | Iterable[str | type] | None = DEFAULTS.exclude,
        backward: bool | str = DEFAULTS.backward,
        collectives: bool = DEFAULTS.collectives,
        clock: object = DEFAULTS.clock,
        sinks: Iterable[Any] | None = DEFAULTS.sinks,
        reporter: Reporter | None = DEFAULTS.reporter,
        normalizer: float | str = DEFAULTS.normalizer,
        flops_per_step: float | str | None = DEFAULTS.flops_per_step,
        peak_flops: float | None = DEFAULTS.peak_flops,
        ranks: str = DEFAULTS.ranks,
        diagnose: bool | Thresholds = DEFAULTS.diagnose,
        count_batch: BatchCounter | str | None = "auto",
        log: str = "compact",
        log_depth: int = 1,
        count_tokens: bool | None = None,
    ) -> None:
        if log not in LOG_MODES:
            raise ValueError(f"unknown log {log!r}; expected one of 'compact', 'all', 'none'")
        if count_tokens is not None:
            deprecated("InstrumentCallback(count_tokens=)", "count_batch= ('auto' or None)")
            count_batch = "auto" if count_tokens else None
        self.options = AutoOptions(
            every=DEFAULTS.every if every is None else every,
            depth=depth,
            include=include,
            exclude=exclude,
            backward=backward,
            collectives=collectives,
            clock=clock,
            sinks=None if sinks is None else list(sinks),
            reporter=reporter,
            normalizer=normalizer,
            flops_per_step=flops_per_step,
            peak_flops=peak_flops,
            ranks=ranks,
            diagnose=diagnose,
        )
        self.count_batch = check_count_batch(count_batch)
        self.every = every
        self.log = log
        self.log_depth = log_depth
        if reporter is not None:
            reporter.add_sink(self._keep)
        self.handle: AutoHandle | None = None
        self._undo: list[Callable[[], None]] = []  # what the integration patched
        self.reports: list[Report] = []  # reports not yet logged
        self.last: Report | None = None

    def _keep(self, report: Report) -> None:
        self.last = report
        if self.log != "none":
            self.reports.append(report)

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: torch.nn.Module | None = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        """Install ``auto`` on what this ``train()`` uses."""
        self.remove()
        if model is None:
            raise ValueError("InstrumentCallback needs the Trainer's model (got None)")
        options = self.options
        if options.reporter is None:
            sinks = [Console()] if options.sinks is None else list(options.sinks)
            every = self.every if self.every is not None else _logging_every(args, state)
            options = dataclasses.replace(options, every=every, sinks=[*sinks, self._keep])
        counter = count_batch if self.count_batch == "auto" else self.count_batch
        loop = Loop(train_dataloader, lr_scheduler, None if train_dataloader is None else counter)
        try:
            self.handle = auto_with(model, optimizer, options, loop)
        except TypeError as error:
            if train_dataloader is None or "in place" not in str(error):
                raise
            warn_once(
                "transformers:loader",
                f"instrument: {error}; training goes on without the 'data' line",
                stacklevel=2,
            )
            self.handle = auto_with(model, optimizer, options, Loop(None, lr_scheduler))
        if options.collectives:  # the Trainer's DDP wraps model
            hook_ddp(getattr(_calling_trainer(sys._getframe(1)), "model_wrapped", None))
        self._undo = _time_trainer(options.region_clock)  # as auto() does
        if train_dataloader is not None:
            self._undo.append(_time_skipping_loaders())
        if self.log != "none":
            _log_before_reporting_callbacks(self, sys._getframe(1))

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        """Add the figures of the reports made since the last log to ``logs`` (and to the
        log-history entry the Trainer just appended for them)."""
        if not self.reports or logs is None:
            return
        reports, self.reports = self.reports, []
        added = figures(reports[-1], self.log, self.log_depth)
        history = getattr(state, "log_history", None)
        if history and isinstance(history[-1], dict):
            entry = history[-1]
            if all(entry.get(k) is v for k, v in logs.items()):
                entry.update(added)
        logs.update(added)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove every hook; the steps since the last report make one last report."""
        self.remove()

    def remove(self) -> None:
        """Remove every hook and patch now (idempotent). ``train()`` does it at its end, but
        a ``train()`` that raised never gets there (the Trainer has no exception event): call
        this after catching its exception. The next ``train()`` also starts with it."""
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()
        self.reports = []


def _logging_every(args: Any, state: Any) -> int:
    """The Trainer's ``logging_steps`` when it logs by steps, else 50."""
    strategy = getattr(args, "logging_strategy", "")
    logging_by_steps = str(getattr(strategy, "value", strategy)).lower() == "steps"
    # (a ratio of the run, logging_steps < 1, the Trainer has made a count by now)
    steps: Any = getattr(state, "logging_steps", None) or getattr(args, "logging_steps", 0)
    return int(steps) if logging_by_steps and steps >= 1 else 50


def _time_trainer(clock: object = None) -> list[Callable[[], None]]:
    """Time ``Trainer.evaluate`` as ``evaluate`` and ``Trainer._save_checkpoint`` as
    ``checkpoint`` for a Trainer whose ``InstrumentCallback`` is installed (the class's
    methods are patched while one is; other Trainers call straight through): an
    evaluation's forwards, loader and metrics, and a checkpoint's writes, are below their
    region, not in training's lines or ``(other)``. One region for ``evaluate()`` of several
    eval datasets (it calls itself for each). Returns the undos."""
    from transformers import Trainer

    return [
        patches.patch(Trainer, name, _timed_method(region_for(region, clock)))
        for name, region in (("evaluate", "evaluate"), ("_save_checkpoint", "checkpoint"))
        if name in vars(Trainer)
    ]


def _timed_method(region: Region) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``make`` for :func:`patches.patch`: the Trainer method timed as ``region`` on an
    instrumented Trainer, once however it recurses."""
    running: set[int] = set()

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            if id(self) in running or not _instrumented(self):
                return original(self, *args, **kwargs)
            running.add(id(self))
            try:
                with region:
                    return original(self, *args, **kwargs)
            finally:
                running.discard(id(self))

        return timed

    return make


def _calling_trainer(frame: Any) -> Any:
    """The ``Trainer`` whose method is on the stack above ``frame`` (the callback's event
    caller), or None: callbacks get the model, not the DDP wrapper the Trainer trains."""
    from transformers import Trainer

    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def _instrumented(trainer: Any) -> bool:
    """Whether ``trainer`` has an installed ``InstrumentCallback``."""
    handler = getattr(trainer, "callback_handler", None)
    return any(
        isinstance(callback, InstrumentCallback) and callback.handle is not None
        for callback in getattr(handler, "callbacks", ())
    )


def _time_skipping_loaders() -> Callable[[], None]:
    """A resumed ``train()`` iterates, in its first epoch, the loader Accelerate's
    ``skip_first_batches`` makes from the train loader (the batches already seen skipped):
    time that one as the train loader is (``data``, samples and tokens). Returns the undo."""
    trainer_module = sys.modules.get("transformers.trainer")
    if trainer_module is None or not callable(getattr(trainer_module, "skip_first_batches", None)):
        return lambda: None
    timed: list[Callable[[], None]] = []

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def skip_first_batches(dataloader: Any, *args: Any, **kwargs: Any) -> Any:
            skipping = original(dataloader, *args, **kwargs)
            undo = data_hooks.time_like(skipping, dataloader)
            if undo is not None:
                timed.append(undo)
            return skipping

        return skip_first_batches

    undo_patch = patches.patch(trainer_module, "skip_first_batches", make)

    def undo() -> None:
        undo_patch()
        while timed:
            timed.pop()()

    return undo


def _log_before_reporting_callbacks(callback: TrainerCallback, caller: Any) -> None:
    """Move ``callback`` to the front of the Trainer's callbacks, so that in ``on_log`` it
    adds its figures before the ``report_to`` callbacks (TensorBoard, wandb, ...) read the
    logs. ``caller`` is the frame that called the event (``CallbackHandler.call_event``).
    Moving an element to the front while that loop runs visits every later one once."""
    handler = caller.f_locals.get("self")
    if isinstance(handler, CallbackHandler) and callback in handler.callbacks:
        handler.callbacks.remove(callback)
        handler.callbacks.insert(0, callback)
