"""What the Lightning Callback and Profiler share: a ``Trainer.fit()`` timed like a plain loop.

:class:`Session` runs :func:`instrument.auto` on the LightningModule and its optimizers from
``on_train_start`` to ``on_train_end`` and adds what only Lightning knows:

- ``training_step`` (Lightning's forward: the module's forward, the loss, ``self.log``) is
  a region, and the samples (and tokens) of its batch are counted into the current step;
- ``data``: Lightning's own batch fetcher is timed in place, so the first epoch — whose
  loader iterator Lightning creates before any callback runs — has its ``data`` line;
- manual optimization: ``manual_backward``, ``opt.zero_grad()`` and ``opt.step()`` called
  inside ``training_step`` are recorded where they are in a plain loop (at the top), and
  ``training_step`` keeps the rest; a step that ends inside ``training_step`` is ticked
  when ``training_step`` returns, so an interval never splits one;
- ``lr_scheduler`` (Lightning's ``lr_scheduler_step`` hook, for every scheduler) and
  ``validation`` (during fit); ``clip_grad_norm`` comes from ``auto`` itself.

Lightning itself is never imported here: ``lightning.py`` and ``pytorch_lightning.py`` bind
these pieces to the two package names.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from instrument import clocks, registry
from instrument._warn import warn_once
from instrument.auto import FORWARD_UNSEEN, AutoHandle, auto_with, check_count_batch
from instrument.diagnosis import Thresholds
from instrument.hooks import data as data_hooks
from instrument.hooks.collectives import hook_ddp
from instrument.hooks.optim import resumed
from instrument.hooks.patches import put_on_instance
from instrument.integrations.figures import LOG_MODES, figures
from instrument.options import DEFAULTS, AutoOptions
from instrument.regions.frames import get_top, set_top
from instrument.regions.region import Region, region_for
from instrument.regions.timer import Timer
from instrument.report import Report
from instrument.reporter import Reporter
from instrument.sinks.base import Sink
from instrument.sinks.console import Console
from instrument.throughput import BatchCounter, batch_counts


class ToLoggers(Sink):
    """Each report's :func:`figures` to the Trainer's loggers (``trainer.loggers``), at the
    Trainer's global step once the report's last step has ended: a report flushed inside an
    optimizer step (before Lightning counts it) is held until :meth:`send` runs at the end
    of the batch or of the fit. Distributed: Lightning's loggers write on rank 0 only."""

    def __init__(self, trainer: Any, mode: str, depth: int) -> None:
        self._trainer = weakref.ref(trainer)
        self._mode = mode
        self._depth = depth
        self._held: list[dict[str, float]] = []

    def write(self, report: Report) -> None:
        self._held.append(figures(report, self._mode, self._depth))

    def send(self) -> None:
        """Log the held reports' figures at the Trainer's global step now."""
        held, self._held = self._held, []
        trainer = self._trainer()
        if trainer is None or not held:
            return
        step = int(getattr(trainer, "global_step", 0))
        for metrics in held:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


def _last_step_of_fit(trainer: Any, counted: bool) -> bool:
    """Whether ``fit()`` ends with the optimizer step just ticked: ``max_steps`` reached
    (``counted``: ``trainer.global_step`` includes that step already), or a step of the
    last batch of the last epoch. False where this Lightning does not say (and when the
    fit stops early: ``trainer.should_stop`` is set after the step)."""
    try:
        max_steps = trainer.max_steps
        steps = trainer.global_step + (0 if counted else 1)
        if max_steps is not None and max_steps >= 0 and steps >= max_steps:
            return True
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs < 0 or trainer.current_epoch + 1 < max_epochs:
            return False
        ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return bool(trainer.is_last_batch) or ready >= trainer.num_training_batches
    except (AttributeError, TypeError):
        return False


def _warn_compiled_training_step() -> None:
    """``trainer.fit(torch.compile(model))``: Lightning compiles ``training_step`` itself
    (``from_compiled``), so the forward runs inside a compiled function. Said before the
    fit, in place of ``auto``'s advice to compile the model (which the user did)."""
    warn_once(
        FORWARD_UNSEEN,
        "instrument: trainer.fit(torch.compile(model)) makes Lightning compile training_step "
        "itself, and the model's forward runs inside that compiled function, where "
        "instrument cannot see: the tree has training_step but no forward or module lines. "
        "To see the modules, compile them inside the LightningModule instead "
        "(self.net = torch.compile(self.net)) and pass fit() the LightningModule itself",
        stacklevel=4,
    )


