"""Manual timers: a region started and stopped by hand."""

from __future__ import annotations

from instrument._warn import deprecated
from instrument.regions.frames import Frame, close
from instrument.regions.region import Region, region_for


class Timer:
    """A region started and stopped by hand, for code that cannot use ``with``.

    Args:
        name: The region's name (or a :class:`Region`).
        clock: As for :func:`instrument.timed`.
        level: As for :func:`instrument.timed`.

    Example:
        >>> t = instrument.Timer("checkpoint")
        >>> t.start()
        >>> ...  # regions entered here nest under "checkpoint"
        >>> t.stop()
    """

    __slots__ = ("_frame", "_running", "region")

    def __init__(self, name: str | Region, *, clock: object = None, level: int = 0) -> None:
        if isinstance(name, Region):
            if clock is not None or level:
                raise ValueError("Timer(region) takes the region's clock and level: pass none")
            region = name
        else:
            region = region_for(name, clock, level)
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
            close(frame)

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<Timer {self.name!r} {state}>"


def timer(name: str, *, clock: object = None, level: int = 0) -> Timer:
    """Deprecated spelling of :class:`Timer` (``Timer(name, clock=, level=)``)."""
    deprecated("instrument.timer()", "instrument.Timer(name) (the same object)")
    return Timer(name, clock=clock, level=level)
