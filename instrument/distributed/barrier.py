"""Barriers that time out instead of hanging, and a CPU (gloo) group for metadata.

:func:`barrier_with_timeout` runs on the key-value store that ``init_process_group`` set up
(the TCPStore every rank already talks to), not through a backend collective. That is what
lets it time out cleanly on any backend: every rank that arrived learns *which* ranks did
not, a rank that arrives late learns at once that the barrier already gave up, and no
process group is left broken. ``dist.monitored_barrier`` does none of this: on a timeout
gloo closes every connection of the group, so each later collective on that group fails on
every rank, and only rank 0 learns which ranks were missing (see ``docs/distributed_helpers.md``).

:func:`metadata_group` is a gloo group over the ranks of a (typically NCCL) group, for
exchanging small CPU tensors and Python objects without touching the GPU.

Example:
    >>> if not barrier_with_timeout(timedelta(minutes=5)):
    ...     ...  # the log names the ranks that did not arrive; carry on without them
    >>> meta = metadata_group()  # collective the first time: call it on every rank
    >>> dist.all_gather_object(names, my_names, group=meta)
"""

from __future__ import annotations

import datetime
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch.distributed as dist

from instrument.hooks.collectives import suppressed
from instrument.rank import WorldWatch

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup

logger = logging.getLogger("instrument")

#: Added to a timed-out barrier's arrival count by the rank that declared the timeout, so a
#: rank arriving later sees a count above the group size and stops at once.
_GAVE_UP = 1 << 40

#: The store's "connection lost" error (a RuntimeError, like a wait's timeout).
NetworkError: type[Exception] = getattr(dist, "DistNetworkError", ConnectionError)


def dist_initialized() -> bool:
    """True when ``torch.distributed`` is built in and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def timeout_seconds(timeout: datetime.timedelta | float) -> float:
    """``timeout`` in seconds; a ``timedelta`` or a positive number of seconds."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"timeout must be a datetime.timedelta or a number of seconds, got {timeout!r}"
        )
    if not seconds > 0:  # also rejects nan
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return seconds


# -- metadata group ------------------------------------------------------------------------

_meta_lock = threading.Lock()
#: a group -> its gloo group (a weak reference) or None; both held weakly, so that
#: ``destroy_process_group()`` really ends them (see :class:`~instrument.rank.WorldWatch`)
_meta_groups: weakref.WeakKeyDictionary[ProcessGroup, weakref.ref[ProcessGroup] | None] = (
    weakref.WeakKeyDictionary()
)
_meta_world = WorldWatch()  # the default group _meta_groups belongs to


def metadata_group(group: ProcessGroup | None = None) -> ProcessGroup | None:
    """A gloo process group over the same ranks as ``group`` (default: the world).

    An NCCL job can use it to exchange metadata (names, counts, pickled objects) and to run
    CPU collectives without touching the GPU. It is created once per ``group`` and cached;
    ``group`` itself is returned when its backend is already gloo.

    Creating a group is collective (``dist.new_group``): the first call for a given
    ``group`` must be made on every rank of that group, in the same order relative to the
    other group creations of the job, or it hangs until the job's group timeout. For a group
    smaller than the world the gloo group is created with ``use_local_synchronization=True``:
    only its members take part. Later calls are local (a dictionary lookup).

    Returns ``None`` when ``torch.distributed`` is not initialised, and on a process that
    is not a member of ``group``. The cache follows the default group: after
    ``destroy_process_group()`` and a new ``init_process_group()`` fresh groups are created.
    """
    if not dist_initialized():
        return None
    world = dist.group.WORLD
    target = world if group is None else group
    if not isinstance(target, dist.ProcessGroup):  # GroupMember.NON_GROUP_MEMBER
        return None
    if dist.get_backend(target) == "gloo":
        return target
    with _meta_lock:
        if _meta_world.changed(world):
            _meta_groups.clear()
        if target in _meta_groups:
            known = _meta_groups[target]
            return None if known is None else known()
        ranks = dist.get_process_group_ranks(target)
        subset = len(ranks) < dist.get_world_size()
        with suppressed():
            created = dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=subset)
        made = created if isinstance(created, dist.ProcessGroup) else None
        _meta_groups[target] = None if made is None else weakref.ref(made)
        return made


# -- barrier -------------------------------------------------------------------------------


class Place(NamedTuple):
    """Where a group's barrier keys live, and who takes part."""

    store: Store
    name: str  # the group's name: keys of different groups never meet
    ranks: list[int]  # global ranks of the group, in group-rank order
    rank: int  # this process's global rank


def place_of(group: ProcessGroup | None) -> Place | None:
    """The store, name and ranks of ``group`` (default: the world); ``None`` when this
    process is not a member. Needs an initialised default group."""
    target = dist.group.WORLD if group is None else group
    if not isinstance(target, dist.ProcessGroup):  # GroupMember.NON_GROUP_MEMBER
        return None
    ranks = dist.get_process_group_ranks(target)
    rank = dist.get_rank()
    if rank not in ranks:
        return None
    name = getattr(target, "group_name", "") or "_".join(map(str, ranks))
    store = dist.distributed_c10d._get_default_store()
    return Place(store, str(name), ranks, rank)


_seq_lock = threading.Lock()
_seqs: dict[tuple[str, str], int] = {}
_seq_world = WorldWatch()
_cleaned: dict[str, int] = {}  # per group: barriers below this number have no keys left


