"""Decorators: time each call of a function — each resumption, for generators — as a region.

:func:`decorate` picks the wrapper by the kind of function (plain, coroutine, generator,
async generator) and wraps it with ``wrapt`` so methods, classmethods and staticmethods keep
working. Every wrapper opens and closes a frame through :mod:`instrument.regions.frames`.
"""

from __future__ import annotations

import copyreg
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from types import CoroutineType
from typing import Any, SupportsIndex, TypeVar

import wrapt

import instrument.regions.region as region_module
from instrument.regions import native
from instrument.regions.frames import Frame, close, get_top, new_frame, set_top
from instrument.regions.region import CPU, CpuRegion, Region, region_for, timed_coroutine
from instrument.registry import CHUNK, fold

F = TypeVar("F", bound=Callable[..., Any])


def _by_reference(timed: Any) -> str:
    """Pickle a timed function by reference, as a plain function is: by its qualified
    name, which its module holds (so ``Pool.map`` and ``ProcessPoolExecutor`` take it)."""
    return str(timed.__qualname__)


class TimedFunction(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """wrapt's ``FunctionWrapper``, pickled by reference."""

    def __reduce_ex__(self, protocol: SupportsIndex) -> str:
        return _by_reference(self)


for _type in (native.timed_types or ())[:2]:  # the C wrapper types, pickled by reference
    copyreg.pickle(_type, _by_reference)


def decorate(func: F, region: Region) -> F:
    """Wrap ``func`` (function, method, classmethod, staticmethod, coroutine or generator
    function) so that each call — each resumption, for generators — is timed as ``region``."""
    target = _behind(func)
    enabled = None  # the wrapper always runs: a generator or coroutine made while the region
    # is skipped is timed from the first resumption after it is back, on both paths
    if inspect.iscoroutinefunction(target):
        wrapper = _async_wrapper(region)
    elif inspect.isasyncgenfunction(target):
        wrapper = _async_generator_wrapper(region)
    elif inspect.isgeneratorfunction(target):
        wrapper = _generator_wrapper(region)
    else:
        wrapper = _sync_wrapper(region)
        # With the C path, wrapt itself calls ``func`` directly while the region is skipped,
        # and a ``CallTimer`` gets a wrapt type that calls ``func`` without wrapt's call.
        enabled = native.enabled_flag(region)
    wrapper_type = native.function_wrapper(func, wrapper, TimedFunction)
    return wrapper_type(func, wrapper, enabled)  # type: ignore[no-any-return]


def _behind(func: object) -> object:
    """The function whose kind (coroutine, generator...) says how ``func`` is timed: the
    one behind a method, a ``functools.partial`` or a callable object's ``__call__`` (an
    object whose ``__call__`` is ``async def`` is timed until its coroutine ends)."""
    target = getattr(func, "__func__", func)
    while isinstance(target, functools.partial):
        target = target.func
    if callable(target) and not inspect.isroutine(target) and not inspect.isclass(target):
        target = type(target).__call__
    return target


def direct_call(func: F, region: Region) -> F | None:
    """``func`` timed as ``region`` by the C call wrapper — one call that enters the region,
    calls ``func`` and exits, cheaper than a ``with`` block around the call — or None where
    there is none (pure Python, generator and coroutine functions): time it with ``with``."""
    if native.timed_types is None:
        return None
    target = getattr(func, "__func__", func)
    if not inspect.isfunction(target) or (
        inspect.iscoroutinefunction(target)
        or inspect.isasyncgenfunction(target)
        or inspect.isgeneratorfunction(target)
    ):
        return None
    timed = decorate(func, region)
    return timed if isinstance(timed, native.timed_types) else None


def in_region(func: Callable[..., Any], region: Region) -> Callable[..., Any]:
    """``func`` called inside a ``with region`` block: where :func:`direct_call` gives none
    (the pure path, generator and coroutine functions)."""

    def in_region(*args: Any, **kwargs: Any) -> Any:
        with region:
            return func(*args, **kwargs)

    return in_region


class NamedByFunction:
    """``timed()`` / ``timed(clock=...)`` with no name: a decorator naming by ``__qualname__``."""

    __slots__ = ("clock", "level")

    def __init__(self, clock: object, level: int) -> None:
        self.clock = clock
        self.level = level

    def __call__(self, func: F) -> F:
        return decorate(func, region_for(qualname(func), self.clock, self.level))

    def __enter__(self) -> None:
        raise TypeError("timed() needs a name when used as a context manager: timed('name')")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None


def qualname(func: Any) -> str:
    target = getattr(func, "__func__", func)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"cannot name a region after {func!r}; pass timed('name') explicitly")
    return name.replace("/", ".")


