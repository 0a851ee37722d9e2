"""Region objects: what ``timed(name)`` returns, one cached object per key.

Each ``timed(name, clock=, level=)`` key resolves to one cached region object whose class
says what it does under the current configuration (:class:`CpuRegion`,
:class:`CudaRegion`, :class:`SyncRegion`, or :class:`SkippedRegion` when disabled or above
the configured level). ``configure()``, ``enable()`` and ``disable()`` swap the classes of
the live regions, so nothing is decided per call that could be decided once. How a region
enters and exits the stack of its context is defined in :mod:`instrument.regions.frames`.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Callable, Coroutine
from types import CoroutineType, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from instrument import _fields, _state, clocks, observe, registry
from instrument._warn import warn_once
from instrument.regions import native
from instrument.regions.frames import Frame, close, drop, get_top, new_frame, set_top, unlink
from instrument.registry import CHUNK, OVERFLOW, fold
from instrument.report import FLUSH_ROW, OTHER_ROW

F = TypeVar("F", bound=Callable[..., Any])
CPU = "cpu"

lock = threading.Lock()


def _decorators_not_imported(func: Any, region: Region) -> Any:
    raise RuntimeError("instrument.regions.decorators is not imported")


#: ``decorate(func, region)`` behind ``@region``: :mod:`instrument.regions.decorators` builds on
#: this module, so it plugs its ``decorate`` in here when imported (``import instrument`` does).
decorate: Callable[[Any, Region], Any] = _decorators_not_imported


#: The names of instrument's own rows, which no region may take.
RESERVED_NAMES = (OTHER_ROW, FLUSH_ROW, OVERFLOW)


def check_name(name: object) -> str:
    """Validate a region name: a non-empty string of valid text without '/' or control
    characters, and not one of instrument's own rows."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"region name must be a non-empty string, got {name!r}")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(
            f"region name {name!r} contains a control character (a newline, a tab, ...); "
            "names print one per line in reports, so use printable characters only"
        )
    if "/" in name:
        raise ValueError(
            f"region name {name!r} contains '/'; '/' separates path levels, "
            "so nest regions instead (timed('a') around timed('b') records 'a/b')"
        )
    if name in RESERVED_NAMES:
        raise ValueError(
            f"region name {name!r} is reserved for instrument's own rows "
            f"({', '.join(map(repr, RESERVED_NAMES))}); pick another name"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"region name {name!r} is not valid text (a lone surrogate, as from a file name "
            "that is not UTF-8, which no report could print); decode it with "
            "errors='replace' first"
        ) from None
    return name


def check_level(level: object) -> int:
    """Validate a region level: an int >= 0."""
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise ValueError(f"region level must be an int >= 0, got {level!r}")
    return level


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


if TYPE_CHECKING:  # mypy needs the plain class here
    RegionBase = _PyRegionBase
