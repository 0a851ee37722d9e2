"""What the timing itself costs: one region's enter and exit on this machine, measured once.

A report's :class:`~instrument.report.SelfCost` multiplies it by the regions that ended in
the interval and adds the previous flush's own time; the share of the interval's time that
makes is the first line of ``Report.render()`` (``instrument: 0.3 % of the interval``).

Regions entered through ``instrument.auto``'s hooks (a module's timed ``forward``, the
optimizer's step hooks, the patched ``backward``...) cost several times a plain ``with``
region. ``auto`` registers their names with :func:`count_hooked`, and the calls of those
paths are counted apart, at the cost of one hooked region (measured once, at the first
flush that has any, by the calibration ``auto`` registers: :mod:`instrument.hooks.cost`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from itertools import compress
from operator import attrgetter

from instrument.regions import frames
from instrument.regions.region import CpuRegion
from instrument.registry import Collected, PathNode

#: Calls timed per calibration round (a round takes well under a millisecond in C).
CALLS = 1000
ROUNDS = 5

_name = attrgetter("name")

_region_ns: float | None = None

#: The region names each live ``auto()`` handle enters through its hooks; a removed
#: handle's names still count at the next :func:`count` (what its hooks recorded).
_hooked: list[frozenset[str]] = []
_retired: list[frozenset[str]] = []
#: The union of ``_hooked`` and ``_retired``, made at the first :func:`count` after either
#: changed (``None``: to be made again).
_names: frozenset[str] | None = None
_hook_calibration: Callable[[], float] | None = None
_hook_ns: float | None = None


def region_ns() -> float:
    """One region's enter + exit in ns on this machine and path (C or pure Python): the
    fastest of a few rounds of ``with timed(...)``, less the fastest empty loop, measured
    at the first call and kept."""
    global _region_ns
    if _region_ns is None:
        _region_ns = _calibrate()
    return _region_ns


def hook_ns() -> float:
    """One region entered through ``auto``'s hooks, in ns (the hook's whole cost, the
    region's included): measured by the registered calibration at the first call while
    names are registered, and kept; 0.0 while none are."""
    global _hook_ns
    if not (_hooked or _retired) or _hook_calibration is None:
        return 0.0
    if _hook_ns is None:
        _hook_ns = _hook_calibration()
    return _hook_ns


def reset() -> None:
    """Forget every registration and the hook calibration (the region's is kept: it is a
    property of the machine). For :func:`instrument.testing.reset`, after the handles
    were removed."""
    global _hook_calibration, _hook_ns, _names
    _names = None
    _hooked.clear()
    _retired.clear()
    _hook_calibration = _hook_ns = None


def count_hooked(names: Iterable[str], calibrate: Callable[[], float]) -> Callable[[], None]:
    """Count the calls of paths named ``names`` as entered through hooks, until the first
    :func:`count` after the returned undo runs (idempotent). ``calibrate()`` measures one
    such region in ns (called once)."""
    global _hook_calibration, _names
    entry = frozenset(names)
    _names = None
    _hooked.append(entry)
    _hook_calibration = calibrate
    done = False

    def undo() -> None:  # (the union of _hooked and _retired stays the same)
        nonlocal done
        if not done:
            done = True
            _hooked.remove(entry)
            _retired.append(entry)

    return undo


def count(collected: Collected) -> tuple[int, int]:
    """The calls that ended in an interval: ``(plain regions, regions entered through
    hooks)``, the latter being those of paths named as :func:`count_hooked` registered."""
    global _names
    hooked_names = _names
    if hooked_names is None:
        hooked_names = _names = frozenset().union(*_hooked, *_retired)
    if _retired:  # counted once more, now forgotten
        _retired.clear()
        _names = None
    if not hooked_names:
        return collected.regions, 0
    counts = collected.host.counts  # (iterated in C: no bytecode per path)
    hooked = sum(compress(counts, map(hooked_names.__contains__, map(_name, collected.nodes))))
    return collected.regions - hooked, hooked


def _calibrate() -> float:
    """Time ``with`` regions recorded under a private root: the tree, the open regions and
    what was recorded stay as they were."""
    scratch = PathNode("", None)
    name = "(calibration)"
    scratch.children[name] = PathNode(name, scratch)
    region = CpuRegion(name)  # the plain host-clock region: never traced or observed
    saved = frames.get_top()
    frames.set_top(frames.Frame(scratch, 0, None, None, None))
    empty, timed = [], []
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
            empty.append(t1 - t0)
            timed.append(t2 - t1)
    finally:
        frames.set_top(saved)
    return max(min(timed) - min(empty), 0) / CALLS