def is_decoratable(obj: object) -> bool:
    return callable(obj) or isinstance(obj, (classmethod, staticmethod))


def _sync_wrapper(region: Region) -> Callable[..., Any]:
    fast = native.sync_wrapper(region)  # the C CallTimer does what ``wrapper`` below does
    if fast is not None:
        return fast
    name = region.name

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        r = region
        if r.__class__ is not CpuRegion:
            if r.mode is None:
                return wrapped(*args, **kwargs)
            return r._call(wrapped, args, kwargs)
        parent = get_top()
        node = parent.node.children.get(name)
        if node is None:
            node = parent.node.child(name, r.level, CPU)
        now = r._now
        t0 = now()
        set_top(new_frame(Frame, (node, t0, parent, r, None)))
        ok = False
        try:
            result = wrapped(*args, **kwargs)
            ok = True
        finally:
            try:
                t1 = now()
            except BaseException:
                set_top(parent)
                if ok:  # the clock's error; never in place of the call's own
                    raise
            else:
                set_top(parent)
                if not ok or type(result) is not CoroutineType:
                    buf = node.buf
                    buf.append(t1 - t0)
                    if len(buf) >= CHUNK:
                        fold(node)
        if type(result) is CoroutineType:  # the await is the call, not the coroutine's making
            return timed_coroutine(r, result)
        return result

    return wrapper


def _async_wrapper(region: Region) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        return timed_coroutine(region, wrapped(*args, **kwargs))

    return wrapper


def _generator_wrapper(region: Region) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        return _timed_generator(region, wrapped(*args, **kwargs))

    return wrapper


def _timed_generator(region: Region, gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """Drive ``gen``, timing each resumption (each ``next``/``send``/``throw``) as ``region``."""
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        frame = region._open()
        ok = False
        try:
            item = gen.send(sent) if thrown is None else gen.throw(thrown)
            ok = True
        except StopIteration as stop:
            ok = True
            return stop.value
        finally:
            if frame is not None:
                close(frame, failing=not ok)
        try:
            sent = yield item
            thrown = None
        except GeneratorExit:
            gen.close()
            raise
        except BaseException as exc:  # forwarded into the generator, as yield-from does
            sent, thrown = None, exc


def _async_generator_wrapper(region: Region) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        return _timed_async_generator(region, wrapped(*args, **kwargs))

    return wrapper


async def _timed_async_generator(
    region: Region, agen: AsyncGenerator[Any, Any]
) -> AsyncGenerator[Any, Any]:
    """Drive ``agen``, timing each resumption as ``region``."""
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        frame = region._open()
        ok = False
        try:
            item = await (agen.asend(sent) if thrown is None else agen.athrow(thrown))
            ok = True
        except StopAsyncIteration:
            ok = True
            return
        finally:
            if frame is not None:
                close(frame, failing=not ok)
        try:
            sent = yield item
            thrown = None
        except GeneratorExit:
            await agen.aclose()
            raise
        except BaseException as exc:
            sent, thrown = None, exc


region_module.decorate = decorate  # what ``@region`` calls (Region.__call__)