def next_seq(kind: str, where: Place) -> int:
    """This process's count of ``kind`` calls on the group so far (0, 1, ...): the ranks
    agree on it as long as each calls ``kind`` the same number of times."""
    with _seq_lock:
        if _seq_world.changed(dist.group.WORLD):  # a new default group has a new store
            _seqs.clear()
            _cleaned.clear()
        key = (kind, where.name)
        seq = _seqs.get(key, 0)
        _seqs[key] = seq + 1
        return seq


class _Outcome(NamedTuple):
    ok: bool
    missing: list[int]  # global ranks that had not arrived when the barrier gave up
    late: bool = False  # this rank arrived after the barrier gave up


def store_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def store_append(store: Store, key: str, value: str) -> None:
    """``store.append`` (torch >= 2.1; missing from torch's type stubs)."""
    cast(Any, store).append(key, value)


def _decide(store: Store, prefix: str, verdict: str) -> str:
    """Settle the barrier's outcome once: the first verdict stored wins, for every rank."""
    return store_text(store.compare_set(prefix + "status", "", verdict))


def _read(status: str, late: bool) -> _Outcome:
    if status == "done":
        return _Outcome(True, [], late)
    missing = status.partition(":")[2]
    return _Outcome(False, [int(r) for r in missing.split(",") if r], late)


def _store_barrier(where: Place, prefix: str, seconds: float) -> _Outcome:
    """One barrier over ``where.store``: arrive, then wait for the last rank's "done" key
    until the deadline, then settle "done" or "timeout:<missing ranks>" with compare-set."""
    store, ranks = where.store, where.ranks
    store_append(store, prefix + "arrived", f"{where.rank},")
    count = int(store.add(prefix + "count", 1))
    if count > len(ranks):  # the others already gave up (see _GAVE_UP)
        return _read(store_text(store.get(prefix + "status")), late=True)
    if count == len(ranks):  # the last to arrive
        status = _decide(store, prefix, "done")
        if status == "done":
            store.set(prefix + "done", "1")
        return _read(status, late=status != "done")
    try:
        store.wait([prefix + "done"], datetime.timedelta(seconds=seconds))
        return _Outcome(True, [])
    except NetworkError:
        raise
    except RuntimeError:  # timed out (DistStoreError, or FileStore's RuntimeError)
        pass
    arrived = {int(r) for r in store_text(store.get(prefix + "arrived")).split(",") if r}
    missing = [r for r in ranks if r not in arrived]
    if not missing:  # the last rank arrived just now: a success after all
        status = _decide(store, prefix, "done")
        if status == "done":
            store.set(prefix + "done", "1")
        return _read(status, late=False)
    verdict = "timeout:" + ",".join(map(str, missing))
    status = _decide(store, prefix, verdict)
    if status == verdict:
        store.add(prefix + "count", _GAVE_UP)
    return _read(status, late=False)


def _clean(where: Place, seq: int) -> None:
    """Delete the keys of barriers before ``seq``: a barrier that succeeded proves every
    rank has returned from all earlier ones. Only the group's first rank does it."""
    start = _cleaned.get(where.name, 0)
    _cleaned[where.name] = seq
    for old in range(start, seq):
        prefix = f"instrument/barrier/{where.name}/{old}/"
        for key in ("arrived", "count", "status", "done"):
            try:
                where.store.delete_key(prefix + key)
            except Exception:  # a store without delete_key: the keys stay, harmless
                return


def barrier_with_timeout(
    timeout: datetime.timedelta | float, group: ProcessGroup | None = None
) -> bool:
    """Wait until every rank of ``group`` (default: the world) arrives, or ``timeout``.

    Returns True when every rank arrived in time. On a timeout it returns False after
    logging (logger ``"instrument"``, WARNING) the ranks that did not arrive, on every rank
    that did, e.g. ``instrument: barrier timed out after 2.0 s; ranks [1] did not arrive
    (group of 2)``. A rank that arrives after the others gave up returns False at once and
    says so. Nothing is raised for a timeout, and if the store cannot be reached (rank 0,
    which hosts it, has exited) the error is logged and False returned.

    Each rank waits at most ``timeout`` from its own arrival. Every rank must call this the
    same number of times per group: the n-th call on one rank meets the n-th call on the
    others. Without an initialised process group, on a process outside ``group`` or in a
    group of one, it returns True at once.

    The barrier uses the default group's key-value store (a few small keys per call, those
    of finished barriers deleted), never the group's backend: it works the same on NCCL and
    gloo, and a timeout leaves every process group usable.

    Args:
        timeout: The longest wait, as a ``timedelta`` or in seconds (> 0).
        group: The process group whose ranks must arrive (default: the world).
    """
    seconds = timeout_seconds(timeout)
    if not dist_initialized():
        return True
    where = place_of(group)
    if where is None or len(where.ranks) == 1:
        return True
    seq = next_seq("barrier", where)
    prefix = f"instrument/barrier/{where.name}/{seq}/"
    try:
        with suppressed():
            outcome = _store_barrier(where, prefix, seconds)
    except Exception as exc:  # the store is gone or refused: a failed barrier, not a crash
        logger.warning(
            "instrument: barrier failed on rank %d (group of %d): %s: %s",
            where.rank,
            len(where.ranks),
            type(exc).__name__,
            exc,
        )
        return False
    if outcome.ok:
        if where.rank == where.ranks[0]:
            _clean(where, seq)
        return True
    late = f"; rank {where.rank} arrived after the others had given up" if outcome.late else ""
    logger.warning(
        "instrument: barrier timed out after %.1f s; ranks %s did not arrive (group of %d)%s",
        seconds,
        outcome.missing,
        len(where.ranks),
        late,
    )
    return False
