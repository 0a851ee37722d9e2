"""What the timing itself costs: one region's enter and exit on this machine, measured once.

A report's :class:`~instrument.report.SelfCost` multiplies it by the regions that ended in
the interval and adds the previous flush's own time; the share of the interval's time that
makes is the first line of ``Report.render()`` (``instrument: 0.3 % of the interval``).
"""

from __future__ import annotations

import time

from instrument.regions import frames
from instrument.regions.region import CpuRegion
from instrument.registry import PathNode

#: Calls timed per calibration round (a round takes well under a millisecond in C).
CALLS = 1000
ROUNDS = 3

_region_ns: float | None = None


def region_ns() -> float:
    """One region's enter + exit in ns on this machine and path (C or pure Python): the
    fastest of a few rounds of ``with timed(...)`` over an empty loop, measured at the
    first call and kept."""
    global _region_ns
    if _region_ns is None:
        _region_ns = _calibrate()
    return _region_ns


def _calibrate() -> float:
    """Time ``with`` regions recorded under a private root: the tree, the open regions and
    what was recorded stay as they were."""
    scratch = PathNode("", None)
    name = "(calibration)"
    scratch.children[name] = PathNode(name, scratch)
    region = CpuRegion(name)  # the plain host-clock region: never traced or observed
    saved = frames._get()
    frames._set((scratch, 0, None, None, None))
    best = float("inf")
    try:
        for _ in range(ROUNDS):
            loop = range(CALLS)
            t0 = time.perf_counter_ns()
            for _ in loop:
                pass
            t1 = time.perf_counter_ns()
            for _ in loop:
                with region:
                    pass
            t2 = time.perf_counter_ns()
            best = min(best, max((t2 - t1) - (t1 - t0), 0) / CALLS)
    finally:
        frames._set(saved)
    return best
