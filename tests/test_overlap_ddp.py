"""DDP's gradient all-reduce buckets overlap each other and the backward that holds them: a
rank's waiting there is the time they cover, counted once. So the rank slow inside its
backward is named, not the rank that waited for it (a real 2-rank gloo group)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks
from torch import nn

import instrument

SLEEP = 0.03


class _Weights(nn.Module):
    """Eight 4 MB weights, each its own DDP bucket, with gradients that cost nothing to
    compute: the buckets are launched at once and their all-reduces queue behind each
    other, so their times add up to more than the backward. On the slow rank the backward
    first sleeps, before any bucket is ready."""

    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(1024, 1024)) for _ in range(8))
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = sum((w * x).sum() for w in self.weights)
        if self.slow:
            out.register_hook(lambda grad: time.sleep(SLEEP))
        return out


def slow_backward_worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)  # two ranks on a small machine
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_Weights(rank == 1), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    reports: list[instrument.Report] = []
    handle = instrument.auto(model, opt, ranks="minmax", every=2, sinks=[reports.append])
    for _ in range(4):
        model(torch.ones(1)).backward()
        opt.step()
        opt.zero_grad()
    handle.remove()
    return [report.to_dict() for report in reports]


@pytest.mark.slow  # two ranks; the default tier names the slow rank in tests/test_auto_ddp.py
@pytest.mark.timeout(120)
def test_the_rank_slow_inside_its_backward_is_named_not_the_rank_that_waited() -> None:
    """Rank 1 sleeps 30 ms in its backward; rank 0 waits for it in the buckets' all-reduce.
    Summed, the buckets exceed the backward on both ranks (nothing would be left of its own
    time on either); their union leaves rank 1's sleep as its own time."""
    first, _ = run_ranks(slow_backward_worker, 2, timeout=100)
    report = instrument.Report.from_dict(first[-1])  # (steps 3 and 4: DDP set up)
    grads = report["backward/ddp_all_reduce"]
    assert grads.concurrent
    assert grads.count >= 2 * 2  # at least two buckets a step
    backward = report["backward"]
    assert 0.0 < backward.concurrent_time <= backward.total
    assert backward.slowest_rank == 1
    own = report.across["own.backward"]
    assert (own.rank_argmax, own.slowest) == (1, 1)
    assert own.rank_max > own.rank_min
