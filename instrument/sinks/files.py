"""Where a file sink writes: one file per rank when several ranks run."""

from __future__ import annotations

import os
from pathlib import Path


def rank_path(path: str | os.PathLike[str], rank: int, world_size: int) -> Path:
    """The file rank ``rank`` writes for ``path``.

    A ``{rank}`` placeholder is filled in; otherwise a single process uses ``path`` as is
    and with several ranks ``.rank<R>`` goes before the suffix (``run.jsonl`` →
    ``run.rank1.jsonl``), so ranks never write to the same file.

    Example:
        >>> rank_path("logs/run.jsonl", 1, 4).as_posix()
        'logs/run.rank1.jsonl'
    """
    text = os.fspath(path)
    if "{rank}" in text:
        return Path(text.replace("{rank}", str(rank)))
    plain = Path(text)
    if world_size <= 1:
        return plain
    return plain.with_name(f"{plain.stem}.rank{rank}{plain.suffix}")


def summary_path(path: str | os.PathLike[str], rank: int, world_size: int) -> Path:
    """Where a run's summary goes beside the JSONL file ``path`` of rank ``rank``:
    ``summary.json`` in its folder, ``summary.rank<R>.json`` with several ranks."""
    folder = rank_path(path, rank, world_size).parent
    return rank_path(folder / "summary.json", rank, world_size)
