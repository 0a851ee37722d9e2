"""A short real training run for the diff tests: ``python noisy_run.py OUT.jsonl [SLOW_MS]``.

A small MLP under ``instrument.auto``; ``SLOW_MS`` > 0 makes the ``encoder.1`` module's
forward that much slower (the injected regression). Reports every 4 steps to OUT.jsonl.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

import instrument


class Slowed(nn.Module):
    """A GELU whose forward waits ``delay`` seconds more (0: none)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.act(x)


def main(out: str, slow_ms: float, steps: int = 48, every: int = 4) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(64, 128), Slowed(slow_ms / 1e3), nn.Linear(128, 128), nn.Linear(128, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    sink = instrument.sinks.JSONL(out)
    with instrument.auto(model, optimizer, every=every, sinks=[sink]):
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
