"""Values across ranks by reductions: bytes per rank grow with the paths, not the world.

For ``P`` values per rank (a path's total, a rate; ``None`` where a rank has none):

- one ``MAX`` all-reduce of ``4·P`` int64 gives, exactly, each value's maximum and minimum
  (a float64 read as an order-preserving int64; the minimum as the maximum of ``-v``) and
  the arg-ranks, from packed ``(value, rank)`` pairs: the value's high bits with the rank in
  the low ``R = ceil(log2 W)`` bits, so the maximum is a rank holding the largest value
  (the lowest such rank on ties; values closer than ``2**(R-52)`` relative count as tied);
- one ``SUM`` all-reduce of ``2·P (+ k)`` float64 gives the sums and how many ranks have a
  value (and ``k`` extra counts a caller adds, e.g. stragglers).

Both run on the group's own backend and device: ``dist.all_reduce`` of CUDA tensors with
NCCL (which picks its own tree or ring), a binary tree of sends and receives on gloo, so
that no rank sends or receives more than three buffers per reduction (``3 * 48·P`` bytes
in all) whatever ``W``. Per-rank values (``ranks="all"``) are
gathered to the group's first rank only. When the path lists differ, :func:`union` makes
the names travel: every rank's list hash, then each *distinct* list once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from instrument.distributed import held
from instrument.distributed.barrier import metadata_group
from instrument.distributed.gather import parents_first

_INT64_MIN = -(2**63)
_FLIP = 0x7FFFFFFFFFFFFFFF


def path_hash(paths: Sequence[str]) -> int:
    """A 63-bit hash of ``paths`` and their order (the check of the path lists)."""
    digest = hashlib.blake2b("\n".join(paths).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _ranks(group: Any) -> list[int]:
    """The global rank of each group rank."""
    world = dist.get_world_size(group)
    if group is None:
        return list(range(world))
    return [dist.get_global_rank(group, r) for r in range(world)]


def _device(group: Any) -> torch.device:
    if dist.get_backend(group) == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any) -> None:
    """``dist.all_reduce`` in place, except on gloo: there a binary tree (children → parent
    up to the group's first rank, then back down) keeps every rank's traffic at most three
    buffers each way, whatever the world size, in ``2·log2(W)`` hops. Gloo's ring would
    send ``2(W-1)`` messages per rank, whose framing outgrows a small buffer."""
    if dist.get_backend(group) != "gloo":
        held.keep(tensor)
        dist.all_reduce(tensor, op=op, group=group)
        return
    ranks = _ranks(group)
    me = dist.get_rank(group)
    fold = torch.maximum if op == dist.ReduceOp.MAX else torch.add
    incoming = torch.empty_like(tensor)
    children = [child for child in (2 * me + 1, 2 * me + 2) if child < len(ranks)]
    for child in children:
        dist.recv(incoming, src=ranks[child], group=group)
        tensor.copy_(fold(tensor, incoming))
    if me:
        parent = ranks[(me - 1) // 2]
        dist.send(tensor, dst=parent, group=group)
        dist.recv(tensor, src=parent, group=group)
    for child in children:
        dist.send(tensor, dst=ranks[child], group=group)


def _ordered(values: torch.Tensor) -> torch.Tensor:
    """float64 → int64 with the same order (an involution: applied twice, the bits back)."""
    bits = values.view(torch.int64)
    return torch.where(bits < 0, bits ^ _FLIP, bits)


def _from_ordered(keys: torch.Tensor) -> torch.Tensor:
    return torch.where(keys < 0, keys ^ _FLIP, keys).view(torch.float64)


@dataclass(frozen=True)
class Extremes:
    """One value's minimum and maximum over the ranks that have it, and who holds them."""

    low: float
    high: float
    argmin: int  # global rank
    argmax: int


def extremes(values: Sequence[float | None], group: Any = None) -> list[Extremes | None]:
    """Per value, its extremes over the group (``None`` where no rank has it): one ``MAX``
    all-reduce of ``4·len(values)`` int64. Collective over ``group``."""
    n = len(values)
    ranks = _ranks(group)
    bits = max((len(ranks) - 1).bit_length(), 1)
    mask = (1 << bits) - 1
    present = torch.tensor([v is not None for v in values], dtype=torch.bool)
    mine = torch.tensor([0.0 if v is None else v for v in values], dtype=torch.float64)
    me = dist.get_rank(group)
    up, down = _ordered(mine), _ordered(-mine)
    tag = mask - me  # the lowest rank wins a tie
    packed_up = (up & ~mask) | tag
    packed_down = (down & ~mask) | tag
    keys = torch.cat([up, down, packed_up, packed_down])
    keys[torch.cat([~present] * 4)] = _INT64_MIN
    keys = keys.to(_device(group))
    _all_reduce(keys, dist.ReduceOp.MAX, group)
    keys = keys.cpu()
    highs = _from_ordered(keys[:n].clone()).tolist()
    lows = (-_from_ordered(keys[n : 2 * n].clone())).tolist()
    raw = keys.tolist()
    out: list[Extremes | None] = []
    for i in range(n):
        if raw[i] == _INT64_MIN:
            out.append(None)
            continue
        argmax = ranks[mask - (raw[2 * n + i] & mask)]
        argmin = ranks[mask - (raw[3 * n + i] & mask)]
        out.append(Extremes(lows[i], highs[i], argmin, argmax))
    return out


def sums(
    values: Sequence[float | None], extra: Sequence[float] = (), group: Any = None
) -> tuple[list[float], list[int], list[float]]:
    """Per value, its sum and the number of ranks that have it; and the sums of ``extra``
    (the same length on every rank): one ``SUM`` all-reduce. Collective over ``group``."""
    n = len(values)
    flat = [0.0 if v is None else v for v in values]
    flat += [0.0 if v is None else 1.0 for v in values]
    flat += list(extra)
    tensor = torch.tensor(flat, dtype=torch.float64).to(_device(group))
    _all_reduce(tensor, dist.ReduceOp.SUM, group)
    out = tensor.cpu().tolist()
    return out[:n], [round(c) for c in out[n : 2 * n]], out[2 * n :]


def gather_to_first(
    values: Sequence[float | None], group: Any = None
) -> list[list[float | None]] | None:
    """Every rank's ``values`` on the group's first rank (``out[group rank][i]``, ``None`` =
    absent), ``None`` on the others: one ``gather``. Collective over ``group``."""
    ranks = _ranks(group)
    device = _device(group)
    nan = float("nan")
    mine = torch.tensor([nan if v is None else v for v in values], dtype=torch.float64)
    mine = mine.to(device)
    first = dist.get_rank(group) == 0
    parts = [torch.empty_like(mine) for _ in ranks] if first else None
    held.keep(mine, parts)
    dist.gather(mine, parts, dst=ranks[0], group=group)
    if parts is None:
        return None
    return [[None if x != x else x for x in part.cpu().tolist()] for part in parts]


def union(paths: Sequence[str], group: Any = None) -> list[str]:
    """Every path any rank of ``group`` has, parents before children, the same list on
    every rank. Only for lists that differ: every rank's hash is all-gathered (8 bytes per
    rank), then each *distinct* list travels once, broadcast by the first rank holding it.
    Over a gloo group (:func:`metadata_group`): names never touch the GPU."""
    meta = metadata_group(group)
    ranks = _ranks(group)
    mine = torch.tensor([path_hash(paths)], dtype=torch.int64)
    hashes = [torch.zeros(1, dtype=torch.int64) for _ in ranks]
    held.keep(mine, hashes)
    dist.all_gather(hashes, mine, group=meta)
    owners: dict[int, int] = {}
    for index, value in enumerate(int(h) for h in hashes):
        owners.setdefault(value, index)
    me = dist.get_rank(group)
    seen: dict[str, None] = {}
    for index in sorted(owners.values()):
        box: list[Any] = [list(paths) if index == me else None]
        dist.broadcast_object_list(box, src=ranks[index], group=meta)
        for path in box[0]:
            seen.setdefault(path, None)
    return parents_first(list(seen))
