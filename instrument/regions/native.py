"""Which code runs: every place where the C accelerator (:mod:`instrument._speedups`)
replaces a Python definition of this package, in this one file.

The Python code of :mod:`instrument.regions` is the definition (the state machine is
documented in :mod:`instrument.regions.frames`); the C functions accelerate it and implement
the same semantics. Each function below returns (or installs) the C version when the extension
is loaded and leaves the Python definition in place otherwise (no extension built, or
``INSTRUMENT_NO_EXTENSIONS=1``). Its callers, one line each, are the only swap points:

- ``frames._get`` / ``frames._set`` (:func:`frame_accessors`): ``get_top`` / ``set_top``;
- ``CpuRegion.__enter__/__exit__`` and ``SkippedRegion.__enter__/__exit__``
  (:func:`install_region_methods`): ``RegionBase._cpu_enter/_cpu_exit/_skip_enter/_skip_exit``;
- the region fields (``region.RegionBase``): ``speedups.RegionBase`` (:func:`region_base`);
- the decorator's sync call wrapper and wrapt's ``enabled=`` flag
  (:func:`sync_wrapper`, :func:`enabled_flag`): ``CallTimer``, ``Active``;
- ``timed`` itself (:func:`fast_timed`): ``Dispatch``, which answers ``timed("name")`` for a
  cached region without a Python-level call.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from instrument._native import speedups

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _context_layout_is_known(native: Any) -> bool:
    """Whether the C path reads "inside Context.run()" right on this Python (checked once:
    false in a fresh thread, true inside ``copy_context().run``); else it keeps every frame
    in the context variable, as the pure-Python path does."""
    outside: list[bool] = []

    def read_outside() -> None:
        contextvars.ContextVar("instrument_probe").get(None)  # make the thread's own context
        outside.append(native.context_run_active())

    probe = threading.Thread(target=read_outside)
    probe.start()
    probe.join()
    inside = contextvars.copy_context().run(native.context_run_active)
    return outside == [False] and inside is True


def frame_accessors(var: ContextVar[T], root: T) -> tuple[Callable[[], T], Callable[[T], object]]:
    """``(get, set)`` of this context's innermost frame: the context variable's own methods,
    or the C ``get_top`` / ``set_top`` bound to it."""
    if speedups is None:
        return var.get, var.set
    speedups.bind_stack(var, root)
    speedups.bind_thread_stack(_context_layout_is_known(speedups))
    return speedups.get_top, speedups.set_top


def region_base(python_base: type) -> type:
    """The class holding a region's fields: ``python_base`` or the C ``RegionBase``."""
    return python_base if speedups is None else speedups.RegionBase


def install_region_methods(cpu: type, skipped: type) -> None:
    """Replace the host-clock ``CpuRegion`` and the ``SkippedRegion`` enter/exit written in
    Python by the C ones, and tell the C call wrapper which classes those are."""
    if speedups is None:
        return
    base = speedups.RegionBase
    cpu.__enter__ = base._cpu_enter  # type: ignore[attr-defined]
    cpu.__exit__ = base._cpu_exit  # type: ignore[attr-defined]
    skipped.__enter__ = base._skip_enter  # type: ignore[attr-defined]
    skipped.__exit__ = base._skip_exit  # type: ignore[attr-defined]
    speedups.bind(time.perf_counter_ns, cpu, skipped)


def sync_wrapper(region: object) -> Callable[..., Any] | None:
    """The C wrapper timing each call of a plain function as ``region`` (None: use Python's)."""
    return None if speedups is None else speedups.CallTimer(region)


def enabled_flag(region: object) -> Any:
    """wrapt's ``enabled=``: with C, falsy while ``region`` is skipped, so wrapt calls the
    function directly; None (always enabled) in pure Python."""
    return None if speedups is None else speedups.Active(region)


def fast_timed(timed: F, by_name: dict[str, Any]) -> F:
    """``timed`` answering ``timed("name")`` from ``by_name`` in C, else calling ``timed``."""
    if speedups is None:
        return timed
    return functools.update_wrapper(speedups.Dispatch(by_name, timed), timed)  # type: ignore[return-value]
