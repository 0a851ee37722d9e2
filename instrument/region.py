"""``timed()``: one object that is a context manager and a decorator — the hot path.

A region's state while it runs is a *frame* ``(node, t0, parent_frame, owner, event)``
held in a context variable, so the region stack follows threads and asyncio tasks (each
task has its own context), while durations land in the shared path tree of
:mod:`instrument.registry`. Entering reads the clock once and sets the context variable;
exiting reads it again, restores the parent frame and appends the duration to the path's
buffer. No lock, no device synchronization, one small tuple.

Each ``timed(name, clock=, level=)`` key resolves to one cached region object whose class
says what it does under the current configuration (:class:`CpuRegion`,
:class:`CudaRegion`, :class:`SyncRegion`, or :class:`SkippedRegion` when disabled or above
the configured level). ``configure()``, ``enable()`` and ``disable()`` swap the classes of
the live regions, so nothing is decided per call that could be decided once.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import time
import warnings
from collections.abc import AsyncGenerator, Callable, Generator
from contextvars import ContextVar
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

import wrapt

from instrument import _fields, _state, clocks, observe, registry
from instrument._native import speedups
from instrument.registry import CHUNK, ROOT, PathNode, fold

# (node, t0 in ns, parent frame, owner region, start event or None)
Frame = tuple[PathNode, int, Any, Any, Any]
ROOT_FRAME: Frame = (ROOT, 0, None, None, None)
_frame: ContextVar[Frame] = ContextVar("instrument_frame", default=ROOT_FRAME)
_get = _frame.get
_set = _frame.set

F = TypeVar("F", bound=Callable[..., Any])
CPU = "cpu"
#: How long ``timed(name, barrier=True)`` waits for the other ranks by default.
BARRIER_TIMEOUT = timedelta(seconds=300)

_warned: set[str] = set()
_lock = threading.Lock()


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


def current_path() -> str:
    """The path of the innermost open region in this context ("" at top level)."""
    return _get()[0].path


def check_name(name: object) -> str:
    """Validate a region name: a non-empty string without '/'."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"region name must be a non-empty string, got {name!r}")
    if "/" in name:
        raise ValueError(
            f"region name {name!r} contains '/'; '/' separates path levels, "
            "so nest regions instead (timed('a') around timed('b') records 'a/b')"
        )
    return name


def check_level(level: object) -> int:
    """Validate a region level: an int >= 0."""
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise ValueError(f"region level must be an int >= 0, got {level!r}")
    return level


def warn_once(key: str, message: str, *, stacklevel: int = 3) -> None:
    """Warn ``message`` (a ``RuntimeWarning``) the first time ``key`` is seen in this process;
    ``instrument.testing.reset()`` forgets the keys. ``stacklevel`` is as for ``warnings.warn``
    called here."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _same(a: Frame, b: Frame) -> bool:
    return a is b or (a[3] is b[3] and a[1] == b[1] and a[0] is b[0])


def _unlink(frame: Frame) -> bool:
    """Take ``frame`` off this context's stack, wherever it is (exit by token); False if it
    is not on this context's stack (closed from another thread or task, or already gone)."""
    top = _get()
    if top is frame:
        _set(frame[2])
        return True
    above: list[Frame] = []
    current: Frame | None = top
    while current is not None and not _same(current, frame):
        above.append(current)
        current = current[2]
    if current is None:
        return False
    rebuilt = current[2]
    for f in reversed(above):
        rebuilt = (f[0], f[1], rebuilt, f[3], f[4])
    _set(rebuilt)
    return True


def abandon(region: Region) -> None:
    """Drop ``region``'s innermost open frame in this context without recording it."""
    top = _get()
    if top[3] is region:
        _set(top[2])


def _close(frame: Frame) -> None:
    """Stop timing ``frame``: read the clock(s), unlink it, record the duration."""
    owner = frame[3]
    if owner.mode == "sync":
        clocks.synchronize()
    start_event = frame[4]
    end_event = clocks.record_event() if start_event is not None else None
    t1 = owner._now()
    if owner._observed or observe._open or observe.trace is not None:
        observe.exited(frame, t1)
    if not _unlink(frame):  # it stays on its own context's stack: never report it as open
        registry.closed_elsewhere(frame[0], frame[1])
    node = frame[0]
    if end_event is not None:
        registry.pending.append((node, start_event, end_event, clocks.cuda.current_device()))
    node.add(t1 - frame[1])


