"""Helpers the compat and sink tests share: markers, a clock that must stay unread, timing
one interval on a fake clock, capturing stdout, reading a positional signature, one timed
training step, and NeMo's stub for ``torch.distributed``.

Example:
    >>> from compat_helpers import timed_interval
    >>> timed_interval(timers, "forward", 0.25, clock)   # start, 0.25 s on the clock, stop
"""

from __future__ import annotations

import contextlib
import inspect
import io
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

import instrument
from instrument.testing import FakeClock, use_clock

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")


class ClockThatMustNotBeRead:
    """A ``Clock`` for ``use_clock``: reading it fails the test."""

    def now_ns(self) -> int:
        raise AssertionError("the clock was read")


def timed_interval(
    timers: Callable[[str], Any], name: str, seconds: float, clock: FakeClock
) -> None:
    """``timers(name).start()``, ``seconds`` on ``clock``, ``timers(name).stop()``."""
    timers(name).start()
    clock.advance(seconds)
    timers(name).stop()


def timed_on_a_fresh_clock(timers: Callable[[str], Any], name: str, seconds: float) -> None:
    """:func:`timed_interval` on a new :class:`FakeClock`, for a rank worker (which has no
    ``clock`` fixture)."""
    with use_clock(FakeClock()) as clock:
        assert isinstance(clock, FakeClock)
        timed_interval(timers, name, seconds, clock)


def printed(func: Callable[..., object], *args: Any, **kwargs: Any) -> str:
    """What ``func(*args, **kwargs)`` prints to stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        func(*args, **kwargs)
    return out.getvalue()


def positional_signature(func: Callable[..., object]) -> list[tuple[str, Any]]:
    """``(name, default)`` of ``func``'s positional-or-keyword parameters (``None``: no
    default), to compare with the signature the ported source documents."""
    params = inspect.signature(func).parameters.values()
    return [
        (p.name, None if p.default is p.empty else p.default)
        for p in params
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]


def timed_step(clock: FakeClock, inner: str, seconds: float) -> None:
    """One step for the sink tests: "step" (1 ms of its own) around ``inner`` taking
    ``seconds``, then ``instrument.step(samples=4, tokens=64)``."""
    with instrument.timed("step"):
        clock.advance(0.001)
        with instrument.timed(inner):
            clock.advance(seconds)
    instrument.step(samples=4, tokens=64)


def stub_torch_distributed(
    monkeypatch: pytest.MonkeyPatch, rank: int = 0, world_size: int = 1
) -> types.SimpleNamespace:
    """Replace ``torch.distributed`` with the stub NeMo Automodel's unit tests use
    (NVIDIA-NeMo/Automodel tests/unit_tests/training/test_timers.py, commit 541dd42): a
    ``SimpleNamespace`` with only get_world_size, get_rank, barrier(group=None),
    all_gather_into_tensor and _all_gather_base -- no is_available, no is_initialized.
    ``torch.cuda.synchronize`` / ``current_device`` are stubbed as there too."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0, raising=False)

    def _all_gather(dest: torch.Tensor, src: torch.Tensor) -> None:
        dest.copy_(src)

    stub = types.SimpleNamespace(
        get_world_size=lambda: world_size,
        get_rank=lambda: rank,
        barrier=lambda group=None: None,
        all_gather_into_tensor=_all_gather,
        _all_gather_base=_all_gather,
    )
    monkeypatch.setattr(torch, "distributed", stub, raising=False)
    return stub
