"""``instrument`` inside Lightning (``lightning.pytorch``): one line, a Callback or a Profiler.

Example:
    >>> from instrument.integrations.lightning import InstrumentCallback, InstrumentProfiler
    >>> trainer = lightning.Trainer(callbacks=[InstrumentCallback(every=50)])
    >>> trainer = lightning.Trainer(profiler=InstrumentProfiler(every=50))    # or this

Either gives the tree of a plain loop for each ``every`` optimizer steps: ``training_step``
(with the module's ``forward`` below it), ``backward``, ``optimizer`` (the update alone),
``zero_grad``, ``data``, ``clip_grad_norm``, ``lr_scheduler``, ``validation``. See
docs/lightning.md. :mod:`instrument.integrations.pytorch_lightning` has the same two classes
for the ``pytorch_lightning`` package.
"""

from __future__ import annotations

from lightning.pytorch import Callback
from lightning.pytorch.profilers import Profiler

from instrument.integrations._lightning import CallbackHooks, ProfilerHooks
from instrument.throughput import BatchCounter, batch_counts

__all__ = ["BatchCounter", "InstrumentCallback", "InstrumentProfiler", "batch_counts"]


class InstrumentCallback(CallbackHooks, Callback):
    """Time ``Trainer.fit()`` with :func:`instrument.auto`: ``Trainer(callbacks=[...])``.

    Args:
        every: Optimizer steps between reports (``None``: only at the end of ``fit``).
        sinks: Where reports go (default: the console).
        reporter: Use this reporter instead (then leave ``every``, ``sinks``,
            ``normalizer``, ``flops_per_step``, ``peak_flops``, ``ranks`` and ``diagnose``
            alone); it is not closed.
        depth, include, exclude, backward, collectives, clock, normalizer,
            flops_per_step, peak_flops, ranks, diagnose: As for :func:`instrument.auto`
            (:class:`instrument.options.AutoOptions`: the same names and defaults).
        count_batch: ``"auto"`` counts samples (the first dimension of the batch's first
            tensor) and tokens (``input_ids.numel()`` of a dict batch) from each
            ``training_step``'s batch; a function ``batch -> (samples, tokens)``; or None.
        log: Send each report's figures to the Trainer's loggers (``trainer.loggers``, at
            the global step): "compact" (region times down to ``log_depth`` levels, step
            time, throughput), "all" (every scalar of the TensorBoard sink) or "none".
            Only with the reporter the Callback makes.
        log_depth: Path levels logged in "compact" mode.

    ``reporter`` is the reporter of the fit being timed (or of the last one).

    Example:
        >>> trainer = lightning.Trainer(callbacks=[InstrumentCallback(every=50)])
        >>> trainer.fit(model, loader)
    """


class InstrumentProfiler(ProfilerHooks, Profiler):
    """The same as :class:`InstrumentCallback`, given as ``Trainer(profiler=...)``; the
    options are the Callback's. It adds such a Callback to the Trainer's callbacks for each
    run and takes it out at the end.

    Example:
        >>> trainer = lightning.Trainer(profiler=InstrumentProfiler(every=50))
    """

    callback_class = InstrumentCallback
