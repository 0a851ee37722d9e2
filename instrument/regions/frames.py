"""The region stack: where the innermost open region of this context lives, and how a
region's frame enters and leaves it. This is the definition; the C accelerator
(:mod:`instrument.regions.native`) implements the same functions, never a second semantics.

A *frame* is one open region: a :class:`Frame` ``(node, t0, parent, owner, event)`` — its
path node in :mod:`instrument.registry`, the start time in ns, the frame it was opened under,
the region object that opened it, and its start CUDA event (or None). Python reads its fields
by name; the C accelerator builds frames of the same type (it takes the type from
``ROOT_FRAME`` when the stack is bound) and reads them by position. The innermost frame is held
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
- **exit by token** (:func:`close`, used by decorators, ``Timer.stop`` and hooks that keep the
  frame they opened): take exactly that frame off this context's stack wherever it is
  (:func:`unlink`), keeping the frames above it (rebuilt on the frame below), and record it.
  A frame that is not on this context's stack (closed from another thread or task) is recorded
  and kept out of the open-region report (``registry.closed_elsewhere``).
- **exception**: the same as exit; the exception propagates unchanged.
- **clock error**: a clock that raises on enter opens nothing (the error propagates before
  the block or call runs). A clock that raises on exit still closes the frame (the stack
  stays consistent) and records nothing; its error propagates only if the block or call
  itself succeeded — an exception of the block is never replaced. The same for ``with``,
  decorators and ``Timer``, on both paths.
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

The C path (``get_top`` / ``set_top`` in ``instrument/_speedups.c``) keeps exactly these
stacks without setting the variable on every transition: the variable holds, once per
context, a small mutable *stack holder* owned by that context, and a transition swaps the
holder's innermost frame in place — but only while no other context can see the holder (its
owner is the running context, and no copy of the context shares the mapping that reaches it).
When one can (the context was copied: a task was created, ``copy_context()`` was called), the
old holder is left untouched — it keeps the frame of copy time for the copy — and the
context gets a fresh holder, which is one ordinary variable set. So every context reads
what it would read in pure Python. Two consequences, neither visible in results: holding a
Python reference to a holder (``_frame.get()`` read directly) makes its owner take the slow
path (a set per transition) while the reference lives; and a holder references its owner
context, so the stack of a thread that ended with regions open is freed by the garbage
collector rather than at once. Where CPython's context layout is not known (other versions)
the C path sets the variable to the frame itself on every transition, as this module does.
On 3.10 to 3.13 the C path also refills a closed frame that nothing else references,
and its start-time int, instead of allocating new ones: a frame or a start time that Python
code holds is never reused, so no one can see the difference.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

from instrument import clocks, observe, registry
from instrument.regions import native
from instrument.registry import ROOT, PathNode

if TYPE_CHECKING:
    from instrument.regions.region import Region


class Frame(NamedTuple):
    """One open region (see the module doc). Frames are immutable: a stack is its innermost
    frame, and ``parent`` links it to the rest."""

    node: PathNode  #: the region's path node
    t0: int  #: the start time, in ns of the owner's clock
    parent: Any  #: the frame it was opened under (a Frame; None for the root frame)
    owner: Any  #: the region object that opened it (None for the root frame)
    event: Any  #: its start CUDA event, or None


ROOT_FRAME = Frame(ROOT, 0, None, None, None)
#: ``new_frame(Frame, (node, t0, parent, owner, event))``: a Frame made without the
#: NamedTuple's keyword-argument constructor (a third of its cost; the Python hot paths').
new_frame = tuple.__new__
_frame: ContextVar[Frame] = ContextVar("instrument_frame", default=ROOT_FRAME)

#: ``get_top()``: the innermost frame of this context; ``set_top(frame)``: make ``frame``
#: the innermost (the C accelerator's functions of the same names where it is built).
get_top, set_top = native.frame_accessors(_frame, ROOT_FRAME)


def current_path() -> str:
    """The path of the innermost open region in this context ("" at top level)."""
    return get_top().node.path


def _same(a: Frame, b: Frame) -> bool:
    return a is b or (a.owner is b.owner and a.t0 == b.t0 and a.node is b.node)


def unlink(frame: Frame) -> bool:
    """Take ``frame`` off this context's stack, wherever it is (exit by token); False if it
    is not on this context's stack (closed from another thread or task, or already gone)."""
    top = get_top()
    if top is frame:
        set_top(frame.parent)
        return True
    above: list[Frame] = []
    current: Frame | None = top
    while current is not None and not _same(current, frame):
        above.append(current)
        current = current.parent
    if current is None:
        return False
    rebuilt = current.parent
    for f in reversed(above):
        rebuilt = f._replace(parent=rebuilt)
    set_top(rebuilt)
    return True


def abandon(region: Region) -> None:
    """Drop ``region``'s innermost open frame in this context without recording it."""
    top = get_top()
    if top.owner is region:
        set_top(top.parent)


def drop(frame: Frame) -> None:
    """Stop timing ``frame`` without recording it: unlink it, end its observer ranges."""
    if frame.owner._observed or observe.open_ranges:
        try:
            observe.exited(frame, frame.owner._now())
        except Exception:  # instrumentation must not replace the call's outcome
            pass
    unlink(frame)


def close(frame: Frame, failing: bool = False) -> None:
    """Stop timing ``frame``: read the clock(s), unlink it, record the duration.

    If the clock raises, ``frame`` is unlinked and nothing is recorded; the clock's error
    propagates unless the block itself is ``failing`` (raising), whose exception then
    propagates unchanged."""
    owner = frame.owner
    if owner.mode == "sync":
        clocks.synchronize()
    start_event = frame.event
    end_event = clocks.record_event() if start_event is not None else None
    try:
        t1 = owner._now()
    except BaseException:
        unlink(frame)
        if failing:
            return
        raise
    if owner._observed or observe.open_ranges or observe.trace is not None:
        observe.exited(frame, t1)
    if not unlink(frame):  # it stays on its own context's stack: never report it as open
        registry.closed_elsewhere(frame.node, frame.t0)
    node = frame.node
    if end_event is not None:
        registry.pending.append((node, start_event, end_event, clocks.cuda.current_device()))
    node.add(t1 - frame.t0)
