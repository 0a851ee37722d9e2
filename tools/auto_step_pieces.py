"""What each piece of ``instrument.auto`` adds to a real training step, measured inside it.

    python tools/auto_step_pieces.py [--rounds 300] [--steps 20] [--block 1]

The auto-step benchmark's tiny MLP (AdamW, one intra-op thread) on ONE model and
optimizer. States — uninstrumented, the benchmark's hand-written hooks, its lean
hand-written equivalent of ``auto`` (``LeanAuto``: a Python wrapper with two clock reads on
each thing ``auto`` times), ``auto``, and ``auto`` with only its module regions, only its
optimizer hooks (tick and ``zero_grad`` included) or only its ``backward`` — are put in
place before each step (``Instrumentation`` of the benchmark), rotating; every step's
thread CPU time is kept.
Printed: each state's 5th, 25th and 50th percentile of single steps, and each minus the
uninstrumented one's. ``--block N`` runs N steps of a state in a row and keeps all but the
first (warm: the same instrumentation ran the step before, as in a training loop, and as
the benchmark's turns do); the default alternates states step by step (each step then
also pays for what the state before it evicted: ``tools/auto_step_carryover.py``).
Percentiles of single steps agree with one another to within about 1 µs where medians of
round sums move by 1-2 µs between runs; they leave out the one step in ``every`` that
flushes (``every=50``), so the flush is not in these figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from time import thread_time_ns

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--steps", type=int, default=20, help="steps per state per round")
    parser.add_argument("--block", type=int, default=1, help="consecutive steps per state")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests" / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
    import torch
    from test_auto_overhead import one_model_rows

    torch.set_num_threads(1)
    step, plain, hand, full, times, handle, lean, _ = one_model_rows()
    states = {
        "uninstrumented": plain,
        "hand-written hooks": hand,
        "lean equivalent of auto": lean,
        "auto": full,
        "auto: module regions": full.only("modules", plain),
        "auto: optimizer": full.only("optimizer", plain),
        "auto: backward": full.only("backward", plain),
    }
    spent: dict[str, list[int]] = {name: [] for name in states}
    names = list(states)
    for r in range(args.rounds + 3):
        order = names[r % len(names) :] + names[: r % len(names)]
        for _ in range(args.steps // args.block):
            for name in order:
                states[name].apply()
                for i in range(args.block):
                    t0 = thread_time_ns()
                    step()
                    if r >= 3 and (i > 0 or args.block == 1):
                        spent[name].append(thread_time_ns() - t0)
        times.clear()
    full.apply()
    handle.remove()
    base = statistics.quantiles(spent["uninstrumented"], n=20)
    print(f"{'state':26s} {'p5':>8s} {'p25':>8s} {'p50':>8s}   added: p5, p25, p50 (µs)")
    for name in names:
        q = statistics.quantiles(spent[name], n=20)
        row = [q[0], q[4], q[9]]
        added = [a - b for a, b in zip(row, [base[0], base[4], base[9]], strict=True)]
        print(
            f"{name:26s} " + " ".join(f"{v / 1e3:8.1f}" for v in row)
            + "   " + ", ".join(f"{v / 1e3:+.2f}" for v in added)
        )  # fmt: skip


if __name__ == "__main__":
    main()