class _PyRegionBase:
    """A region's fields (the C accelerator's ``RegionBase`` holds the same)."""

    __slots__ = ("_now", "clock", "level", "name")

    name: str
    clock: object
    level: int
    _now: Callable[[], int]

    if not TYPE_CHECKING:  # the C RegionBase's typed fields (instrument/_fields.py)

        def __setattr__(self, name: str, value: Any) -> None:
            _fields.check("region", _fields.REGION, name, value, registry.NodeBase)
            object.__setattr__(self, name, value)

        def __delattr__(self, name: str) -> None:
            _fields.check_delete("region", _fields.REGION, name)
            object.__delattr__(self, name)


if TYPE_CHECKING or speedups is None:  # noqa: SIM108 - mypy needs the plain class here
    RegionBase = _PyRegionBase
else:
    RegionBase = speedups.RegionBase


class Region(RegionBase):
    """A named region: ``with region:`` or ``@region``. Built by :func:`timed`."""

    __slots__ = ()
    mode: ClassVar[str | None] = None
    _observed: ClassVar[bool] = False  # also traced / NVTX / profiler ranges (observe.py)

    def __init__(self, name: str, clock: object = None, level: int = 0) -> None:
        self.name = name
        self.clock = clock
        self.level = level
        self._now = _state.now

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call is timed as this region."""
        return decorate(func, self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def __enter__(self) -> Region:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def _open(self) -> Frame | None:
        """Start timing in this context; the frame to give to :func:`_close` (None: skipped)."""
        parent = _get()
        node = parent[0].children.get(self.name)
        if node is None:
            node = parent[0].child(self.name, self.level, self.mode or CPU)
        mode = self.mode
        if mode == "sync":
            clocks.synchronize()
        event = clocks.record_event() if mode == "cuda" else None
        frame: Frame = (node, self._now(), parent, self, event)
        _set(frame)
        if self._observed:
            observe.entered(self, frame)
        return frame

    def _exit_top(self) -> None:
        """Close this region's innermost frame in this context (the ``with`` exit)."""
        top = _get()
        if top[3] is self:
            _close(top)
            return
        frame: Frame | None = top[2]
        while frame is not None and frame[3] is not self:
            frame = frame[2]
        if frame is None:
            warn_once(
                f"exit:{self.name}",
                f"instrument: region {self.name!r} was exited without a matching enter in this "
                "context (entered in another thread or task?); nothing was recorded",
            )
            return
        _close(frame)

    def _call(self, wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        frame = self._open()
        try:
            return wrapped(*args, **kwargs)
        finally:
            if frame is not None:
                _close(frame)


class CpuRegion(Region):
    """A region on the host clock: the fastest path, written out in full."""

    __slots__ = ()
    mode = CPU

    def __enter__(self) -> Region:
        parent = _get()
        node = parent[0].children.get(self.name)
        if node is None:
            node = parent[0].child(self.name, self.level, CPU)
        _set((node, self._now(), parent, self, None))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        t1 = self._now()
        frame = _get()
        if frame[3] is not self or frame[4] is not None:
            self._exit_top()
            return
        _set(frame[2])
        node = frame[0]
        buf = node.buf
        buf.append(t1 - frame[1])
        if len(buf) >= CHUNK:
            fold(node)


class DeviceRegion(Region):
    """A region on the "cuda" or "sync" clock (rarely as hot as a host region)."""

    __slots__ = ()

    def __enter__(self) -> Region:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit_top()


class CudaRegion(DeviceRegion):
    """Host time plus a pair of pooled CUDA events, resolved at flush."""

    __slots__ = ()
    mode = "cuda"


class SyncRegion(DeviceRegion):
    """Synchronize the device at both ends, then read the host clock."""

    __slots__ = ()
    mode = "sync"


class ObservedCpuRegion(DeviceRegion):
    """A host-clock region while something watches (trace, NVTX, profiler): the generic
    path, which tells :mod:`instrument.observe` about each enter and exit."""

    __slots__ = ()
    mode = CPU
    _observed = True


class ObservedCudaRegion(CudaRegion):
    """A "cuda" region while something watches."""

    __slots__ = ()
    _observed = True


class ObservedSyncRegion(SyncRegion):
    """A "sync" region while something watches."""

    __slots__ = ()
    _observed = True


class SkippedRegion(Region):
    """Disabled, or above the configured level: costs a call and a return."""

    __slots__ = ()
    mode = None

    def __enter__(self) -> Region:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if _get()[3] is self:  # entered while enabled, exited after disable()
            _close(_get())

    def _open(self) -> Frame | None:
        return None


if speedups is not None:
    # The C accelerator's host-clock enter/exit replace the Python ones written above.
    CpuRegion.__enter__ = speedups.RegionBase._cpu_enter  # type: ignore[method-assign]
    CpuRegion.__exit__ = speedups.RegionBase._cpu_exit  # type: ignore[method-assign]
    SkippedRegion.__enter__ = speedups.RegionBase._skip_enter  # type: ignore[method-assign]
    SkippedRegion.__exit__ = speedups.RegionBase._skip_exit  # type: ignore[method-assign]
    speedups.bind(_frame, ROOT_FRAME, time.perf_counter_ns, CpuRegion, SkippedRegion)
    _get = speedups.get_top
    _set = speedups.set_top
    speedups.bind_thread_stack(_context_layout_is_known(speedups))

_MODE_CLASSES: dict[str, type[Region]] = {
    "cpu": CpuRegion,
    "cuda": CudaRegion,
    "sync": SyncRegion,
}
_OBSERVED_CLASSES: dict[str, type[Region]] = {
    "cpu": ObservedCpuRegion,
    "cuda": ObservedCudaRegion,
    "sync": ObservedSyncRegion,
}

# default-option regions by name (the fast lookup), others by (name, clock, level)
_by_name: dict[str, Region] = {}
_by_key: dict[tuple[str, object, int], Region] = {}


def apply(region: Region, *, warn: bool = False) -> None:
    """Give ``region`` the behaviour the current configuration asks for (``warn``: say once
    when its explicit device clock falls back to the host clock)."""
    cls: type[Region]
    if not _state.enabled or (_state.level is not None and region.level > _state.level):
        cls = SkippedRegion
    else:
        mode = _state.mode if region.clock is None else clocks.resolve(region.clock, warn=warn)[0]
        cls = (_OBSERVED_CLASSES if observe.watches(region) else _MODE_CLASSES)[mode]
    region._now = _state.now
    region.__class__ = cls


def apply_all() -> None:
    """Re-resolve every live region (after ``configure``, ``enable`` or ``disable``)."""
    with _lock:
        regions = (*_by_name.values(), *_by_key.values())
    for region in regions:
        apply(region)


def region_for(name: str, clock: object = None, level: int = 0) -> Region:
    """The one cached region for this key, created and resolved on first use."""
    if clock is None and level == 0:
        found = _by_name.get(name)
        if found is not None:
            return found
    check_name(name)
    check_level(level)
    if clock is not None:
        clocks.check_clock(clock)
    with _lock:
        if clock is None and level == 0:
            region = _by_name.get(name)
            if region is None:
                region = _by_name[name] = Region(name)
                apply(region)
        else:
            key = (name, clock, level)
            region = _by_key.get(key)
            if region is None:
                region = _by_key[key] = Region(name, clock, level)
                apply(region, warn=True)
    return region


class _NamedByFunction:
    """``timed()`` / ``timed(clock=...)`` with no name: a decorator naming by ``__qualname__``."""

    __slots__ = ("clock", "level")

    def __init__(self, clock: object, level: int) -> None:
        self.clock = clock
        self.level = level

    def __call__(self, func: F) -> F:
        return decorate(func, region_for(_qualname(func), self.clock, self.level))

    def __enter__(self) -> None:
        raise TypeError("timed() needs a name when used as a context manager: timed('name')")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ always raises
        return None


def _qualname(func: Any) -> str:
    target = getattr(func, "__func__", func)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"cannot name a region after {func!r}; pass timed('name') explicitly")
    return name.replace("/", ".")


