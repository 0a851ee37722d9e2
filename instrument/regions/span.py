"""Spans: work timed outside the region stack."""

from __future__ import annotations

from instrument import _state, clocks, registry
from instrument.regions.frames import get_top
from instrument.regions.region import CPU, region_for
from instrument.registry import PathNode


class Span:
    """Work that starts here and ends elsewhere — an async collective until its ``wait()``,
    a future until its callback. It is recorded under ``name`` below the current path, but
    never enters the region stack, so regions opened meanwhile do not nest under it; its
    path is marked *concurrent* (it overlaps its siblings), and its host interval is kept
    for the flush, which unites the intervals below each parent (``Node.concurrent_time``).
    ``end()`` may run on any thread; only the first call records.
    """

    __slots__ = ("_event", "_now", "_t0", "node")

    def __init__(self, name: str, nbytes: int = 0, *, parent: PathNode | None = None) -> None:
        region = region_for(name)
        mode = region.mode
        under = get_top().node if parent is None else parent
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
        t1 = self._now()
        node.add(t1 - self._t0)
        parent = node.parent
        if parent is not registry.ROOT and parent is not None:
            registry.spans.append((parent, self._t0, t1))
