"""Every rank's values on every rank: the all-gather Megatron's ``Timers.log`` needs.

This costs O(world * paths) bytes per rank and is used only by
:mod:`instrument.compat.megatron`, whose log options print every rank's times. The
Reporter's cross-rank flush uses :mod:`instrument.distributed.across` instead (reductions,
O(paths) per rank). The union of paths comes first: each rank contributes a 64-bit hash of
its path list, and only when the hashes differ are the lists exchanged, over a gloo group
(:func:`metadata_group`). A path a rank never ran is ``None`` for that rank, never zero.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from instrument.distributed import held
from instrument.distributed.barrier import metadata_group

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
    held.keep(mine, hashes)
    dist.all_gather(hashes, mine, group=meta)
    if all(int(h) == int(mine) for h in hashes):
        return list(paths)
    lists: list[Any] = [None] * world
    dist.all_gather_object(lists, list(paths), group=meta)
    seen: dict[str, None] = {}
    for ranks_paths in lists:
        for path in ranks_paths:
            seen.setdefault(path, None)
    return parents_first(list(seen))


def parents_first(paths: list[str]) -> list[str]:
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
    held.keep(mine, parts)
    dist.all_gather(parts, mine, group=group)
    return [[None if x != x else x for x in part.cpu().tolist()] for part in parts]