def _is_decoratable(obj: object) -> bool:
    return callable(obj) or isinstance(obj, (classmethod, staticmethod))


@overload
def timed(name: F, /) -> F: ...
@overload
def timed(name: str, /, *, clock: object = None, level: int = 0, nvtx: bool = False) -> Region: ...
@overload
def timed(
    name: str,
    /,
    *,
    clock: object = None,
    level: int = 0,
    nvtx: bool = False,
    barrier: bool,
    barrier_group: Any = None,
    barrier_timeout: timedelta | float = ...,
) -> BarrierRegion: ...
@overload
def timed(name: None = None, /, *, clock: object = None, level: int = 0) -> _NamedByFunction: ...
def timed(
    name: Any = None,
    /,
    *,
    clock: object = None,
    level: int = 0,
    nvtx: bool = False,
    barrier: bool = False,
    barrier_group: Any = None,
    barrier_timeout: timedelta | float = BARRIER_TIMEOUT,
) -> Any:
    """Time a block or a function as a region of the timing tree.

    Args:
        name: The region's name (no '/'); nested regions record "outer/inner". As a bare
            decorator (``@timed``) the name is the function's ``__qualname__``.
        clock: "cpu", "cuda", "sync", "auto", or a ``Clock``; ``None`` follows
            ``instrument.configure(clock=...)``.
        level: Regions above the configured level (``configure(level=...)``) are skipped.
        nvtx: Also push an NVTX range named like the region on each enter (Nsight
            Systems), from now on for every use of this name; ``configure(nvtx=True)`` does
            it for all regions. A no-op (warned once) without a CUDA build of torch.
        barrier: Wait at a barrier of ``barrier_group`` before the region starts (Megatron's
            ``timers(name, barrier=True)``), never longer than ``barrier_timeout``; the wait
            is recorded as the child ``<name>/barrier``, outside the region's own time.

    Example:
        >>> import instrument
        >>> @instrument.timed("forward")
        ... def forward(x):
        ...     return x * 2
        >>> with instrument.timed("step"):
        ...     y = forward(3)
    """
    if nvtx:
        if not isinstance(name, str):
            raise TypeError("timed(..., nvtx=True) needs a region name: timed('name', ...)")
        observe.add_nvtx_region(region_for(check_name(name), clock, level))
    if barrier:
        if not isinstance(name, str):
            raise TypeError("timed(..., barrier=True) needs a region name: timed('name', ...)")
        return BarrierRegion(
            region_for(check_name(name), clock, level), barrier_group, barrier_timeout
        )
    if clock is None and level == 0 and isinstance(name, str):
        region = _by_name.get(name)
        if region is not None:
            return region
    if name is None:
        check_level(level)
        if clock is not None:
            clocks.check_clock(clock)
        return _NamedByFunction(clock, level)
    if not isinstance(name, str) and _is_decoratable(name):
        return decorate(name, region_for(_qualname(name), clock, level))
    return region_for(check_name(name), clock, level)


