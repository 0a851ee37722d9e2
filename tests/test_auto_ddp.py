"""instrument.auto on a DDP model over a real 2-process gloo group."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import run_ranks
from models import TinyLM, lm_loss
from torch import nn

import instrument
from instrument.testing import reset


def _train_ddp(instrumented: bool, rank: int) -> tuple[list[torch.Tensor], dict[str, Any] | None]:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=None, sinks=[]) if instrumented else None
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(2):
        lm_loss(model, torch.randint(0, 64, (4, 12), generator=gen)).backward()
        opt.step()
        opt.zero_grad()
    report = handle.reporter.flush().to_dict() if handle is not None else None
    if handle is not None:
        handle.remove()
    return [p.detach().clone() for p in model.parameters()], report


def ddp_worker(rank: int, world_size: int) -> dict[str, Any]:
    plain, _ = _train_ddp(False, rank)
    timed, report = _train_ddp(True, rank)
    same = all(torch.equal(a, b) for a, b in zip(plain, timed, strict=True))
    checksum = float(sum(p.double().sum() for p in timed))
    return {
        "report": report,
        "same_as_plain": same,
        "checksum": checksum,
        "restored": dist.all_reduce is dist.distributed_c10d.all_reduce,
    }


@pytest.mark.timeout(150)
def test_ddp_model_names_and_gradient_all_reduce(two: list[dict[str, Any]]) -> None:
    results = [r["ddp"] for r in two]
    for result in results:
        assert result["same_as_plain"]
        assert result["restored"]
        report = instrument.Report.from_dict(result["report"])
        paths = report.paths()
        assert "forward/encoder/layers.0/self_attn" in paths
        assert not any("module" in p.split("/") for p in paths)  # no DDP "module." prefix
        grads = report["backward/ddp_all_reduce"]
        assert grads.concurrent
        assert grads.count >= 2  # at least one bucket per step
        n_params = sum(p.numel() for p in TinyLM().parameters())
        assert grads.bytes == 2 * 4 * n_params  # every fp32 gradient, every step
        assert report["optimizer"].count == 2
        assert report.world_size == 2
    assert results[0]["checksum"] == results[1]["checksum"]  # ranks stay in sync


class _SlowOnRank(nn.Module):
    """A linear layer whose forward sleeps ``delay`` seconds, and its backward a sixth of
    that (on the one slow rank)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        if self.delay:
            time.sleep(self.delay)
            out.register_hook(lambda grad: time.sleep(self.delay / 6))
        return out


def slow_forward_worker(rank: int, world_size: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_SlowOnRank(0.03 if rank == 1 else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports: list[instrument.Report] = []
    reporter = instrument.Reporter(
        every=2, sinks=[reports.append], ranks="minmax", straggler_intervals=2
    )
    handle = instrument.auto(model, opt, reporter=reporter)
    for _ in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    handle.remove()
    return [report.to_dict() for report in reports]


@pytest.mark.timeout(150)
def test_a_slow_forward_is_named_not_the_ranks_that_wait_for_it_in_backward(
    two: list[dict[str, Any]],
) -> None:
    """Rank 1 sleeps 30 ms in forward and 5 ms in backward; rank 0 then waits for it in
    DDP's gradient all-reduce, inside its backward. By total, rank 0's backward is the
    slowest; the waiting taken out, rank 1's is, and only rank 1 is named a straggler
    (rank 0 was, in backward)."""
    reports = [instrument.Report.from_dict(r) for r in two[0]["slow_forward"]]
    assert len(reports) == 3
    last = reports[-1]
    backward = last["backward"].ranks
    assert backward is not None
    assert backward.rank_argmax == 0  # its total: mostly waiting in the all-reduce
    assert backward.slowest == 1
    assert last["forward"].ranks is not None
    assert last["forward"].ranks.slowest == 1
    assert last["backward/ddp_all_reduce"].ranks is not None
    assert last["backward/ddp_all_reduce"].ranks.slowest == 1
    named = [(r.index, s.rank, s.regions, s.scores) for r in reports for s in r.stragglers]
    assert {rank for _, rank, _, _ in named} == {1}, named


def compiled_ddp_worker(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    compiled = torch.compile(nn.parallel.DistributedDataParallel(TinyLM()), backend="eager")
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    with instrument.auto(compiled, opt, every=None, sinks=[]) as handle:
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(2):
            lm_loss(compiled, torch.randint(0, 64, (4, 12), generator=gen)).backward()
            opt.step()
            opt.zero_grad()
        return handle.reporter.flush().to_dict()


@pytest.mark.slow  # compiles on both ranks
@pytest.mark.timeout(150)
def test_a_compiled_ddp_model_keeps_its_gradient_all_reduce_line() -> None:
    """``auto(torch.compile(DDP(model)))``: the comm hook went only on a DDP given directly,
    so the gradient all-reduce was hidden in ``backward`` (and ``backward`` was scored by
    its total across ranks, waits included)."""
    for result in run_ranks(compiled_ddp_worker, 2, timeout=120):
        report = instrument.Report.from_dict(result)
        assert report["forward"].count == 2
        grads = report["backward/ddp_all_reduce"]
        assert grads.count >= 2
        assert grads.bytes == 2 * 4 * sum(p.numel() for p in TinyLM().parameters())


def inner_model_worker(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyLM()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with instrument.auto(model, opt, every=None, sinks=[]) as handle:  # the inner model
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(2):
            lm_loss(ddp, torch.randint(0, 64, (4, 12), generator=gen)).backward()
            opt.step()
            opt.zero_grad()
        report = handle.reporter.flush().to_dict()
    return {"report": report, "pre_hooks": len(model._forward_pre_hooks)}


@pytest.mark.timeout(150)
def test_auto_on_the_model_a_ddp_holds_finds_that_ddp(two: list[dict[str, Any]]) -> None:
    """``ddp = DDP(model)``, ``auto(model)``, training through ``ddp``: the comm hook went
    only on a DDP given to auto, so the gradient all-reduce hid in ``backward``."""
    for result in (r["inner_model"] for r in two):
        report = instrument.Report.from_dict(result["report"])
        assert report["forward"].count == 2
        grads = report["backward/ddp_all_reduce"]
        assert grads.bytes == 2 * 4 * sum(p.numel() for p in TinyLM().parameters())
        assert result["pre_hooks"] == 0  # the look-up hook took itself off


def two_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    """Each uncompiled case in turn on one pair of processes."""
    results: dict[str, Any] = {}
    for name, worker in (
        ("ddp", ddp_worker),
        ("inner_model", inner_model_worker),
        ("slow_forward", slow_forward_worker),
    ):
        reset()
        results[name] = worker(rank, world_size)
    return results


@pytest.fixture(scope="module")
def two() -> list[dict[str, Any]]:
    """What each rank's cases returned: one spawn for the module, not one a test."""
    return run_ranks(two_rank_worker, 2, timeout=120)
