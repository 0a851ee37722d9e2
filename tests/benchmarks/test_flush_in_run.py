"""What one flush costs inside a real run: a tiny GPT-2 (transformers, from a config, CPU)
trained under ``instrument.auto(model, optimizer, every=10)``.

The flush runs where training runs it — from the optimizer's step hook, after ten steps
have gone through the caches — and is timed around ``reporter.flush`` (CPU time of this
thread, so a preempted flush does not count the other processes' time). Four
configurations alternate round by round: every module timed (``depth=None``: several
dozen paths per report) or ``depth=0`` (``forward``, ``backward``, ``optimizer``,
``zero_grad``: 4 paths), each diagnosed (``auto``'s default) or not. The two depths give a
line, a fixed cost per flush plus a cost per path; ``value_ns`` is that line at 50 paths
without the diagnosis, the figure the ``flush-in-run`` target is checked against
(``report_ratios.py``); the diagnosed line, and the diagnosis's part (the difference), are
rows of their own.
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


def timed_flushes(parts: Step, depth: int | None, diagnose: bool) -> tuple[list[int], int]:
    """CPU ns of each flush (but the first) of one ``auto`` handle, and the paths a flush
    walks (those of the tree: the other configuration's were released first)."""
    model, optimizer, step = parts
    for _ in range(registry.idle_flushes + 1):  # release the other configuration's paths
        registry.collect()
    reports: list[Report] = []
    handle = instrument.auto(
        model,
        optimizer,
        every=EVERY,
        depth=depth,
        sinks=[reports.append],
        collectives=False,
        diagnose=diagnose,
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
    """Fixed cost + ``PATHS`` x cost per path of a flush inside a GPT-2 run, without and
    with the diagnosis."""
    parts = gpt2_step()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    configurations = [(None, False), (0, False), (None, True), (0, True)]
    spent: dict[tuple[int | None, bool], list[int]] = {c: [] for c in configurations}
    paths: dict[int | None, int] = {}
    try:
        for _ in range(EVERY):
            parts[2]()  # warm-up
        for r in range(ROUNDS):
            for depth, diagnose in configurations[r % 4 :] + configurations[: r % 4]:
                times, paths[depth] = timed_flushes(parts, depth, diagnose)
                spent[depth, diagnose] += times
    finally:
        torch.set_num_threads(threads)
    full_paths, small_paths = paths[None], paths[0]
    assert full_paths > small_paths >= 4

    def line(diagnose: bool) -> tuple[float, float]:
        full_ns, small_ns = min(spent[None, diagnose]), min(spent[0, diagnose])
        per_path = max(full_ns - small_ns, 0) / (full_paths - small_paths)
        return small_ns - per_path * small_paths, per_path

    alone, diagnosed = line(False), line(True)
    part = (diagnosed[0] - alone[0], diagnosed[1] - alone[1])
    flushes = len(spent[None, False])

    def note(fixed: float, per_path: float) -> str:
        return f"fixed {fixed / 1e3:.0f} µs + {per_path / 1e3:.2f} µs per path"

    benchmark.extra_info.update(
        label=f"auto flush without diagnosis, {PATHS} paths (fixed + per path)",
        inner=1,
        value_ns=alone[0] + PATHS * alone[1],
        fixed_ns=alone[0],
        per_path_ns=alone[1],
        paths=[small_paths, full_paths],
        note=f"min of {flushes} flushes at {full_paths} paths and {flushes} at "
        f"{small_paths}, each kind; {note(*alone)}",
        more_rows=[
            {
                "label": f"auto flush diagnosed, {PATHS} paths (fixed + per path)",
                "value_ns": diagnosed[0] + PATHS * diagnosed[1],
                "note": note(*diagnosed),
            },
            {
                "label": f"the diagnosis's part of an auto flush, {PATHS} paths",
                "value_ns": part[0] + PATHS * part[1],
                "note": note(*part),
            },
        ],
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # keeps it a benchmark
