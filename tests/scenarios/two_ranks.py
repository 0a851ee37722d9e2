"""Run the two-rank scenarios (gloo, DDP) at both sizes.

``worker`` is one rank's part, for ``distributed_helpers.run_ranks``; each rank writes
``OUTDIR/<scenario>-<size>/run.rank<R>.jsonl``. By hand: ``python -m scenarios.two_ranks OUTDIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from distributed_helpers import run_ranks

from scenarios.training import SIZES, TWO_RANKS, train


def worker(rank: int, world_size: int, outdir: str) -> None:
    torch.set_num_threads(1)
    for scenario, pair in TWO_RANKS.items():
        for size, spec in zip(SIZES, pair, strict=True):
            train(spec, Path(outdir) / f"{scenario}-{size}" / "run.jsonl", rank, distributed=True)


def run(outdir: Path, timeout: float) -> None:
    """Both ranks, each in its own spawned process; ``RuntimeError`` if one fails or is
    not done within ``timeout`` seconds."""
    outdir.mkdir(parents=True, exist_ok=True)
    run_ranks(worker, 2, str(outdir), timeout=timeout)


if __name__ == "__main__":
    run(Path(sys.argv[1]), timeout=120)
