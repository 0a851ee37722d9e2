"""The reporters' part in the process's life: which reporters are live, and the last flush
when the interpreter exits.

``atexit`` delivers the last interval of every live reporter at a normal exit, at
``sys.exit``, after an uncaught exception and after Ctrl-C (``KeyboardInterrupt``). That
flush is this rank's own report only: the other ranks may be gone, so no barrier and no
gather.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from instrument.reporter import Reporter

logger = logging.getLogger("instrument")

_live: weakref.WeakSet[Reporter] = weakref.WeakSet()
_live_lock = threading.Lock()


def track(reporter: Reporter) -> None:
    """``reporter`` is live: ``instrument.step()`` ticks it and the exit flushes it."""
    with _live_lock:
        _live.add(reporter)


def forget(reporter: Reporter) -> None:
    """``reporter`` is closed or detached."""
    with _live_lock:
        _live.discard(reporter)


def live_reporters() -> tuple[Reporter, ...]:
    """The reporters that ``instrument.step()`` ticks."""
    with _live_lock:
        return tuple(_live)


def _flush_at_exit() -> None:
    """Nothing is lost at normal interpreter exit: every live reporter flushes once more."""
    for reporter in live_reporters():
        try:
            reporter._close_at_exit()
        except Exception:
            logger.exception("instrument: the flush at exit of %r failed", reporter)


atexit.register(_flush_at_exit)