if speedups is not None:
    # Same function, minus the Python-level call for the common ``timed("name")``.
    timed = functools.update_wrapper(speedups.Dispatch(_by_name, timed), timed)


# -- regions behind a barrier -------------------------------------------------------------


class BarrierRegion:
    """``timed(name, barrier=True)``: wait at a barrier (with a timeout, never a hang), then
    time the region. The wait lands in the child ``<name>/barrier``, marked concurrent and
    taken before the region's clock starts, so a fast rank's region is not inflated by
    waiting for the slow ones (the Megatron-LM #742 complaint). Skipped while disabled."""

    __slots__ = ("group", "region", "timeout")

    def __init__(self, region: Region, group: Any, timeout: timedelta | float) -> None:
        self.region = region
        self.group = group
        self.timeout = timeout

    def wait(self) -> None:
        """Wait at the barrier and record the wait under ``<name>/barrier``."""
        from instrument.distributed.barrier import barrier_with_timeout

        region = self.region
        if region.mode is None:
            return
        parent = _get()[0]
        node = parent.children.get(region.name) or parent.child(
            region.name, region.level, region.mode
        )
        waited = node.children.get("barrier") or node.child("barrier", region.level, CPU)
        registry.mark_concurrent(waited)
        start = _state.now()
        barrier_with_timeout(self.timeout, self.group)
        waited.add(_state.now() - start)

    def __enter__(self) -> BarrierRegion:
        self.wait()
        self.region.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.region.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call waits at the barrier, then is timed."""

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<BarrierRegion {self.region.name!r}>"


# -- decorators ---------------------------------------------------------------------------


def decorate(func: F, region: Region) -> F:
    """Wrap ``func`` (function, method, classmethod, staticmethod, coroutine or generator
    function) so that each call — each resumption, for generators — is timed as ``region``."""
    target = getattr(func, "__func__", func)
    if inspect.iscoroutinefunction(target):
        wrapper = _async_wrapper(region)
    elif inspect.isasyncgenfunction(target):
        wrapper = _async_generator_wrapper(region)
    elif inspect.isgeneratorfunction(target):
        wrapper = _generator_wrapper(region)
    else:
        wrapper = _sync_wrapper(region)
    # With the C path, wrapt itself calls ``func`` directly while the region is skipped.
    enabled = speedups.Active(region) if speedups is not None else None
    return wrapt.FunctionWrapper(func, wrapper, enabled)  # type: ignore[return-value]


def _sync_wrapper(region: Region) -> Callable[..., Any]:
    if speedups is not None:
        return speedups.CallTimer(region)  # type: ignore[no-any-return]
    name = region.name

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        r = region
        if r.__class__ is not CpuRegion:
            if r.mode is None:
                return wrapped(*args, **kwargs)
            return r._call(wrapped, args, kwargs)
        parent = _get()
        node = parent[0].children.get(name)
        if node is None:
            node = parent[0].child(name, r.level, CPU)
        now = r._now
        t0 = now()
        _set((node, t0, parent, r, None))
        try:
            return wrapped(*args, **kwargs)
        finally:
            t1 = now()
            _set(parent)
            buf = node.buf
            buf.append(t1 - t0)
            if len(buf) >= CHUNK:
                fold(node)

    return wrapper


def _async_wrapper(region: Region) -> Callable[..., Any]:
    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        frame = region._open()
        try:
            return await wrapped(*args, **kwargs)
        finally:
            if frame is not None:
                _close(frame)

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
        try:
            item = gen.send(sent) if thrown is None else gen.throw(thrown)
        except StopIteration as stop:
            return stop.value
        finally:
            if frame is not None:
                _close(frame)
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
        try:
            item = await (agen.asend(sent) if thrown is None else agen.athrow(thrown))
        except StopAsyncIteration:
            return
        finally:
            if frame is not None:
                _close(frame)
        try:
            sent = yield item
            thrown = None
        except GeneratorExit:
            await agen.aclose()
            raise
        except BaseException as exc:
            sent, thrown = None, exc


# -- manual timers ------------------------------------------------------------------------


class Timer:
    """A region started and stopped by hand, for code that cannot use ``with``.

    Example:
        >>> t = instrument.timer("checkpoint")
        >>> t.start()
        >>> ...  # regions entered here nest under "checkpoint"
        >>> t.stop()
    """

    __slots__ = ("_frame", "_running", "region")

    def __init__(self, region: Region) -> None:
        self.region = region
        self._frame: Frame | None = None
        self._running = False

    @property
    def name(self) -> str:
        """The region's name."""
        return self.region.name

    @property
    def running(self) -> bool:
        """True between ``start()`` and ``stop()``."""
        return self._running

    def start(self) -> Timer:
        """Start the region; raises ``RuntimeError`` if it is already running."""
        if self._running:
            raise RuntimeError(
                f"timer {self.name!r} is already running; call stop() before start()"
            )
        self._frame = self.region._open()
        self._running = True
        return self

    def stop(self) -> None:
        """Stop the region and record it; raises ``RuntimeError`` if it was not started."""
        if not self._running:
            raise RuntimeError(f"timer {self.name!r} was stopped without being started")
        frame, self._frame, self._running = self._frame, None, False
        if frame is not None:
            _close(frame)

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<Timer {self.name!r} {state}>"