class Session:
    """One ``fit()`` timed by ``auto``; see the module doc. Options are ``auto``'s (checked
    here, so a bad one fails when the Callback or Profiler is made, not mid-fit), plus
    ``count_batch``: ``"auto"`` (:func:`batch_counts`), a function of the batch returning
    ``(samples, tokens)``, or ``None`` (count nothing); ``log`` / ``log_depth``: what the
    made reporter sends to the Trainer's loggers (:func:`figures`; ``"none"``: nothing)."""

    def __init__(
        self,
        *,
        every: int | None = DEFAULTS.every,
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
    ) -> None:
        if log not in LOG_MODES:
            raise ValueError(f"unknown log {log!r}; expected one of 'compact', 'all', 'none'")
        if isinstance(log_depth, bool) or not isinstance(log_depth, int) or log_depth < 1:
            raise ValueError(f"log_depth must be an int >= 1, got {log_depth!r}")
        self._log, self._log_depth = log, log_depth
        self._options = AutoOptions(
            every=every,
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
        counter = check_count_batch(count_batch)
        self._counter: BatchCounter | None = (
            batch_counts if counter == "auto" else None if isinstance(counter, str) else counter
        )
        self._clock = self._options.region_clock
        self._given = reporter
        self._handle: AutoHandle | None = None
        self._reporter: Reporter | None = None
        self._undo: list[Callable[[], None]] = []
        self._fetcher: Any = None
        self._undo_data: Callable[[], None] | None = None
        self._validation: Timer | None = None
        self._step_region = region_for("training_step", self._clock)
        self._inside = 0  # training_step calls running
        self._held: list[tuple[int | None, int | None]] = []  # ticks held until they return
        self._to_loggers: ToLoggers | None = None
        self._trainer: Callable[[], Any] = lambda: None

    @property
    def handle(self) -> AutoHandle | None:
        """The ``auto`` handle while a fit is timed, else ``None``."""
        return self._handle

    @property
    def reporter(self) -> Reporter | None:
        """The reporter of the fit being timed (or of the last one)."""
        return self._reporter

    # -- the fit's life -------------------------------------------------------------------

    def start(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        """Install everything (``on_train_start``; idempotent)."""
        if self._handle is not None:
            return
        reporter = self._given
        if reporter is None:
            given = self._options.sinks
            sinks = [Console()] if given is None else list(given)
            if self._log != "none" and getattr(trainer, "loggers", None):
                self._to_loggers = ToLoggers(trainer, self._log, self._log_depth)
                sinks.append(self._to_loggers)
            reporter = self._options.make_reporter(sinks)
        self._reporter = reporter
        self._trainer = weakref.ref(trainer)
        self._undo = [put_on_instance(reporter, "step", self._holding(reporter.step))]
        try:
            optimizers = list(trainer.optimizers)
            if isinstance(getattr(pl_module, "_compiler_ctx", None), dict):
                _warn_compiled_training_step()
            options = self._options.with_reporter(reporter)
            self._handle = auto_with(pl_module, optimizers, options)
            self._install(trainer, pl_module)
        except Exception as error:  # instrumentation never stops training
            self.stop()
            warn_once(
                "lightning:start",
                f"instrument: this fit is not timed: {error}",
                stacklevel=2,
            )
        except BaseException:
            self.stop()
            raise

    def epoch_start(self, trainer: Any) -> None:
        """Time a batch fetcher Lightning made anew (dataloaders reloaded every n epochs)."""
        if self._handle is not None:
            self._time_data(trainer)

    def batch_end(self) -> None:
        """``on_train_batch_end``: the batch's optimizer steps are counted now; log what
        they reported."""
        if self._to_loggers is not None:
            self._to_loggers.send()

    def validation_start(self, trainer: Any) -> None:
        """``on_validation_start`` during fit (not the sanity check): open ``validation``."""
        if self._handle is None or getattr(trainer, "sanity_checking", False):
            return
        if self._validation is None:
            self._validation = Timer("validation", clock=self._clock)
        if not self._validation.running:
            self._validation.start()

    def validation_end(self) -> None:
        """``on_validation_end``: close ``validation``."""
        if self._validation is not None and self._validation.running:
            self._validation.stop()

    def stop(self, *, local: bool = False) -> None:
        """Undo everything and close the reporter this session made (``on_train_end``,
        ``on_exception``, ``teardown``; idempotent). ``local``: its last flush waits for no
        other rank (on an exception they may be gone)."""
        self.validation_end()
        if self._undo_data is not None:
            self._undo_data()
            self._undo_data, self._fetcher = None, None
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()
        self._release()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove(local=local)
        reporter = self._reporter
        if reporter is not None and self._given is None and not reporter.closed:
            flush = reporter.steps > 0
            reporter.close(flush=flush, local=local)
            if not flush:  # what followed the last optimizer step is no step: leave nothing
                registry.collect()
        if self._to_loggers is not None:
            self._to_loggers.send()
            self._to_loggers = None

    # -- what is installed ----------------------------------------------------------------

    def _install(self, trainer: Any, pl_module: Any) -> None:
        undo = self._undo
        undo.append(put_on_instance(pl_module, "training_step", self._training_step(pl_module)))
        outside = self._outside
        manual_backward = outside(pl_module.manual_backward)
        undo.append(put_on_instance(pl_module, "manual_backward", manual_backward))
        scheduler = region_for("lr_scheduler", self._clock)
        undo.append(
            put_on_instance(
                pl_module,
                "lr_scheduler_step",
                _timed(pl_module.lr_scheduler_step, scheduler),
            )
        )
        if callable(getattr(trainer, "save_checkpoint", None)):  # ModelCheckpoint's writes
            checkpoint = region_for("checkpoint", self._clock)
            undo.append(
                put_on_instance(
                    trainer, "save_checkpoint", _timed(trainer.save_checkpoint, checkpoint)
                )
            )
        strategy = getattr(trainer, "strategy", None)
        for wrapper in getattr(strategy, "_lightning_optimizers", ()):
            inner = getattr(wrapper, "_optimizer", None)
            if inner is None:
                continue
            # LightningOptimizer.zero_grad is the optimizer class's, run on the wrapper:
            # route it to the inner optimizer's timed one
            undo.append(put_on_instance(wrapper, "zero_grad", outside(inner.zero_grad)))
            undo.append(put_on_instance(wrapper, "step", outside(wrapper.step)))
        if self._options.collectives:  # DDP wraps the LightningModule in the strategy
            hook_ddp(getattr(strategy, "model", None))
        self._time_data(trainer)

    def _time_data(self, trainer: Any) -> None:
        fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
        if fetcher is self._fetcher:
            return
        if self._undo_data is not None:
            self._undo_data()
            self._undo_data = None
        self._fetcher = fetcher
        if fetcher is None:
            warn_once(
                "lightning:data",
                "instrument: this Lightning version keeps no fit_loop._data_fetcher; the tree "
                "has no 'data' line",
            )
            return
        try:
            self._undo_data = data_hooks.time_in_place(fetcher, clock=self._clock)
        except (TypeError, RuntimeError) as error:  # never stop training for a data line
            warn_once("lightning:data", f"instrument: no 'data' line: {error}")

    def _training_step(self, pl_module: Any) -> Callable[..., Any]:
        call = pl_module.training_step
        region = self._step_region
        session = self

        @functools.wraps(call)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            counter = session._counter
            if counter is not None:
                session._count(counter, args[0] if args else kwargs.get("batch"))
            session._inside += 1
            try:
                with region:
                    return call(*args, **kwargs)
            finally:
                session._inside -= 1
                if session._held and not session._inside:
                    session._release()

        return training_step

    def _count(self, counter: BatchCounter, batch: Any) -> None:
        reporter = self._reporter
        if reporter is None:
            return
        try:
            samples, tokens = counter(batch)
            reporter.count_into_step(samples, tokens)
        except Exception as error:  # never let counting stop training
            self._counter = None
            warn_once(
                "lightning:count",
                f"instrument: counting the batch failed ({error!r}); samples and tokens are "
                "no longer counted (pass count_batch= a function returning (samples, tokens))",
            )

    def _holding(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The reporter's ``step``, held while ``training_step`` runs (manual optimization
        steps inside it) and run when it returns."""
        session = self

        def held_step(samples: int | None = None, tokens: int | None = None) -> Any:
            if session._inside:
                session._held.append((samples, tokens))
                return None
            report = step(samples, tokens)  # (inside the optimizer step: not yet counted)
            return session._end_of_fit(counted=False) or report

        held_step.__wrapped__ = step  # type: ignore[attr-defined]
        return held_step

    def _release(self) -> None:
        held, self._held = self._held, []
        reporter = self._reporter
        if reporter is None:
            return
        step = getattr(reporter.step, "__wrapped__", reporter.step)
        for samples, tokens in held:
            step(samples, tokens)
        if held:  # (after training_step: its optimizer steps are counted)
            self._end_of_fit(counted=True)

    def _end_of_fit(self, *, counted: bool) -> Report | None:
        """After a tick: if it was the fit's last optimizer step, report the steps since
        the last report now — what runs after it (the epoch-end validation, the last
        scheduler step) is no step, and ``stop()`` drops it, whether or not ``every``
        divides the steps. ``counted``: ``trainer.global_step`` counts the step already."""
        reporter = self._reporter
        trainer = self._trainer()
        if (
            reporter is None
            or trainer is None
            or self._given is not None
            or reporter.closed
            or not reporter.steps
            or not _last_step_of_fit(trainer, counted)
        ):
            return None
        return reporter.flush()

    def _outside(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call``, run with a ``training_step`` frame on top set aside: what it records
        lands where it would in a plain loop, and ``training_step`` keeps the rest."""
        region = self._step_region

        @functools.wraps(call)
        def outside(*args: Any, **kwargs: Any) -> Any:
            frame = get_top()
            if frame.owner is not region:
                return call(*args, **kwargs)
            sync = region.mode == "sync"
            if sync:
                clocks.synchronize()
            set_top(frame.parent)
            now = region._now
            t0 = now()
            try:
                return call(*args, **kwargs)
            finally:
                set_top(resumed(frame, now() - t0, sync))

        return outside


def _timed(call: Callable[..., Any], region: Region) -> Callable[..., Any]:
    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with region:
            return call(*args, **kwargs)

    return timed


class CallbackHooks:
    """The Callback's hooks (mixed into ``lightning.pytorch.Callback`` and
    ``pytorch_lightning.Callback``); the options are :class:`Session`'s."""

    def __init__(self, **options: Any) -> None:
        self.session = Session(**options)

    __init__.__signature__ = inspect.signature(Session.__init__)  # type: ignore[attr-defined]

    @property
    def reporter(self) -> Reporter | None:
        """The reporter of the fit being timed (or of the last one)."""
        return self.session.reporter

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.epoch_start(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.session.batch_end()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.validation_start(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.validation_end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.stop(local=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.session.stop()


class ProfilerHooks:
    """The Profiler's methods (mixed into Lightning's ``Profiler``): ``setup`` adds a
    Callback doing the work to the Trainer's callbacks, ``teardown`` takes it out again;
    ``start``/``stop`` of Lightning's actions cost one empty call."""

    _callback: CallbackHooks
    _lightning_module: Any
    #: The Callback class of the same Lightning package (set by each subclass).
    callback_class: type[CallbackHooks]

    def __init__(self, **options: Any) -> None:
        super().__init__()  # Lightning's Profiler, next in the subclass's bases
        self._callback = self.callback_class(**options)

    __init__.__signature__ = inspect.signature(Session.__init__)  # type: ignore[attr-defined]

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Lightning's ``Profiler.setup``, then the Callback joins the Trainer's callbacks."""
        super().setup(stage, local_rank, log_dir)  # type: ignore[misc]
        self._attach()

    def teardown(self, stage: str | None) -> None:
        """The Callback leaves the Trainer, then Lightning's ``Profiler.teardown``."""
        self._detach()
        super().teardown(stage)  # type: ignore[misc]

    def _attach(self) -> None:
        module = getattr(self, "_lightning_module", None)
        trainer = getattr(module, "_trainer", None) if module is not None else None
        if trainer is None:
            return
        self._trainer_ref = weakref.ref(trainer)
        if not any(cb is self._callback for cb in trainer.callbacks):
            trainer.callbacks.append(self._callback)

    def _detach(self) -> None:
        callback = getattr(self, "_callback", None)  # absent if __init__ raised
        if callback is None:
            return
        callback.session.stop()
        ref = getattr(self, "_trainer_ref", None)
        trainer = ref() if ref is not None else None
        if trainer is not None:
            trainer.callbacks[:] = [cb for cb in trainer.callbacks if cb is not callback]

    @property
    def reporter(self) -> Reporter | None:
        """The reporter of the fit being timed (or of the last one)."""
        return self._callback.session.reporter

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
