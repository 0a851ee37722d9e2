"""The flush inside a real run, and the self-cost a report states against the overhead measured.

Trains a tiny GPT-2 (transformers, CPU) in rounds that alternate plain steps and steps under
``instrument.auto(model, optimizer, every=10)``. Prints, for the instrumented rounds: the
paths per report, each flush's own time (``report.self_cost.flush_seconds``: the previous
flush's time, sinks included), the self-cost share the reports state, and the overhead the
rounds measured (median instrumented step / median plain step - 1), so the two can be
compared (they should be of the same order of magnitude).

Run: ``HF_HUB_OFFLINE=1 python tools/flush_in_run.py [--rounds 6] [--steps 60]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import instrument
from instrument.report import Report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models import gpt2_step  # the benchmarks' model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer, step = gpt2_step(n_positions=64, n_embd=64, batch=4, seq=64)

    plain: list[float] = []
    timed: list[float] = []
    reports: list[Report] = []
    for _ in range(3):
        step()  # warm-up
    for r in range(args.rounds):
        for instrumented in (r % 2 == 0, r % 2 == 1):
            handle = (
                instrument.auto(model, optimizer, every=10, sinks=[reports.append])
                if instrumented
                else None
            )
            out = timed if instrumented else plain
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step()
                out.append(time.perf_counter() - t0)
            if handle is not None:
                handle.remove()
    costs = [rep.self_cost for rep in reports if rep.self_cost is not None]
    flushes = [c.flush_seconds * 1e3 for c in costs if c.flush_seconds > 0]
    paths = statistics.median(len(rep) for rep in reports)
    measured = statistics.median(timed) / statistics.median(plain) - 1
    stated = statistics.median(c.share for c in costs)
    region_ns = costs[0].region_ns if costs else float("nan")
    print(
        f"median step: plain {statistics.median(plain) * 1e3:.2f} ms, "
        f"instrumented {statistics.median(timed) * 1e3:.2f} ms"
    )
    print(
        f"paths per report: {paths:.0f}; flush (own time, sinks included): median "
        f"{statistics.median(flushes):.3f} ms, min {min(flushes):.3f} ms over {len(flushes)}"
    )
    print(
        f"per path: {statistics.median(flushes) / paths * 1e3:.2f} us; region cost "
        f"calibrated {region_ns:.0f} ns"
    )
    print(
        f"overhead: stated by the reports {100 * stated:.2f} %, "
        f"measured (paired medians) {100 * measured:.2f} %"
    )


if __name__ == "__main__":
    main()
