"""Manual timers: a region started and stopped by hand."""

from __future__ import annotations

from instrument.regions.frames import Frame, close
from instrument.regions.region import Region, region_for


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
            close(frame)

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<Timer {self.name!r} {state}>"


def timer(name: str, *, clock: object = None, level: int = 0) -> Timer:
    """A manual :class:`Timer` for region ``name`` (``start()`` / ``stop()``)."""
    return Timer(region_for(name, clock, level))