def timer(name: str, *, clock: object = None, level: int = 0) -> Timer:
    """A manual :class:`Timer` for region ``name`` (``start()`` / ``stop()``)."""
    return Timer(region_for(name, clock, level))


# -- spans: work timed outside the region stack -------------------------------------------


class Span:
    """Work that starts here and ends elsewhere — an async collective until its ``wait()``,
    a future until its callback. It is recorded under ``name`` below the current path, but
    never enters the region stack, so regions opened meanwhile do not nest under it; its
    path is marked *concurrent* (it overlaps its siblings). ``end()`` may run on any thread;
    only the first call records.
    """

    __slots__ = ("_event", "_now", "_t0", "node")

    def __init__(self, name: str, nbytes: int = 0, *, parent: PathNode | None = None) -> None:
        region = region_for(name)
        mode = region.mode
        under = _get()[0] if parent is None else parent
        node = under.children.get(name)
        if node is None:
            node = under.child(name, region.level, mode or CPU)
        registry.mark_concurrent(node)
        self.node: PathNode | None = node if mode is not None else None
        if mode is None:  # disabled: record nothing
            self._event, self._now, self._t0 = None, _state.now, 0
            return
        if nbytes:
            registry.add_bytes(node, nbytes)
        self._event = clocks.record_event() if mode == "cuda" else None
        self._now = region._now
        self._t0 = self._now()

    def end(self) -> None:
        """Record the time since the span started (device time too, on the "cuda" clock)."""
        node, self.node = self.node, None
        if node is None:
            return
        if self._event is not None:
            registry.pending.append(
                (node, self._event, clocks.record_event(), clocks.cuda.current_device())
            )
        node.add(self._now() - self._t0)
