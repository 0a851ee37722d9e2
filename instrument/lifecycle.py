"""The reporters' part in the process's life: which reporters are live, the last flush when
the process ends, and a working state in a forked child.

**Exit.** ``atexit`` delivers the last interval of every live reporter at a normal exit, at
``sys.exit``, after an uncaught exception and after Ctrl-C (``KeyboardInterrupt``). That
flush is this rank's own report only: the other ranks may be gone, so no barrier and no
gather.

**SIGTERM and SIGHUP** (how torchrun, Slurm and Kubernetes stop a job; a closed terminal)
end a Python process at once by default, without ``atexit``. While their disposition is
the default one, the first reporter created in the main thread installs a handler for each
(and every flush in the main thread puts it back if something reset the default): it runs
the same exit flush — in a helper thread, waited for at most :data:`SIGNAL_FLUSH_TIMEOUT`
seconds, so a lock the interrupted main thread holds can delay the end but never hang it —
then restores the default action and sends the signal again, so the process still dies of
it (exit status ``-15`` to Python's ``subprocess``, ``143`` in a shell). A second signal
while that flush runs ends the process at once. A handler of your own (installed before or
after ``instrument``) is never replaced, wrapped or swallowed: it runs as you wrote it and
owns the signal; if it ends the process with ``sys.exit`` or an exception, the exit flush
delivers the last interval. A handler installed later that calls the one it replaced
(``instrument``'s, as Lightning's signal connector does) gets a no-op from it, never an
abrupt end: the handler decides. A handler that ends the process with ``os._exit`` (or
re-raises with the default action) should call ``reporter.close()`` first. An ignored
signal (``SIG_IGN``, e.g. under ``nohup``) stays ignored.

**Fork.** Nothing in a flush imports a module lazily (a child forked while another thread
imports would inherit a held import lock), and a forked child gets fresh locks
(:class:`ForkSafeLock`), so a child forked at any moment — even in the middle of another
thread's flush — can record regions and flush.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from instrument import registry

try:  # the C function that signal.getsignal wraps: the raw handler, no enum made per call
    from _signal import getsignal as _raw_getsignal  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - CPython always has it
    _raw_getsignal = signal.getsignal

if TYPE_CHECKING:
    from instrument.reporter import Reporter

logger = logging.getLogger("instrument")

#: The signals whose default action would end the process without the exit flush.
SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
#: How long a signal waits for the last flush before the process dies anyway (seconds).
SIGNAL_FLUSH_TIMEOUT = 10.0


class ForkSafeLock:
    """A lock that a forked child gets fresh: the parent may have held it while forking
    (another thread in the middle of a flush), and the child has no thread to release it.

    For locks of the flush path and of registration, never of the hot path."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _fork_locks.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


_fork_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()
#: Objects a forked child inherited in a state it must not touch (a file object whose
#: internal lock another thread of the parent held): kept alive, never used or closed.
inherited: list[object] = []
#: The live reporters in the order they were made, weakly held: ``instrument.step()``
#: ticks them in that order, the same on every rank. A tuple replaced under the lock at
#: each change and read without it, at every step (a dropped reporter is skipped there, and
#: left out at the next change).
_live: tuple[weakref.ref[Reporter], ...] = ()
_live_lock = ForkSafeLock()
_reporter_made = False
_cross_rank_made = itertools.count()


def track(reporter: Reporter) -> None:
    """``reporter`` is live: ``instrument.step()`` ticks it and the exit flushes it."""
    global _reporter_made, _live
    with _live_lock:
        _live = (*(ref for ref in _live if ref() is not None), weakref.ref(reporter))
        _reporter_made = True
    install_signal_handlers()


def cross_rank_channel() -> str:
    """The name of a new reporter that combines ranks, by the order this process made such
    reporters: "" for the first, then "2", "3"... The same reporter of every rank has the
    same name when the ranks make their reporters in the same order."""
    with _live_lock:
        nth = next(_cross_rank_made)
    return "" if nth == 0 else str(nth + 1)


def reporter_made() -> bool:
    """True once this process made a reporter (which reports at its close and at exit)."""
    return _reporter_made


def forget(reporter: Reporter) -> None:
    """``reporter`` is closed or detached."""
    global _live
    with _live_lock:
        _live = tuple(ref for ref in _live if ref() not in (None, reporter))


def live_reporters() -> tuple[Reporter, ...]:
    """The reporters that ``instrument.step()`` ticks, in the order they were made."""
    found: list[Reporter] = []
    for ref in _live:  # (a loop: a step pays for this, and a generator costs twice as much)
        reporter = ref()
        if reporter is not None:
            found.append(reporter)
    return tuple(found)


def _flush_at_exit() -> None:
    """Nothing is lost at normal interpreter exit: every live reporter flushes once more."""
    for reporter in live_reporters():
        try:
            reporter._close_at_exit()
        except Exception:
            logger.exception("instrument: the flush at exit of %r failed", reporter)


atexit.register(_flush_at_exit)


# -- signals -------------------------------------------------------------------------------

_flushing_for_signal = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGTERM / SIGHUP whose default action was to end the process: the exit flush, then
    the default action."""
    global _flushing_for_signal
    if signal.getsignal(signum) is not _on_signal:
        return  # called by a handler installed later, which owns the signal (see above)
    if not _flushing_for_signal and registry.held_here():
        # the signal interrupted this thread inside the registry (making a path, folding a
        # buffer): a helper thread would wait for it; the lock lets this thread in again
        _flushing_for_signal = True
        _flush_at_exit()
    elif not _flushing_for_signal:  # a second signal during the flush: die at once
        _flushing_for_signal = True
        helper = threading.Thread(target=_flush_at_exit, name="instrument-signal-flush")
        helper.daemon = True
        helper.start()
        helper.join(SIGNAL_FLUSH_TIMEOUT)
        if helper.is_alive():
            logger.error(
                "instrument: the last flush on %s did not finish in %.0f s; ending without it",
                signal.Signals(signum).name,
                SIGNAL_FLUSH_TIMEOUT,
            )
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal could not end the process (blocked)


def install_signal_handlers() -> None:
    """Handle SIGTERM and SIGHUP where their disposition is the default one; leave every
    other handler (the user's own, ``SIG_IGN``, one installed from C) alone. A no-op outside
    the main thread of the main interpreter (only it may set handlers)."""
    for signum in SIGNALS:
        handler = _getsignal(signum)  # raw: SIG_DFL is the int 0, not the enum
        if isinstance(handler, int) and handler == _SIG_DFL:
            try:
                signal.signal(signum, _on_signal)
            except ValueError:  # not the main thread of the main interpreter
                return


_getsignal: Callable[[int], Any] = _raw_getsignal
_SIG_DFL = int(signal.SIG_DFL)


# -- fork ----------------------------------------------------------------------------------


def _after_fork_in_child() -> None:
    """A forked child starts with every lock free (and may flush again on a signal)."""
    global _flushing_for_signal
    for lock in tuple(_fork_locks):
        lock._renew()
    _flushing_for_signal = False


os.register_at_fork(after_in_child=_after_fork_in_child)
