"""What a region also does while something watches: trace events, NVTX ranges, and
``torch.profiler`` ranges.

All three are off by default and then cost nothing: a region is swapped to an *observed*
class (see :func:`instrument.regions.region.apply`) only while

- a :class:`~instrument.sinks.ChromeTrace` sink is open (every region appends one event to
  a bounded ring, :data:`trace`),
- NVTX is asked for, for every region (``configure(nvtx=True)``) or for one
  (``timed(name, nvtx=True)``): ``torch.cuda.nvtx`` ranges, so Nsight Systems shows the tree,
- a ``torch.profiler`` / ``torch.autograd.profiler`` session runs: regions open a
  ``record_function`` range and appear in its trace. The profiler's own start/stop callbacks
  tell us (wrapped once, at import), so no region ever checks the profiler state.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from instrument._torch_support import degraded
from instrument._warn import warn_once

#: The default capacity of the trace ring (events; ~100 bytes each).
TRACE_CAPACITY = 200_000

#: One trace event: (path node, start ns, end ns, native thread id, device) where device
#: is ``None`` for a host region, else ``(start event, end event, (device, stream))``: a
#: pair of timing events the trace recorded itself for a "cuda"-clock region.
TraceEvent = tuple[Any, int, int, int, Any]

#: The ring of recent trace events while a trace sink is open, else ``None``.
trace: collections.deque[TraceEvent] | None = None
#: Events appended to the ring since tracing started (``- len(trace)`` were dropped).
trace_recorded = 0
_tracers: dict[int, int] = {}  # a trace sink's key (its id) -> the capacity it asked for

#: NVTX for every region (``configure(nvtx=True)``), and the regions that asked for it.
nvtx_all = False
nvtx_regions: set[Any] = set()
#: A profiler session is running.
profiling = False

# (path node, start ns) of an open observed region -> (pushed an NVTX range, profiler range,
# the trace's device start event and its (device, stream) or None)
open_ranges: dict[tuple[Any, int], tuple[bool, Any, Any]] = {}
_get_native_id = threading.get_native_id


def _device_event() -> Any:
    """A fresh timing event recorded on the current stream (never waits for the device)."""
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _current_stream() -> tuple[int, int]:
    """(device index, stream id) of the current stream."""
    stream = torch.cuda.current_stream()
    return stream.device_index, stream.stream_id


#: How a traced "cuda" region records its own device events (tests swap in a fake).
device_event = _device_event
current_stream = _current_stream


def nvtx_available() -> bool:
    """Whether this torch build has NVTX (a CUDA build; no GPU needed to call it)."""
    return hasattr(torch._C, "_nvtx")


def watches(region: Any) -> bool:
    """Whether ``region`` must run as an observed region under the current switches."""
    return (
        trace is not None
        or profiling
        or ((nvtx_all or region in nvtx_regions) and nvtx_available())
    )


def _nothing() -> None:
    pass


#: Run after a switch changes which regions must be observed: :mod:`instrument.config`
#: hands in the function that gives every live region its class again (the regions import
#: this module; it never imports them).
_reapply: Callable[[], None] = _nothing
_reapply_lock: Any = None  # the lock ``_reapply`` takes (the regions' lock)


def on_switch(reapply: Callable[[], None], lock: Any = None) -> None:
    """Call ``reapply`` whenever a switch here turns watching on or off; ``lock`` is the
    lock it takes (so that a finalizer never calls it while this thread holds that lock)."""
    global _reapply, _reapply_lock
    _reapply, _reapply_lock = reapply, lock


# -- the hot path of observed regions (only while something watches) ----------------------


def entered(region: Any, frame: Any) -> None:
    """A region opened: push its NVTX range and its profiler range; a region on the "cuda"
    clock (its frame holds a start event) records a device event for the trace."""
    pushed = (nvtx_all or region in nvtx_regions) and nvtx_available()
    if pushed:
        torch.cuda.nvtx.range_push(region.name)  # type: ignore[no-untyped-call]
    ranged = None
    if profiling:
        ranged = _record_function(region.name)
        ranged.__enter__()
    device = None
    if trace is not None and frame.event is not None:
        device = (device_event(), current_stream())
    if pushed or ranged is not None or device is not None:
        open_ranges[(frame.node, frame.t0)] = (pushed, ranged, device)


def exited(frame: Any, t1: int) -> None:
    """A region closed at ``t1``: close its ranges, append its trace event (with a device
    end event when it recorded a device start)."""
    global trace_recorded
    device = None
    if open_ranges:
        opened = open_ranges.pop((frame.node, frame.t0), None)
        if opened is not None:
            pushed, ranged, started = opened
            if ranged is not None:
                ranged.__exit__(None, None, None)
            if pushed:
                torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]
            if started is not None:
                device = (started[0], device_event(), started[1])
    ring = trace
    if ring is not None:
        ring.append((frame.node, frame.t0, t1, _get_native_id(), device))
        trace_recorded += 1


class TraceLabel(NamedTuple):
    """What names a trace event that no region recorded (the reporter's own flush)."""

    name: str
    path: str


def record_span(label: TraceLabel, t0: int, t1: int) -> None:
    """Append a host event from ``t0`` to ``t1`` (ns) on this thread to the trace, if one
    is open."""
    global trace_recorded
    ring = trace
    if ring is not None:
        ring.append((label, t0, t1, _get_native_id(), None))
        trace_recorded += 1


def _record_function(name: str) -> Any:
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return fast(name)
    degraded(
        "the profiler's _RecordFunctionFast",
        "2.2",
        "regions are labelled in the profiler with torch.autograd.profiler.record_function",
    )
    return torch.autograd.profiler.record_function(name)


# -- switches ------------------------------------------------------------------------------


def start_trace(key: int, capacity: int = TRACE_CAPACITY) -> None:
    """Record trace events for the trace sink ``key`` (its ``id``) in a ring of
    ``capacity`` events (the largest capacity asked for by the open sinks)."""
    global trace, trace_recorded
    _tracers[key] = capacity
    size = max(_tracers.values())
    if trace is None:
        trace, trace_recorded = collections.deque(maxlen=size), 0
        _reapply()
    elif trace.maxlen != size:
        trace = collections.deque(trace, maxlen=size)


def stop_trace(key: int) -> None:
    """The trace sink ``key`` no longer needs trace events (closed, or collected unclosed:
    this may run as a finalizer, anywhere); the last one to stop turns tracing off."""
    global trace
    _tracers.pop(key, None)
    if not _tracers and trace is not None:
        trace = None  # regions stop appending at once; their class follows
        _reapply_safely()


def _reapply_safely() -> None:
    """:func:`_reapply` now, or — when the region lock is held, possibly by this very
    thread (a finalizer run by a collection inside a locked section) — in a helper thread
    that waits for it, never a deadlock."""
    if _reapply_lock is None or not _reapply_lock.locked():
        _reapply()
        return
    try:
        threading.Thread(target=_reapply, name="instrument-untrace", daemon=True).start()
    except RuntimeError:  # the interpreter is shutting down: nothing will run regions
        pass


def set_nvtx(enabled: bool) -> None:
    """NVTX ranges for every region (``configure(nvtx=...)``); warns once without NVTX."""
    global nvtx_all
    if enabled:
        _check_nvtx()
    nvtx_all = enabled


def add_nvtx_region(region: Any) -> None:
    """NVTX ranges for this one region (``timed(name, nvtx=True)``); sticks to the region."""
    _check_nvtx()
    if region not in nvtx_regions:
        nvtx_regions.add(region)
        _reapply()


def _check_nvtx() -> None:
    if not nvtx_available():
        warn_once(
            "nvtx",
            "instrument: NVTX ranges need a CUDA build of torch (torch.cuda.nvtx); "
            "regions run without them",
            stacklevel=5,
        )


def _set_profiling(enabled: bool) -> None:
    global profiling
    if enabled != profiling:
        profiling = enabled
        if not enabled:
            open_ranges.clear()  # ranges of regions still open belong to the stopped session
        _reapply()


def _wrap_profiler_callbacks() -> None:
    """Follow the profiler's start/stop (torch calls these module functions on both)."""
    module = torch.autograd.profiler
    start = getattr(module, "_run_on_profiler_start", None)
    stop = getattr(module, "_run_on_profiler_stop", None)
    if start is None or stop is None or getattr(start, "_instrument", False):
        return

    def on_start() -> None:
        start()
        _set_profiling(True)

    def on_stop() -> None:
        stop()
        _set_profiling(False)

    on_start._instrument = True  # type: ignore[attr-defined]
    on_stop._instrument = True  # type: ignore[attr-defined]
    module._run_on_profiler_start = on_start
    module._run_on_profiler_stop = on_stop


def reset() -> None:
    """Everything off (``testing.reset``); the profiler state is left to the profiler."""
    global trace, nvtx_all
    _tracers.clear()
    trace, nvtx_all = None, False
    nvtx_regions.clear()
    open_ranges.clear()


_wrap_profiler_callbacks()
profiling = bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))
