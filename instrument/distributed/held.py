"""The tensors of the last few collectives ``instrument`` ran, kept alive.

A collective's work may be freed by the backend's own thread after the call has returned
(gloo's worker threads, NCCL's watchdog). Were that work the last holder of a tensor made
in Python, the thread would need the GIL to free it, and at interpreter shutdown a thread
that asks for the GIL is ended: the process aborts ("terminate called without an active
exception", SIGABRT) after its work was done. Held here, the tensors are freed by Python
in the thread that made them, a few collectives later or at shutdown.
"""

from __future__ import annotations

from collections import deque

import torch

Held = torch.Tensor | list[torch.Tensor] | None

#: The tensors of the last collectives (one flush makes at most a few).
_recent: deque[tuple[Held, ...]] = deque(maxlen=8)


def keep(*tensors: Held) -> None:
    """Keep ``tensors`` (passed to a collective about to run) alive for a while."""
    _recent.append(tensors)
