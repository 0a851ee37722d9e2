"""``configure()``, ``enable()``, ``disable()``: the process-wide switches.

Each change is resolved once, here, and pushed into the live regions (see
:func:`instrument.regions.region.apply_all`), so the hot path never re-checks a setting. The
switches of :mod:`instrument.observe` (a trace sink opened, a profiler started, NVTX for
one region) are pushed the same way: this module hands it ``apply_all``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from instrument import _state, clocks, observe, registry
from instrument.regions import region

_UNSET: Any = object()


def configure(
    *,
    clock: object = _UNSET,
    level: int | None = _UNSET,
    nvtx: bool = _UNSET,
    max_depth: int = _UNSET,
    max_paths: int = _UNSET,
    exit_summary: bool = _UNSET,
) -> None:
    """Set the default clock, the recording level, NVTX ranges, the bounds of the tree, and
    the tree at exit.

    Args:
        clock: "auto" (default: "cuda" when CUDA is available and initialised, else "cpu"),
            "cpu", "cuda", "sync", or a ``Clock`` object (``now_ns()``) to use as the host
            clock, e.g. ``instrument.testing.FakeClock``.
        level: Regions whose ``level`` is above this are skipped; ``None`` records all.
        nvtx: Push an NVTX range per region (``torch.cuda.nvtx``), so Nsight Systems shows
            the same tree; a no-op, warned once, without a CUDA build of torch.
        max_depth: Regions nested deeper than this (default 64) are counted in one
            ``(overflow)`` path, warned once (a generator that keeps a region open across
            ``yield`` would otherwise grow its path at every item).
        max_paths: New paths beyond this many (default 10,000) are counted in
            ``(overflow)`` too, warned once. Paths idle for a few flushes are released.
        exit_summary: Print one tree of what was recorded (to stderr) when the process
            exits without having made a ``Reporter`` (a script that only uses ``timed``);
            default ``True``, or ``False`` when the environment has
            ``INSTRUMENT_EXIT_SUMMARY=0``.
    """
    for name, cap in (("max_depth", max_depth), ("max_paths", max_paths)):
        if cap is not _UNSET and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"{name} must be an int >= 1, got {cap!r}")
    for name, flag in (("nvtx", nvtx), ("exit_summary", exit_summary)):
        if flag is not _UNSET and not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    if clock is not _UNSET:
        clocks.check_clock(clock)
    if level is not _UNSET and level is not None:
        region.check_level(level)
    if clock is not _UNSET:
        _state.requested_clock = clock
        _state.mode = clocks.resolve(clock)
        if isinstance(clock, clocks.Clock):
            _state.now = clocks.reader(clock)
        else:
            _state.now = time.perf_counter_ns
    if level is not _UNSET:
        _state.level = level
    if nvtx is not _UNSET:
        observe.set_nvtx(nvtx)
    if exit_summary is not _UNSET:
        _state.exit_summary = exit_summary
    if max_depth is not _UNSET:
        registry.max_depth = max_depth
    if max_paths is not _UNSET:
        registry.max_paths = max_paths
    region.apply_all()


def refresh_auto_clock() -> None:
    """Re-resolve ``clock="auto"`` (CUDA may have been initialised since). Cheap; run at flush."""
    if _state.requested_clock == "auto":
        mode = "cuda" if clocks.cuda_ready() else "cpu"
        if mode != _state.mode:
            _state.mode = mode
            region.apply_all()


def enable() -> None:
    """Turn instrumentation back on."""
    _state.enabled = True
    region.apply_all()


def disable() -> None:
    """Turn every region into a no-op (a decorated call goes straight to the function)."""
    _state.enabled = False
    region.apply_all()


def is_enabled() -> bool:
    """True unless :func:`disable` is in force."""
    return _state.enabled


def _after_fork_in_child() -> None:
    """A child forked after its parent initialised CUDA cannot record CUDA events: every
    region there (explicit "cuda" and "sync" ones too) switches to the host clock."""
    if clocks.in_bad_fork():
        region.lock = threading.Lock()  # the parent may have held it while forking
        observe.on_switch(region.apply_all, region.lock)
        _state.mode = "cpu"
        region.apply_all()


os.register_at_fork(after_in_child=_after_fork_in_child)
observe.on_switch(region.apply_all, region.lock)
