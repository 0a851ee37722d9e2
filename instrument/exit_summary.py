"""The tree at exit of a script that times regions without a Reporter.

A script that only uses ``@instrument.timed`` / ``with instrument.timed(...)`` gets one
report of everything it recorded since ``import instrument``, on stderr, when the
interpreter exits (normally, at ``sys.exit``, after an uncaught exception or Ctrl-C). It is
left out once the process has made a :class:`~instrument.Reporter` (``auto()`` makes one):
a reporter reports at its close and at exit itself. ``instrument.configure(exit_summary=
False)`` or ``INSTRUMENT_EXIT_SUMMARY=0`` in the environment turns it off; nothing is
printed while ``instrument.disable()`` is on or when nothing was recorded.

A forked child starts with nothing recorded (:mod:`instrument.registry`), and a worker
process of :mod:`multiprocessing` (a DataLoader worker, forked or spawned) never prints it:
the tree at exit is the main script's.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import sys

from instrument import _state, clocks, lifecycle, registry
from instrument.reporter import Reporter
from instrument.sinks.console import Console

logger = logging.getLogger("instrument")

#: When ``import instrument`` ran: the start of the interval the exit report covers.
_IMPORTED_WALL = clocks.wall_time()
_IMPORTED_NS = _state.now()


def wanted() -> bool:
    """True when the exit should print the tree: on, enabled, no reporter made, not a
    worker process, something recorded."""
    if not (_state.exit_summary and _state.enabled) or lifecycle.reporter_made():
        return False
    if multiprocessing.parent_process() is not None:  # a worker: the main script reports
        return False
    return any(node.has_records() for node in registry.walk())


def report_at_exit() -> None:
    """Print the tree of what was recorded, when :func:`wanted`; never raises."""
    try:
        if not wanted():
            return
        reporter = Reporter(every=None, sinks=[Console(sys.stderr)], memory=False)
        reporter._start_wall, reporter._start_ns = _IMPORTED_WALL, _IMPORTED_NS
        reporter._close_at_exit()
    except Exception:
        logger.exception("instrument: the report at exit failed")


atexit.register(report_at_exit)
