"""The cross-rank exchange of a flush: which rank was slowest, per region.

Today a gathered flush runs two collectives, three when path lists differ: a hash
all-gather and, only when the hashes differ, an object all-gather of the path lists (both
over gloo), then one all-gather of the values.

Ranks may have recorded different regions, so the union of paths comes first, cheaply: each
rank contributes a 64-bit hash of its path list, and only when the hashes differ are the
lists themselves exchanged. Both go over a gloo group (:func:`metadata_group`), so NCCL jobs
work. Then one fixed-size tensor — per path, this rank's total (or "absent") — is gathered
over the group's own backend and device. Everything runs inside ``suppressed()``: the
gather never shows up in a report. A path a rank never ran is ``None`` for that rank,
never zero.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from instrument.distributed.barrier import metadata_group
from instrument.hooks.collectives import suppressed
from instrument.report import RankStats

ABSENT = float("nan")


def active(group: Any = None) -> bool:
    """A process group of more than one rank is running and this rank is in it."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return dist.get_world_size(group) > 1 and dist.get_rank(group) >= 0


def _hash(paths: Sequence[str]) -> int:
    digest = hashlib.blake2b("\n".join(paths).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def union_of_paths(paths: Sequence[str], group: Any = None) -> list[str]:
    """Every path any rank recorded, parents before children (ranks in order); the lists
    are exchanged only when their hashes differ."""
    meta = metadata_group(group)
    world = dist.get_world_size(meta)
    mine = torch.tensor([_hash(paths)], dtype=torch.int64)
    hashes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(hashes, mine, group=meta)
    if all(int(h) == int(mine) for h in hashes):
        return list(paths)
    lists: list[Any] = [None] * world
    dist.all_gather_object(lists, list(paths), group=meta)
    seen: dict[str, None] = {}
    for ranks_paths in lists:
        for path in ranks_paths:
            seen.setdefault(path, None)
    return _parents_first(list(seen))


def _parents_first(paths: list[str]) -> list[str]:
    """Order ``paths`` so that every parent comes before its children (stable otherwise)."""
    known = set(paths)
    out: list[str] = []
    placed: set[str] = set()

    def place(path: str) -> None:
        if path in placed:
            return
        parent = path.rpartition("/")[0]
        if parent and parent in known:
            place(parent)
        placed.add(path)
        out.append(path)

    for path in paths:
        place(path)
    return out


def _device(group: Any) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_totals(values: Sequence[float | None], group: Any = None) -> list[list[float | None]]:
    """``values[i]`` of every rank, as ``out[rank_in_group][i]`` (``None`` = absent)."""
    device = _device(group)
    mine = torch.tensor([ABSENT if v is None else v for v in values], dtype=torch.float64)
    mine = mine.to(device)
    world = dist.get_world_size(group)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [[None if x != x else x for x in part.cpu().tolist()] for part in parts]


def combine(
    per_rank: Sequence[float | None], ranks: Sequence[int], *, keep_all: bool
) -> RankStats | None:
    """Min/max/mean and the arg-ranks over the ranks that have a value (``per_rank`` kept
    only with ``keep_all``)."""
    present = [(v, rank) for v, rank in zip(per_rank, ranks, strict=True) if v is not None]
    if not present:
        return None
    low = min(present, key=lambda item: item[0])
    high = max(present, key=lambda item: item[0])
    return RankStats(
        rank_min=low[0],
        rank_max=high[0],
        rank_mean=sum(v for v, _ in present) / len(present),
        rank_argmin=low[1],
        rank_argmax=high[1],
        ranks_present=len(present),
        per_rank=tuple(per_rank) if keep_all else None,
    )


def across_ranks(
    local: dict[str, float], paths: Sequence[str], group: Any = None, *, keep_all: bool = False
) -> tuple[list[str], dict[str, RankStats]]:
    """The union of keys over the group and, per key, its values across ranks.

    ``local`` maps this rank's keys (paths, in tree order in ``paths``) to their values;
    collective over ``group``: every rank of it must call it.
    """
    with suppressed():
        union = union_of_paths(paths, group)
        gathered = gather_totals([local.get(path) for path in union], group)
    world = len(gathered)
    ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    out: dict[str, RankStats] = {}
    for i, path in enumerate(union):
        stats = combine([row[i] for row in gathered], ranks, keep_all=keep_all)
        if stats is not None:
            out[path] = stats
    return union, out
