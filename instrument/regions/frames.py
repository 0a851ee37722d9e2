"""The region stack: where the innermost open region of this context lives, and how a
region's frame enters and leaves it. This is the definition; the C accelerator
(:mod:`instrument.regions.native`) implements the same functions, never a second semantics.

A *frame* is one open region: the tuple ``(node, t0, parent_frame, owner, event)`` — its path
node in :mod:`instrument.registry`, the start time in ns, the frame it was opened under, the
region object that opened it, and its start CUDA event (or None). The innermost frame is held
in the context variable ``_frame``; ``ROOT_FRAME`` (the root node, no parent) means "no region
open". Frames are immutable, so a stack is just its innermost frame.

The state machine (every transition reads and writes only this context's innermost frame):

- **enter** (``Region._open`` / ``__enter__``): read the innermost frame, find or create the
  child node named like the region under its node, read the clock, make the new frame the
  innermost.
- **exit** (``__exit__``): read the clock; if the innermost frame belongs to this region,
  restore its parent and record the duration. Otherwise (an inner region was left open) close
  this region's innermost frame further down — see *exit by token*. A region exited with no
  open frame in this context records nothing and warns once.
- **exit by token** (:func:`_close`, used by decorators, ``Timer.stop`` and hooks that keep the
  frame they opened): take exactly that frame off this context's stack wherever it is
  (:func:`_unlink`), keeping the frames above it (rebuilt on the frame below), and record it.
  A frame that is not on this context's stack (closed from another thread or task) is recorded
  and kept out of the open-region report (``registry.closed_elsewhere``).
- **exception**: the same as exit; the exception propagates unchanged.
- **abandon** (:func:`abandon`): drop a region's innermost frame without recording it.
- **record**: the duration ``t1 - t0`` goes into the node's buffer (``node.add``); device
  regions also queue their event pair for the flush.

What "context" means: each ``contextvars.Context`` has its own stack. That is each thread, each
asyncio task (a task runs in a copy of the context current when it was created), each greenlet
(greenlet >= 1.0 gives every greenlet its own context), and each ``copy_context().run()``. A
copied context starts from the frame that was innermost at copy time: a task created inside
region ``A`` records its regions under ``A``, whatever its creator did since. A generator runs
in the context of whoever resumes it, so a decorated generator's frame opens and closes within
each resumption.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from instrument import clocks, observe, registry
from instrument.regions import native
from instrument.registry import ROOT, PathNode

if TYPE_CHECKING:
    from instrument.regions.region import Region

# (node, t0 in ns, parent frame, owner region, start event or None)
Frame = tuple[PathNode, int, Any, Any, Any]
ROOT_FRAME: Frame = (ROOT, 0, None, None, None)
_frame: ContextVar[Frame] = ContextVar("instrument_frame", default=ROOT_FRAME)

#: The innermost frame of this context, and making a frame the innermost (C: get_top/set_top).
_get, _set = native.frame_accessors(_frame, ROOT_FRAME)


def current_path() -> str:
    """The path of the innermost open region in this context ("" at top level)."""
    return _get()[0].path


def _same(a: Frame, b: Frame) -> bool:
    return a is b or (a[3] is b[3] and a[1] == b[1] and a[0] is b[0])


def _unlink(frame: Frame) -> bool:
    """Take ``frame`` off this context's stack, wherever it is (exit by token); False if it
    is not on this context's stack (closed from another thread or task, or already gone)."""
    top = _get()
    if top is frame:
        _set(frame[2])
        return True
    above: list[Frame] = []
    current: Frame | None = top
    while current is not None and not _same(current, frame):
        above.append(current)
        current = current[2]
    if current is None:
        return False
    rebuilt = current[2]
    for f in reversed(above):
        rebuilt = (f[0], f[1], rebuilt, f[3], f[4])
    _set(rebuilt)
    return True


def abandon(region: Region) -> None:
    """Drop ``region``'s innermost open frame in this context without recording it."""
    top = _get()
    if top[3] is region:
        _set(top[2])


def _close(frame: Frame) -> None:
    """Stop timing ``frame``: read the clock(s), unlink it, record the duration."""
    owner = frame[3]
    if owner.mode == "sync":
        clocks.synchronize()
    start_event = frame[4]
    end_event = clocks.record_event() if start_event is not None else None
    t1 = owner._now()
    if owner._observed or observe._open or observe.trace is not None:
        observe.exited(frame, t1)
    if not _unlink(frame):  # it stays on its own context's stack: never report it as open
        registry.closed_elsewhere(frame[0], frame[1])
    node = frame[0]
    if end_event is not None:
        registry.pending.append((node, start_event, end_event, clocks.cuda.current_device()))
    node.add(t1 - frame[1])
