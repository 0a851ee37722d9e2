"""Soak: memory stays flat over a long ``instrument.auto`` training loop with many paths.

A tiny model trained for ``INSTRUMENT_SOAK_STEPS`` steps (default 10**6) under
``instrument.auto`` (every module, backward, the optimizer step timed; a report every 50
steps), each step also entering one of 1,000 user regions (``kind<k>``, k = step mod 1000),
so 1,000 distinct paths come and go: each is recorded once every 1,000 steps, idle in
between, released after ``registry.idle_flushes`` idle flushes and made again. The process's
resident memory is read every ``SAMPLE`` steps; after the warm-up (the first fifth) its
least-squares slope must stay below ``MAX_GROWTH`` bytes over the rest of the run.

Run with ``pytest tests/benchmarks/test_soak.py -m slow --benchmark-only -s`` (bench-only: it
takes minutes); ``INSTRUMENT_SOAK_STEPS=100000`` for a shorter run. It prints the RSS samples.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from torch import nn

import instrument
from instrument import registry

STEPS = int(os.environ.get("INSTRUMENT_SOAK_STEPS", str(10**6)))
KINDS = 1000
SAMPLE = max(STEPS // 100, 1)
MAX_GROWTH = 8 * 2**20  # bytes over the run after warm-up (allocator noise, not a leak)


def rss_bytes() -> int:
    """Resident memory of this process (Linux ``/proc``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(xs: list[int], ys: list[int]) -> float:
    """Least-squares slope of ``ys`` over ``xs``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mx) ** 2 for x in xs)
    return num / den if den else 0.0


@pytest.mark.slow
@pytest.mark.timeout(0)
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used")
def test_memory_is_flat_over_a_long_auto_loop_with_many_paths(benchmark: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    kinds = [instrument.timed(f"kind{k}") for k in range(KINDS)]
    samples: list[tuple[int, int]] = []
    most_paths = 0
    began = time.perf_counter()
    with instrument.auto(model, optimizer, every=50, sinks=[]):
        for step in range(STEPS):
            with kinds[step % KINDS]:  # say, fetching a batch of one of 1,000 kinds
                batch = x
            loss = nn.functional.mse_loss(model(batch), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % SAMPLE == 0:
                samples.append((step, rss_bytes()))
                most_paths = max(most_paths, registry.live_paths())
    took = time.perf_counter() - began
    warm = [s for s in samples if s[0] >= STEPS // 5]
    growth = slope([s for s, _ in warm], [r for _, r in warm]) * (STEPS - STEPS // 5)
    print(
        f"\nsoak: {STEPS} steps in {took:.0f} s ({took / STEPS * 1e6:.0f} us/step); "
        f"RSS {samples[0][1] / 2**20:.1f} -> {samples[-1][1] / 2**20:.1f} MiB; "
        f"after warm-up {growth / 2**20:+.2f} MiB fitted over the run; "
        f"at most {most_paths} live paths"
    )
    print("RSS MiB every", SAMPLE, "steps:", " ".join(f"{r / 2**20:.1f}" for _, r in samples))
    assert abs(growth) < MAX_GROWTH, f"memory grew {growth / 2**20:.1f} MiB after warm-up"
    assert most_paths < KINDS  # idle paths were released, not all kept
