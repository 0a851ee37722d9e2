"""The classes of :mod:`instrument.integrations.lightning` for the ``pytorch_lightning``
package (the same Lightning under its older name); see docs/lightning.md.

Example:
    >>> from instrument.integrations.pytorch_lightning import InstrumentCallback
    >>> trainer = pytorch_lightning.Trainer(callbacks=[InstrumentCallback(every=50)])
"""

from __future__ import annotations

from pytorch_lightning import Callback
from pytorch_lightning.profilers import Profiler

from instrument.integrations._lightning import CallbackHooks, ProfilerHooks
from instrument.throughput import BatchCounter, batch_counts

__all__ = ["BatchCounter", "InstrumentCallback", "InstrumentProfiler", "batch_counts"]


class InstrumentCallback(CallbackHooks, Callback):
    """``instrument.integrations.lightning.InstrumentCallback`` for ``pytorch_lightning``."""


class InstrumentProfiler(ProfilerHooks, Profiler):
    """``instrument.integrations.lightning.InstrumentProfiler`` for ``pytorch_lightning``."""

    callback_class = InstrumentCallback
