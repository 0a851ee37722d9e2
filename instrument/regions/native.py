"""Which code runs: every place where the C accelerator (:mod:`instrument._speedups`)
replaces a Python definition of this package, in this one file.

The Python code of :mod:`instrument.regions` is the definition (the state machine is
documented in :mod:`instrument.regions.frames`); the C functions accelerate it and implement
the same semantics. Each function below returns (or installs) the C version when the extension
is loaded and leaves the Python definition in place otherwise (no extension built, or
``INSTRUMENT_NO_EXTENSIONS=1``). Its callers, one line each, are the only swap points:

- ``frames.get_top`` / ``frames.set_top`` (:func:`frame_accessors`): ``get_top`` / ``set_top``;
- ``CpuRegion.__enter__/__exit__`` and ``SkippedRegion.__enter__/__exit__``
  (:func:`install_region_methods`): ``RegionBase._cpu_enter/_cpu_exit/_skip_enter/_skip_exit``,
  descriptors that bind to the same builtin method of a region every time (a ``with``
  allocates no bound method);
- the region fields (``region.RegionBase``): ``speedups.RegionBase`` (:func:`region_base`);
- the decorator's sync call wrapper and wrapt's ``enabled=`` flag
  (:func:`sync_wrapper`, :func:`enabled_flag`): ``CallTimer``, ``Active``;
- the decorator's wrapt type (:func:`function_wrapper`): around a ``CallTimer``, the
  subclasses of wrapt's C ``FunctionWrapper`` made by ``timed_function_types``, whose call
  times the function directly instead of through wrapt's generic wrapper call;
- ``timed`` itself (:func:`fast_timed`): ``Dispatch``, which answers ``timed("name")`` for a
  cached region without a Python-level call;
- ``torch.autograd.backward`` timed by ``auto`` (:func:`backward_call`): ``BackwardCall``,
  the wrapper of :mod:`instrument.hooks.backward` when nothing is compiled around it;
- ``optimizer.step`` timed by ``auto`` (:func:`step_guard`): ``StepGuard``, the guard of
  :mod:`instrument.hooks.optim` in a plain eager step;
- the optimizer's step hooks while that guard runs (:func:`stand_aside`): ``StandAside``,
  and the call state both read (:func:`step_call`): ``StepCall``;
- a reporter's steps (:func:`step_counter`): ``StepCounter``, the state machine of
  :mod:`instrument.stepcounter` (ended by ``auto``'s optimizer step without a Python frame).
"""

from __future__ import annotations

import functools
import os
import time
import types
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import wrapt

from instrument._native import speedups

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def frame_accessors(var: ContextVar[T], root: T) -> tuple[Callable[[], T], Callable[[T], object]]:
    """``(get, set)`` of this context's innermost frame: the context variable's own methods,
    or the C ``get_top`` / ``set_top`` bound to it."""
    if speedups is None:
        return var.get, var.set
    speedups.bind_stack(var, root)
    if not os.environ.get("INSTRUMENT_GENERIC_CONTEXT"):
        # per-context stack holders where the layout is known and confirmed; otherwise (or
        # with INSTRUMENT_GENERIC_CONTEXT=1) every transition sets the variable
        speedups.use_holders()
    return speedups.get_top, speedups.set_top


def region_base(python_base: type) -> type:
    """The class holding a region's fields: ``python_base`` or the C ``RegionBase``."""
    return python_base if speedups is None else speedups.RegionBase


def install_region_methods(cpu: type, skipped: type, timed_coroutine: Callable[..., Any]) -> None:
    """Replace the host-clock ``CpuRegion`` and the ``SkippedRegion`` enter/exit written in
    Python by the C ones, and tell the C call wrapper which classes those are and what
    times a coroutine that a timed call returned."""
    if speedups is None:
        return
    base = speedups.RegionBase
    cpu.__enter__ = base._cpu_enter  # type: ignore[attr-defined]
    cpu.__exit__ = base._cpu_exit  # type: ignore[attr-defined]
    skipped.__enter__ = base._skip_enter  # type: ignore[attr-defined]
    skipped.__exit__ = base._skip_exit  # type: ignore[attr-defined]
    speedups.bind(time.perf_counter_ns, cpu, skipped, timed_coroutine)


def sync_wrapper(region: object) -> Callable[..., Any] | None:
    """The C wrapper timing each call of a plain function as ``region`` (None: use Python's)."""
    return None if speedups is None else speedups.CallTimer(region)