else:
    RegionBase = native.region_base(_PyRegionBase)


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
        return decorate(func, self)  # type: ignore[no-any-return]

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
        """Start timing in this context; the frame to give to :func:`close` (None: skipped)."""
        parent = get_top()
        node = parent.node.children.get(self.name)
        if node is None:
            node = parent.node.child(self.name, self.level, self.mode or CPU)
        mode = self.mode
        if mode == "sync":
            clocks.synchronize()
        event = clocks.record_event() if mode == "cuda" else None
        frame = new_frame(Frame, (node, self._now(), parent, self, event))
        set_top(frame)
        if self._observed:
            observe.entered(self, frame)
        return frame

    def _innermost(self) -> Frame | None:
        """This region's innermost open frame in this context, or None."""
        frame: Frame | None = get_top()
        while frame is not None and frame.owner is not self:
            frame = frame.parent
        return frame

    def _exit_top(self, failing: bool = False) -> None:
        """Close this region's innermost frame in this context (the ``with`` exit;
        ``failing``: the block raised)."""
        frame = self._innermost()
        if frame is None:
            warn_once(
                f"exit:{self.name}",
                f"instrument: region {self.name!r} was exited without a matching enter in this "
                "context (entered in another thread or task?); nothing was recorded",
            )
            return
        close(frame, failing)

    def _drop_innermost(self) -> None:
        """Take this region's innermost frame off this context's stack, recording nothing
        (its exit clock failed)."""
        frame = self._innermost()
        if frame is not None:
            unlink(frame)

    def _call(self, wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        frame = self._open()
        ok = False
        try:
            result = wrapped(*args, **kwargs)
            ok = True
        finally:
            if frame is not None and not (ok and type(result) is CoroutineType):
                close(frame, failing=not ok)
        if type(result) is CoroutineType:  # the await is the call (timed_coroutine)
            if frame is not None:
                drop(frame)
            return timed_coroutine(self, result)
        return result


class CpuRegion(Region):
    """A region on the host clock: the fastest path, written out in full."""

    __slots__ = ()
    mode = CPU

    def __enter__(self) -> Region:
        parent = get_top()
        node = parent.node.children.get(self.name)
        if node is None:
            node = parent.node.child(self.name, self.level, CPU)
        set_top(new_frame(Frame, (node, self._now(), parent, self, None)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            t1 = self._now()
        except BaseException:
            self._drop_innermost()
            if exc_type is None:
                raise
            return
        frame = get_top()
        if frame.owner is not self or frame.event is not None:
            self._exit_top(exc_type is not None)
            return
        set_top(frame.parent)
        node = frame.node
        buf = node.buf
        buf.append(t1 - frame.t0)
        if len(buf) >= CHUNK:
            fold(node)


class GenericRegion(Region):
    """A region that runs the general enter/exit (:meth:`Region._open`, ``_exit_top``): the
    "cuda" and "sync" clocks and every observed region, host clock included (rarely as hot
    as a plain host region, which has its own short path)."""

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
        self._exit_top(exc_type is not None)


class CudaRegion(GenericRegion):
    """Host time plus a pair of pooled CUDA events, resolved at flush."""

    __slots__ = ()
    mode = "cuda"


class SyncRegion(GenericRegion):
    """Synchronize the device at both ends, then read the host clock."""

    __slots__ = ()
    mode = "sync"


class ObservedCpuRegion(GenericRegion):
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
        if get_top().owner is self:  # entered while enabled, exited after disable()
            close(get_top(), exc_type is not None)

    def _open(self) -> Frame | None:
        return None


async def timed_coroutine(region: Region, coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coroutine`` timed as ``region``, from its first resumption to its end: what a
    timed call returns in place of the coroutine it returned (an ``async def`` behind a
    plain callable, which ``inspect`` does not flag), as for a timed ``async def``."""
    frame = region._open()
    ok = False
    try:
        result = await coroutine
        ok = True
        return result
    finally:
        if frame is not None:
            close(frame, failing=not ok)


# With the C accelerator, CpuRegion's and SkippedRegion's enter/exit above are replaced.
native.install_region_methods(CpuRegion, SkippedRegion, timed_coroutine)

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
by_name: dict[str, Region] = {}
_by_key: dict[tuple[str, object, int], Region] = {}


def apply(region: Region, *, warn: bool = False) -> None:
    """Give ``region`` the behaviour the current configuration asks for (``warn``: say once
    when its explicit device clock falls back to the host clock)."""
    cls: type[Region]
    if not _state.enabled or (_state.level is not None and region.level > _state.level):
        cls = SkippedRegion
    else:
        mode = _state.mode if region.clock is None else clocks.resolve(region.clock, warn=warn)
        cls = (_OBSERVED_CLASSES if observe.watches(region) else _MODE_CLASSES)[mode]
    # a region's own Clock object is its host clock; else the configured one
    clock = region.clock
    region._now = clocks.reader(clock) if isinstance(clock, clocks.Clock) else _state.now
    region.__class__ = cls


def apply_all() -> None:
    """Re-resolve every live region (after ``configure``, ``enable`` or ``disable``)."""
    with lock:
        regions = (*by_name.values(), *_by_key.values())
    for region in regions:
        apply(region)


def region_for(name: str, clock: object = None, level: int = 0) -> Region:
    """The one cached region for this key, created and resolved on first use."""
    if clock is None and level == 0:
        found = by_name.get(name)
        if found is not None:
            return found
    check_name(name)
    check_level(level)
    if clock is not None:
        clocks.check_clock(clock)
    with lock:
        if clock is None and level == 0:
            region = by_name.get(name)
            if region is None:
                region = by_name[name] = Region(name)
                apply(region)
        else:
            key = (name, clock, level)
            region = _by_key.get(key)
            if region is None:
                region = _by_key[key] = Region(name, clock, level)
                apply(region, warn=True)
    return region
