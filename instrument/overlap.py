"""The time a set of intervals covers, overlaps counted once: what a parent's concurrent
children (async collectives, DDP's gradient buckets) take of it, in total."""

from __future__ import annotations

from collections.abc import Iterable

#: Disjoint pieces a :class:`Union` keeps before folding the older half into a length.
MAX_PIECES = 1024


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The disjoint union of ``(start, end)`` intervals, sorted (touching ones joined)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


class Union:
    """The union of intervals (integer ns) added so far, in bounded memory: at most
    :data:`MAX_PIECES` disjoint pieces, and past that all but the newest half folded into
    their length (``folded``) and a ``horizon`` before which later intervals count as covered
    already. Exact while the pieces stay under the bound, and after it for every interval
    that starts after the horizon (work started since the fold)."""

    __slots__ = ("folded", "horizon", "pieces")

    def __init__(self) -> None:
        self.folded = 0
        self.horizon: int | None = None
        self.pieces: list[tuple[int, int]] = []

    def add(self, intervals: Iterable[tuple[int, int]]) -> None:
        """Unite ``intervals`` (``start <= end``) with the union so far."""
        horizon = self.horizon
        if horizon is not None:
            intervals = [(max(s, horizon), e) for s, e in intervals if e > horizon]
        pieces = merged([*self.pieces, *intervals])
        if len(pieces) > MAX_PIECES:
            cut = len(pieces) - MAX_PIECES // 2
            old, pieces = pieces[:cut], pieces[cut:]
            self.folded += sum(end - start for start, end in old)
            self.horizon = old[-1][1]
        self.pieces = pieces

    def length(self) -> int:
        """The time covered (ns)."""
        return self.folded + sum(end - start for start, end in self.pieces)
