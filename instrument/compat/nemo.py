"""Drop-in for NeMo Automodel's ``nemo_automodel/components/training/timers.py``.

The same port as :mod:`instrument.compat.megatron` (NeMo's timers are Megatron's, with the
context-manager form and ``write_to_wandb``), with NeMo's own output: ``Timers.log()``
prints its text (flushed) where Megatron core >= 0.16 logs it.

Example:
    >>> from instrument.compat.nemo import Timers   # was: from nemo_automodel...timers
    >>> timers = Timers(log_level=2, log_option="minmax")
    >>> with timers("forward-backward", log_level=1):
    ...     loss = train_step(batch)
    >>> timers.log(["forward-backward"])            # printed on the last rank
"""

from __future__ import annotations

from datetime import timedelta

from instrument.compat import megatron
from instrument.compat.megatron import (
    DummyTimer,
    Timer,
    TimerArgumentError,
    TimerBase,
    TimerStateError,
)
from instrument.regions.timed import BARRIER_TIMEOUT

__all__ = [
    "DummyTimer",
    "Timer",
    "TimerArgumentError",
    "TimerBase",
    "TimerStateError",
    "Timers",
]


class Timers(megatron.Timers):
    """NeMo Automodel's ``Timers``: :class:`instrument.compat.megatron.Timers` whose
    :meth:`log` prints by default (``log_to="logger"`` logs as Megatron core >= 0.16)."""

    def __init__(
        self,
        log_level: int,
        log_option: str,
        *,
        log_to: str = "print",
        to_registry: bool | None = None,
        barrier_timeout: timedelta | float = BARRIER_TIMEOUT,
    ) -> None:
        super().__init__(
            log_level,
            log_option,
            log_to=log_to,
            to_registry=to_registry,
            barrier_timeout=barrier_timeout,
        )