def enabled_flag(region: object) -> Any:
    """wrapt's ``enabled=``: with C, falsy while ``region`` is skipped, so wrapt calls the
    function directly; None (always enabled) in pure Python."""
    return None if speedups is None else speedups.Active(region)


def _timed_function_types() -> tuple[type, ...] | None:
    """``(for plain functions, for other callables, bound)`` wrapt types calling a
    ``CallTimer``'s function directly; None without C, or where wrapt runs without its own
    C types (``WRAPT_DISABLE_EXTENSIONS``)."""
    if speedups is None:
        return None
    try:
        return speedups.timed_function_types(  # type: ignore[no-any-return]
            wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper
        )
    except TypeError:
        return None


timed_types = _timed_function_types()


def function_wrapper(func: object, wrapper: object, python: type) -> type:
    """The wrapt type that wraps ``func`` with ``wrapper``: ``python`` (a wrapt
    ``FunctionWrapper``), or with C around a ``CallTimer`` one calling ``func`` directly
    (for a plain Python function, also a method descriptor, so ``obj.method()`` makes no
    bound wrapper)."""
    if timed_types is None or not isinstance(wrapper, speedups.CallTimer):  # type: ignore[union-attr]
        return python
    return timed_types[0 if isinstance(func, types.FunctionType) else 1]


def fast_timed(timed: F, by_name: dict[str, Any]) -> F:
    """``timed`` answering ``timed("name")`` from ``by_name`` in C, else calling ``timed``."""
    if speedups is None:
        return timed
    return functools.update_wrapper(speedups.Dispatch(by_name, timed), timed)  # type: ignore[return-value]


def step_counter(python: type, state: types.ModuleType, registry: types.ModuleType) -> type:
    """The class counting a reporter's steps: ``python`` or the C ``StepCounter``, bound to
    the modules whose clock (``state.now``) and ``registry.stepping_thread`` it uses."""
    if speedups is None:
        return python
    speedups.bind_steps(state, registry)
    return speedups.StepCounter  # type: ignore[no-any-return]


def backward_call(
    python: F,
    region: object,
    original: object,
    compiling: Callable[[], object],
    graph_task: Callable[[], int],
    namespace: dict[str, Any],
) -> F:
    """``python`` (``auto``'s ``backward`` wrapper), or with C a ``BackwardCall`` doing what it
    does when ``compiling()`` is None (no compiled code runs around it): a call outside
    ``region`` and autograd's engine (``graph_task() == -1``) sets ``namespace["_parent"]``
    and times ``original`` in the host-clock ``region``; any other call is ``python``'s."""
    if speedups is None:
        return python
    fast = speedups.BackwardCall(python, region, original, compiling, graph_task, namespace)
    return functools.update_wrapper(fast, python)  # type: ignore[return-value]


def step_guard(
    python: F,
    region: object,
    call: object,
    hooks: object,
    own: Callable[..., Any] | None,
    compiling: Callable[[], object],
) -> F:
    """``python`` (``auto``'s ``optimizer.step`` guard), or with C a ``StepGuard`` doing what
    it does for a step without arguments while ``compiling()`` is None, ``region`` is on the
    host clock and not open, and neither ``call.running`` nor ``hooks._scaled`` is set:
    ``call.running`` and ``call.guarded`` set around ``own()`` (or the class's ``step``)
    timed in ``region``, then ``hooks.on_step()`` after the ticking optimizer's step; any
    other call is ``python``'s. Binds like a function."""
    if speedups is None:
        return python
    fast = speedups.StepGuard(python, region, call, hooks, own, compiling)
    return functools.update_wrapper(fast, python)  # type: ignore[return-value]


def stand_aside(call: object, hook: F) -> F:
    """``hook`` (an optimizer step hook of ``auto``, which does nothing while ``call.guarded``),
    or with C a ``StandAside`` returning None then without calling it."""
    if speedups is None:
        return hook
    return speedups.StandAside(call, hook)  # type: ignore[no-any-return]


def step_call(python: type) -> type:
    """The class of an optimizer's step-call state (``running``, ``guarded``, ``entered``,
    ``nested``): ``python``, or the C ``StepCall`` whose flags the C guard and step hooks
    read in place."""
    return python if speedups is None else speedups.StepCall
