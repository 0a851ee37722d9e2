"""What a step under ``instrument.auto`` costs by what ran just before it.

    python tools/auto_step_carryover.py [--rounds 300]

The auto-step benchmark's tiny MLP (AdamW, one intra-op thread, ONE model with each row's
instrumentation put in place before its steps, as ``Instrumentation`` of the benchmark
does). Two tables, thread CPU time, medians above the uninstrumented step's:

1. **carry-over** (no reports): each row's step by the row whose step ran just before it
   — ``auto`` after ``auto`` is its steady cost in a training loop; after another row it
   also pays for the code and data that row evicted. A benchmark alternating rows step by
   step, in a fixed cyclic order, charges each row one fixed predecessor's evictions.
2. **by position in the reporting interval** (``every=50``, steady state: ``auto``
   alone, step after step, against uninstrumented runs of the same length): the step
   that reports, then the steps after it, which pay for what the report evicted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from time import thread_time_ns

ROOT = Path(__file__).resolve().parent.parent

#: Sequences of rows, each repeated ten times per round: every row follows every row.
SEQUENCES = (
    ("hand", "auto", "plain"),
    ("plain", "auto", "hand"),
    ("hand", "auto", "auto", "plain"),
    ("plain", "hand", "hand", "auto"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests" / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
    import torch
    from test_auto_overhead import REPORT_EVERY, one_model_rows

    torch.set_num_threads(1)
    step, plain, hand, auto, times, handle, *_ = one_model_rows()
    rows = {"plain": plain, "hand": hand, "auto": auto}
    reporter = handle.reporter

    reporter.every = None  # 1: no reports
    spent: dict[tuple[str, str], list[int]] = defaultdict(list)
    before = "plain"
    for r in range(args.rounds):
        for _ in range(10):
            for name in SEQUENCES[r % len(SEQUENCES)]:
                rows[name].apply()
                t0 = thread_time_ns()
                step()
                spent[name, before].append(thread_time_ns() - t0)
                before = name
        times.clear()
    floor = statistics.median(spent["plain", "plain"])
    print("1. carry-over, no reports: median above the uninstrumented step after its own (µs)")
    for name in ("auto", "hand", "plain"):
        cells = [
            f"after {b}: {(statistics.median(spent[name, b]) - floor) / 1e3:+6.1f}" for b in rows
        ]
        print(f"   {name:6s} " + "   ".join(cells))

    reporter.every = REPORT_EVERY  # 2: by position in the interval
    at: dict[int, list[int]] = defaultdict(list)
    base: list[int] = []
    for _ in range(max(args.rounds // 10, 3)):
        for name in ("auto", "plain"):
            rows[name].apply()
            for _ in range(2 * REPORT_EVERY):  # settle into steady state
                step()
            for _ in range(4 * REPORT_EVERY):
                position = reporter.steps  # steps since the last report
                t0 = thread_time_ns()
                step()
                (at[position] if name == "auto" else base).append(thread_time_ns() - t0)
        times.clear()
    auto.apply()
    handle.remove()
    floor = statistics.median(base)
    added = [(statistics.median(at[p]) - floor) / 1e3 for p in range(REPORT_EVERY)]
    print(f"2. auto by position in its interval (every={REPORT_EVERY}), µs above uninstrumented")
    print(
        f"   the step that reports: {added[-1]:+.1f}; the steps after it: "
        + " ".join(f"{a:+.0f}" for a in added[:8])
        + f" ...; steady (median of positions 10-48): {statistics.median(added[10:-1]):+.1f}"
    )
    extra = sum(a - statistics.median(added[10:-1]) for a in added[:10])
    print(f"   one report: {added[-1]:.0f} µs in its step + {extra:.0f} µs in the 10 after it")


if __name__ == "__main__":
    main()
