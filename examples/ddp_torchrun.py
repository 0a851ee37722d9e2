"""DDP training on several processes with the cross-rank tree: which rank is slowest, where.

torchrun --nproc_per_node=2 examples/ddp_torchrun.py [--steps 20] [--every 10] [--straggler-ms 20]

NCCL when every process has its own GPU, else gloo on CPU. Rank 1 is made a straggler in
data loading (``--straggler-ms``), so the tree's ``slowest`` column points at it for
``data`` — and, through the gradient all-reduce that waits for it, shows the other ranks
waiting.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

import instrument


class Net(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


def batches(rank: int, straggler_ms: float) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    while True:
        if rank == 1 and straggler_ms:
            time.sleep(straggler_ms / 1000)  # a slow input pipeline on rank 1
        yield torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--straggler-ms", type=float, default=20.0)
    args = parser.parse_args()

    # NCCL with one GPU per process; gloo on CPU otherwise (e.g. 2 processes, 1 GPU)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net().to(device or "cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    handle = instrument.auto(model, optimizer, every=args.every, ranks="minmax")
    data = instrument.data(batches(rank, args.straggler_ms))
    for _, (x, y) in zip(range(args.steps), data, strict=False):
        x, y = x.to(device or "cpu"), y.to(device or "cpu")
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    handle.remove()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
