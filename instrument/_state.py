"""Process-wide switches, read on the hot path with one attribute load.

Only :mod:`instrument.config` writes these; everything else reads them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Global switch; ``instrument.disable()`` clears it.
enabled: bool = True

#: Regions whose level is above this are skipped; ``None`` records every level.
level: int | None = None

#: The clock name asked for by ``configure(clock=...)`` ("auto", "cpu", "cuda", "sync"),
#: or a user ``Clock`` object.
requested_clock: object = "auto"

#: The resolved default clock mode: "cpu", "cuda" or "sync".
mode: str = "cpu"

#: The host clock in integer nanoseconds (``perf_counter_ns`` unless a ``Clock`` is injected).
now: Callable[[], int] = time.perf_counter_ns

#: Print the tree of what was recorded at exit when no Reporter was made
#: (``configure(exit_summary=False)`` or ``INSTRUMENT_EXIT_SUMMARY=0`` turns it off).
exit_summary: bool = os.environ.get("INSTRUMENT_EXIT_SUMMARY", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
