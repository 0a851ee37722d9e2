"""``timed()``: the public factory — one object that is a context manager and a decorator."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

from instrument import clocks, observe
from instrument.regions import native
from instrument.regions.decorators import NamedByFunction, decorate, is_decoratable, qualname
from instrument.regions.region import Region, by_name, check_level, check_name, region_for

F = TypeVar("F", bound=Callable[..., Any])
#: How long ``timed(name, barrier=True)`` waits for the other ranks by default.
BARRIER_TIMEOUT = timedelta(seconds=300)


class BarrierTimed(Protocol):
    """What ``timed(name, barrier=True)`` returns: a region entered after a barrier
    (:class:`instrument.distributed.barrier_region.BarrierRegion`)."""

    def wait(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    def __call__(self, func: F) -> F: ...


#: Builds ``timed(name, barrier=True)``'s region. The distributed layer builds on the core,
#: not the reverse: :mod:`instrument.distributed.barrier_region` sets this when it is
#: imported, which ``import instrument`` does.
build_barrier_region: Callable[[Region, Any, timedelta | float], BarrierTimed] | None = None


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
) -> BarrierTimed: ...
@overload
def timed(name: None = None, /, *, clock: object = None, level: int = 0) -> NamedByFunction: ...
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
        if build_barrier_region is None:
            raise RuntimeError(
                "timed(..., barrier=True) needs instrument.distributed.barrier_region "
                "(imported by `import instrument`)"
            )
        return build_barrier_region(
            region_for(check_name(name), clock, level), barrier_group, barrier_timeout
        )
    if clock is None and level == 0 and isinstance(name, str):
        region = by_name.get(name)
        if region is not None:
            return region
    if name is None:
        check_level(level)
        if clock is not None:
            clocks.check_clock(clock)
        return NamedByFunction(clock, level)
    if not isinstance(name, str) and is_decoratable(name):
        return decorate(name, region_for(qualname(name), clock, level))
    return region_for(check_name(name), clock, level)


# With the C accelerator: the same function, minus the Python-level call for ``timed("name")``.
timed = native.fast_timed(timed, by_name)
