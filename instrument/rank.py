"""Which rank this process is: the one lookup every part of the package uses.

``torch.distributed`` is looked up when asked, not bound at import, so a test that replaces
``torch.distributed`` with a stub module (as NeMo's unit tests do) is answered by that stub,
exactly as the upstream timers the compat modules port are. A stub without
``is_available`` / ``is_initialized`` but with ``get_rank`` stands for a running process
group (upstream calls ``get_rank()`` / ``get_world_size()`` on it directly). With the real
module this is ``dist.get_rank()`` once ``init_process_group`` has run; the torchrun
variables (``RANK``, ``LOCAL_RANK``) are never read here.

Example:
    >>> from instrument.rank import rank, rank_and_world
    >>> rank(), rank(default=-1), rank_and_world()          # no process group
    (0, -1, (0, 1))
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["WorldWatch", "group_ready", "rank", "rank_and_world"]

#: The real ``torch.distributed`` (``None`` where this build has none).
_REAL: Any = getattr(torch, "distributed", None)


class WorldWatch:
    """Tells whether the default process group is still the one seen last, without keeping
    it alive: a process group held past ``destroy_process_group()`` keeps gloo's worker
    threads running into interpreter shutdown, where one that still has to free a tensor
    aborts the process (``terminate called without an active exception``).

    Example:
        >>> watch = WorldWatch()
        >>> watch.changed(dist.group.WORLD)   # True the first time, then after a new group
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: Callable[[], Any] | None = None  # a weak reference, or one to None

    def changed(self, world: Any) -> bool:
        """Whether ``world`` (a group or ``None``) is another object than last time; then
        it is remembered."""
        seen = self._seen
        if world is None:
            same = seen is _no_group
        else:  # a group that died answers None: another group than ``world`` then
            same = seen is not None and seen is not _no_group and seen() is world
        if same:
            return False
        self._seen = _no_group if world is None else weakref.ref(world)
        return True


def _no_group() -> None:
    return None


#: ``rank_and_world()``'s last answer with the three functions it asked (the same objects,
#: on the same default group, give the same answer).
_cached: tuple[Any, Any, Any, tuple[int, int]] | None = None
_cached_world = WorldWatch()


def _dist() -> Any:
    """Whatever ``torch.distributed`` is right now (the real module or a test's stub)."""
    return getattr(torch, "distributed", None)


def group_ready() -> bool:
    """Whether ``torch.distributed`` answers rank questions: a real module with an initialized
    default group, or a stub module that has ``get_rank``."""
    dist = _dist()
    if dist is None:
        return False
    is_available = getattr(dist, "is_available", None)
    is_initialized = getattr(dist, "is_initialized", None)
    if is_available is None and is_initialized is None:
        return callable(getattr(dist, "get_rank", None))
    if is_available is not None and not is_available():
        return False
    return is_initialized is None or bool(is_initialized())


def rank(group: Any = None, *, default: int = 0) -> int:
    """This process's rank in ``group`` (``None``: the world), or ``default`` without a
    process group (0 for the package; DeepSpeed's printing asks for -1)."""
    if not group_ready():
        return default
    dist = _dist()
    return int(dist.get_rank() if group is None else dist.get_rank(group))


def rank_and_world() -> tuple[int, int]:
    """This process's global rank and the world size; ``(0, 1)`` without a process group.

    With the real ``torch.distributed`` the answer is kept until its default group (or one
    of the functions asked) is another object: a flush does not walk ``torch.distributed``.
    """
    global _cached
    dist = _dist()
    if dist is None or dist is not _REAL:  # a stub module: ask it every time
        return _rank_and_world()
    try:
        world = dist.distributed_c10d._world._default_pg
    except AttributeError:  # no process groups in this build, or another torch layout
        return _rank_and_world()
    cached = _cached
    if (
        not _cached_world.changed(world)
        and cached is not None
        and cached[0] is dist.is_initialized
        and cached[1] is dist.get_rank
        and cached[2] is dist.get_world_size
    ):
        return cached[3]
    answer = _rank_and_world()
    _cached = (dist.is_initialized, dist.get_rank, dist.get_world_size, answer)
    return answer


def _rank_and_world() -> tuple[int, int]:
    if not group_ready():
        return 0, 1
    dist = _dist()
    return int(dist.get_rank()), int(dist.get_world_size())
