"""The clock choices the compat timers share: waiting for the device as their sources do, and
whether a new timer can time with CUDA events or must read the host clock."""

from __future__ import annotations

import torch

from instrument import _state, clocks
from instrument._warn import warn_once

__all__ = ["cuda_events_usable", "sync_device"]


def sync_device() -> None:
    """``torch.cuda.synchronize()`` when CUDA is initialised; nothing to wait for otherwise."""
    if clocks.cuda_ready():
        torch.cuda.synchronize()


def cuda_events_usable(no_cuda_warning: str | None, *, stacklevel: int = 1) -> bool:
    """Whether a timer created now can record CUDA events: no test ``Clock`` was given to
    ``instrument.configure(clock=...)``, this is not a process forked after CUDA was
    initialised, and CUDA is available. Without CUDA, ``no_cuda_warning`` (unless ``None``)
    is warned once per process; ``stacklevel`` is as for ``warnings.warn`` called by the
    caller."""
    if not isinstance(_state.requested_clock, str) or clocks.in_bad_fork():
        return False
    if not torch.cuda.is_available():
        if no_cuda_warning is not None:
            warn_once(no_cuda_warning, no_cuda_warning, stacklevel=stacklevel + 2)
        return False
    return True
