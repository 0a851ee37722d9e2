"""Healthy training runs raise no alarm: the corpus no threshold is tuned to.

Each run below is ordinary, healthy training: a plain loop with AdamW, variable batch
lengths, gradient accumulation, a cache that fills once, DDP on two gloo ranks, and a
hand-written loop that all-reduces every gradient synchronously (communication-bound for
real: ``collective_wait`` may say so; a straggler may not). Every report and the run's
summary, on every rank, must hold no warning and no critical finding. The slow tier runs
each one several times; run it beside other work (a CPU hog) to see it hold under load.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import instrument
from tests.distributed_helpers import run_ranks
from tests.models import TinyLM, lm_loss

STEPS = 60
EVERY = 10
REPEATS = 3


def alarms(reports: list[instrument.Report], summary: Any) -> list[str]:
    """Every warning or critical finding of the reports and the summary, as text."""
    found = [
        f"report {r.index} (rank {r.rank}): {f.kind} {f.severity}: {f.why}"
        for r in reports
        for f in r.findings
        if f.severity != "info"
    ]
    if summary is not None:
        found += [
            f"summary: {f.kind} {f.severity}: {f.why}"
            for f in (*summary.findings, *summary.transient)
            if f.severity != "info"
        ]
    return found


def _train(model: nn.Module, batches: Any, accumulate: int = 1, **auto: Any) -> list[str]:
    """Train ``model`` under ``instrument.auto`` on ``batches`` (token tensors): the alarms."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reports: list[instrument.Report] = []
    with instrument.auto(model, opt, every=EVERY, sinks=[reports.append], **auto) as handle:
        for i, tokens in enumerate(batches):
            with instrument.timed("data"):
                batch = tokens.clone()
            (lm_loss(model, batch) / accumulate).backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
    return alarms(reports, handle.reporter.summary())


def _tokens(seed: int, lengths: list[int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (4, n), generator=gen) for n in lengths]


def plain(seed: int) -> list[str]:
    torch.manual_seed(seed)
    return _train(TinyLM(), _tokens(seed, [16] * STEPS))


def variable_lengths(seed: int) -> list[str]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    return _train(TinyLM(), _tokens(seed, [rng.randint(4, 32) for _ in range(STEPS)]))


def accumulation(seed: int) -> list[str]:
    torch.manual_seed(seed)
    return _train(TinyLM(), _tokens(seed, [16] * (2 * STEPS)), accumulate=2)


class _Cached(nn.Module):
    """TinyLM with a cache of activations that fills over the first steps, then stays."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyLM()
        self.cache: list[torch.Tensor] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if len(self.cache) < 20:
            self.cache.append(torch.zeros(1 << 20))  # 4 MB a step, 80 MB in all, then full
        out: torch.Tensor = self.inner(tokens)
        return out


def cache_fills_once(seed: int) -> list[str]:
    torch.manual_seed(seed)
    return _train(_Cached(), _tokens(seed, [16] * STEPS))


SINGLE = {
    "plain": plain,
    "variable_lengths": variable_lengths,
    "accumulation": accumulation,
    "cache_fills_once": cache_fills_once,
}


def ddp_worker(rank: int, world_size: int, seed: int) -> list[str]:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = nn.parallel.DistributedDataParallel(TinyLM())
    return _train(model, _tokens(seed + rank, [16] * STEPS), ranks="minmax")


def all_reduce_worker(rank: int, world_size: int, seed: int) -> list[str]:
    """Every gradient all-reduced by hand, synchronously, after backward."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reports: list[instrument.Report] = []
    with instrument.auto(model, opt, every=EVERY, sinks=[reports.append], ranks="minmax") as handle:
        for tokens in _tokens(seed + rank, [16] * STEPS):
            with instrument.timed("data"):
                batch = tokens.clone()
            lm_loss(model, batch).backward()
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
    return [a for a in alarms(reports, handle.reporter.summary()) if "collective_wait" not in a]


@pytest.mark.slow  # a corpus of healthy runs, each repeated
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(SINGLE))
def test_a_healthy_single_rank_run_raises_no_alarm(name: str) -> None:
    found = [f"run {seed}: {a}" for seed in range(REPEATS) for a in SINGLE[name](seed)]
    assert found == []


@pytest.mark.slow  # a corpus of healthy runs on 2 gloo ranks, each repeated
@pytest.mark.timeout(600)
@pytest.mark.parametrize("worker", [ddp_worker, all_reduce_worker], ids=["ddp", "all_reduce"])
def test_a_healthy_two_rank_run_raises_no_alarm(worker: Any) -> None:
    found = []
    for seed in range(REPEATS):
        for rank, said in enumerate(run_ranks(worker, 2, seed, timeout=240)):
            found += [f"run {seed}, rank {rank}: {a}" for a in said]
    assert found == []
