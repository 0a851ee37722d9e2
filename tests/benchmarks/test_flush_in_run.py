"""What one flush costs inside a real run: a tiny GPT-2 (transformers, from a config, CPU)
trained under ``instrument.auto(model, optimizer, every=10)``.

The flush runs where training runs it — from the optimizer's step hook, after ten steps
have gone through the caches — and is timed around ``reporter.flush`` (CPU time of this
thread, so a preempted flush does not count the other processes' time). Two
configurations alternate round by round: every module timed (``depth=None``: several
dozen paths per report) and ``depth=0`` (``forward``, ``backward``, ``optimizer``,
``zero_grad``: 4 paths). The two give a line, a fixed cost per flush plus a cost per path;
``value_ns`` is that line at 50 paths, the figure the ``flush-in-run`` target is checked
against (``report_ratios.py``).
"""

from __future__ import annotations

from time import thread_time_ns
from typing import Any

import pytest
import torch
from models import Step, gpt2_step

import instrument
from instrument import registry
from instrument.report import Report

pytest.importorskip("transformers")

EVERY = 10
ROUNDS = 6
#: Flushes timed per handle: each handle's first flush (a fresh tree, first-use costs) is
#: left out.
FLUSHES = 3
PATHS = 50


def timed_flushes(parts: Step, depth: int | None) -> tuple[list[int], int]:
    """CPU ns of each flush (but the first) of one ``auto`` handle, and the paths a flush
    walks (those of the tree: the other configuration's were released first)."""
    model, optimizer, step = parts
    for _ in range(registry.idle_flushes + 1):  # release the other configuration's paths
        registry.collect()
    reports: list[Report] = []
    handle = instrument.auto(
        model, optimizer, every=EVERY, depth=depth, sinks=[reports.append], collectives=False
    )
    reporter = handle.reporter
    flush = reporter.flush
    spent: list[int] = []

    def timed_flush() -> Report:
        t0 = thread_time_ns()
        try:
            return flush()
        finally:
            spent.append(thread_time_ns() - t0)

    reporter.flush = timed_flush  # type: ignore[method-assign]
    try:
        for _ in range(EVERY * (FLUSHES + 1)):
            step()
    finally:
        del reporter.flush
        handle.remove()
    return spent[1 : FLUSHES + 1], registry.live_paths()


@pytest.mark.benchmark(group="flush-in-run")
def test_flush_in_run(benchmark: Any) -> None:
    """Fixed cost + ``PATHS`` x cost per path of a flush inside a GPT-2 run."""
    parts = gpt2_step()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(EVERY):
            parts[2]()  # warm-up
        full: list[int] = []
        small: list[int] = []
        full_paths = small_paths = 0
        for r in range(ROUNDS):
            for depth in (None, 0) if r % 2 == 0 else (0, None):
                times, paths = timed_flushes(parts, depth)
                if depth is None:
                    full += times
                    full_paths = paths
                else:
                    small += times
                    small_paths = paths
    finally:
        torch.set_num_threads(threads)
    assert full_paths > small_paths >= 4
    full_ns, small_ns = min(full), min(small)
    per_path = max(full_ns - small_ns, 0) / (full_paths - small_paths)
    fixed = small_ns - per_path * small_paths
    benchmark.extra_info.update(
        label=f"auto flush, {PATHS} paths (fixed + per path)",
        inner=1,
        value_ns=fixed + PATHS * per_path,
        fixed_ns=fixed,
        per_path_ns=per_path,
        paths=[small_paths, full_paths],
        flush_min_ns=[small_ns, full_ns],
        note=f"min of {len(full)} flushes at {full_paths} paths and {len(small)} at "
        f"{small_paths}; fixed {fixed / 1e3:.0f} µs + {per_path / 1e3:.2f} µs per path",
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # keeps it a benchmark
