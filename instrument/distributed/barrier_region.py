"""``timed(name, barrier=True)``: a region entered behind a barrier with a timeout."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from instrument import _state, registry
from instrument.distributed.barrier import barrier_with_timeout, timeout_seconds
from instrument.regions import timed
from instrument.regions.frames import get_top
from instrument.regions.region import CPU, Region

F = TypeVar("F", bound=Callable[..., Any])


class BarrierRegion:
    """``timed(name, barrier=True)``: wait at a barrier (with a timeout, never a hang), then
    time the region. The wait lands in the child ``<name>/barrier``, marked concurrent and
    taken before the region's clock starts, so a fast rank's region is not inflated by
    waiting for the slow ones (the complaint of NVIDIA/Megatron-LM#742). Skipped while disabled."""

    __slots__ = ("group", "region", "timeout")

    def __init__(self, region: Region, group: Any, timeout: timedelta | float) -> None:
        _check_timeout(timeout)
        self.region = region
        self.group = group
        self.timeout = timeout

    def wait(self) -> None:
        """Wait at the barrier and record the wait under ``<name>/barrier``."""
        region = self.region
        if region.mode is None:
            return
        parent = get_top().node
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


def _check_timeout(timeout: object) -> None:
    """Refuse a bad ``barrier_timeout`` when the region is built, not when it is entered."""
    accepted = "a number of seconds > 0 or a datetime.timedelta"
    try:
        timeout_seconds(timeout)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"barrier_timeout must be {accepted}, got {timeout!r}") from None
    except ValueError:
        raise ValueError(f"barrier_timeout must be {accepted}, got {timeout!r}") from None


timed.build_barrier_region = BarrierRegion
