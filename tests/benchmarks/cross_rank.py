"""Cost of a cross-rank flush against the world size, on real gloo process groups.

Each of W processes records P regions and flushes ``Reporter(ranks="minmax")`` several times;
per flush we take the wall time of ``flush()``, of its store agreement alone, and the
bytes this process sent and received over TCP (gloo and the c10d store, from the kernel's
per-socket counters). For comparison the same values go through the all-gather the flush
used before (``instrument.distributed.gather.gather_totals``). Rank 0 also serves the
store, so its bytes are reported apart.

Run (a few minutes; one process per rank, on however many cores there are)::

    python tests/benchmarks/cross_rank.py --worlds 2 4 8 16 --paths 100 1000 \
        --json cross_rank.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS))

from distributed_helpers import run_ranks  # noqa: E402
from net_bytes import moved, tcp_counters  # noqa: E402


def worker(rank: int, world: int, paths: int, flushes: int) -> dict[str, Any]:
    import instrument
    from instrument.distributed import agree, gather, reduce
    from instrument.hooks.collectives import suppressed
    from instrument.testing import FakeClock, use_clock

    clock = FakeClock()
    flush_s, agree_s, gather_s = [], [], []
    flush_bytes, gather_bytes = [], []
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=None, sinks=[], ranks="minmax", rank_timeout=120, memory=False, warmup=0
        )
        for i in range(flushes + 1):  # the first flush warms up (metadata, connections)
            for p in range(paths):
                with instrument.timed(f"region_{p:04d}"):
                    clock.advance(1e-4 * (1 + p % 7))  # the same on every rank: no stragglers
            instrument.step()
            before = tcp_counters()
            start = time.perf_counter()
            report = reporter.flush()
            took = time.perf_counter() - start
            sent, received = moved(before)
            assert report.across_note == "", report.across_note
            if i:
                flush_s.append(took)
                flush_bytes.append((sent, received))
        values = [float(p) for p in range(paths)]
        for i in range(flushes + 1):
            start = time.perf_counter()
            verdict = agree.agree(agree.Arrival(i, -1, -1000 - i, 1), 120.0)
            if i:
                agree_s.append(time.perf_counter() - start)
            assert verdict.ok
            before = tcp_counters()
            start = time.perf_counter()
            with suppressed():
                gather.gather_totals(values)
            if i:
                gather_s.append(time.perf_counter() - start)
                gather_bytes.append(moved(before))
        assert reduce.path_hash(report.paths())
    return {
        "flush_s": statistics.median(flush_s),
        "agree_s": statistics.median(agree_s),
        "allgather_s": statistics.median(gather_s),
        "sent": statistics.median(s for s, _ in flush_bytes),
        "received": statistics.median(r for _, r in flush_bytes),
        "allgather_received": statistics.median(r for _, r in gather_bytes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--paths", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--flushes", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print(
        "| P | W | flush ms (median, slowest rank) | agreement ms | sent B/rank | received"
        " B/rank | rank 0 received B | all-gather received B/rank |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for paths in args.paths:
        for world in args.worlds:
            out = run_ranks(worker, world, paths, args.flushes, timeout=580)
            others = out[1:]
            row = {
                "paths": paths,
                "world": world,
                "flush_ms": 1e3 * max(r["flush_s"] for r in out),
                "agree_ms": 1e3 * max(r["agree_s"] for r in out),
                "sent": max(r["sent"] for r in others),
                "received": max(r["received"] for r in others),
                "rank0_received": out[0]["received"],
                "allgather_received": max(r["allgather_received"] for r in others),
                "allgather_ms": 1e3 * max(r["allgather_s"] for r in out),
            }
            rows.append(row)
            print(
                f"| {paths} | {world} | {row['flush_ms']:.1f} | {row['agree_ms']:.1f} |"
                f" {row['sent']:,.0f} | {row['received']:,.0f} | {row['rank0_received']:,.0f} |"
                f" {row['allgather_received']:,.0f} |",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
