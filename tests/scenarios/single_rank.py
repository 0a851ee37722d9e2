"""Run every single-rank scenario at both sizes, one after the other, in this process.

``python -m scenarios.single_rank OUTDIR`` writes ``OUTDIR/<scenario>-<size>/run.jsonl``. The
memory leak runs last, so that what it held cannot show in another run's memory; the
healthy run has no size: both of its runs are the same, two samples of its noise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from scenarios.training import SINGLE, SIZES, train


def main(outdir: Path) -> None:
    torch.set_num_threads(1)
    outdir.mkdir(parents=True, exist_ok=True)
    for scenario, pair in SINGLE.items():
        for size, spec in zip(SIZES[::-1], pair[::-1], strict=True):  # small first
            train(spec, outdir / f"{scenario}-{size}" / "run.jsonl")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # every file is closed: skip torch's teardown (seconds on a busy machine)
