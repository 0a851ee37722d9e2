"""Train a small MLP on synthetic data and print a timing tree every 10 steps.

python examples/quickstart.py [--steps 30] [--every 10]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import instrument


class MLP(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width))
        self.head = nn.Linear(width, 10)

    @instrument.timed("forward")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with instrument.timed("encoder"):
            h = self.encoder(x)
        with instrument.timed("head"):
            return self.head(torch.relu(h))


@instrument.timed("data")
def next_batch(batch_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, 64)
    return x, (x[:, :10].sum(dim=1) > 0).long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reporter = instrument.Reporter(every=args.every, sinks=[instrument.sinks.Console()])

    for _ in range(args.steps):
        x, y = next_batch()
        loss = nn.functional.cross_entropy(model(x), y)
        with instrument.timed("backward"):
            loss.backward()
        with instrument.timed("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        instrument.step(samples=len(x))

    reporter.close()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
