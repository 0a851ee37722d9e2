"""Real stacks on a GPU: inductor-compiled steps, NCCL, the HF Trainer and Lightning.

The CPU suite checks each of these on the host clock (Dynamo's ``eager`` backend, gloo,
``use_cpu``); here they run as users run them, and every region must carry device time.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import run_ranks
from models import TinyLM, lm_loss
from torch import nn

import instrument
from instrument.sinks import InMemory

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def tokens(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (4, 16), generator=gen).cuda()


def fresh(
    optimizer: type[torch.optim.Optimizer], lr: float = 0.01
) -> tuple[nn.Module, torch.optim.Optimizer, InMemory]:
    """A new model on the GPU, its optimizer and a sink, with Dynamo's caches emptied."""
    torch._dynamo.reset()
    model = TinyLM().cuda()
    return model, optimizer(model.parameters(), lr=lr), InMemory()


def assert_device_timed(report: instrument.Report, *paths: str) -> None:
    for path in paths:
        node = report[path]
        assert node.clock == "cuda", (path, node.clock)
        assert node.device is not None, path
        assert node.device.total > 0, path


@pytest.mark.xfail(
    torch.__version__ < "2.13",
    reason="torch 2.11 on an H100: the optimizer's device time reads 0 in the "
    "intervals of steps 1-2 and 5-6 and the host time ~57 ms a step; instrument supports "
    "torch 2.13, not seen there yet",
    strict=False,
)
def test_an_inductor_compiled_optimizer_step_has_device_time() -> None:
    model, opt, sink = fresh(torch.optim.Adam)

    @torch.compile
    def step() -> None:
        opt.step()

    with instrument.auto(model, opt, every=2, sinks=[sink], collectives=False, clock="cuda"):
        for i in range(6):
            lm_loss(model, tokens(i)).backward()
            step()
            opt.zero_grad()
    assert [r.steps for r in sink.reports] == [2, 2, 2]
    report = sink.reports[-1]
    assert report["optimizer"].count == 2
    assert_device_timed(report, "forward", "backward", "optimizer")


def test_an_inductor_compiled_train_step_keeps_backward_and_optimizer() -> None:
    model, opt, sink = fresh(torch.optim.SGD, lr=0.1)

    @torch.compile
    def train_step(x: torch.Tensor) -> None:
        lm_loss(model, x).backward()
        opt.step()
        opt.zero_grad()

    with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False, clock="cuda"):
        for i in range(6):
            train_step(tokens(i))
    report = sink.reports[-1]
    assert report.steps == 3
    assert report["backward"].count == report["optimizer"].count == 3
    assert_device_timed(report, "backward", "optimizer")


def test_a_model_compiled_after_auto_is_timed_on_the_device() -> None:
    model, opt, sink = fresh(torch.optim.AdamW)
    with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False, clock="cuda"):
        compiled = torch.compile(model)
        for i in range(6):
            lm_loss(compiled, tokens(i)).backward()
            opt.step()
            opt.zero_grad()
    report = sink.reports[-1]
    assert report["forward"].count == 3
    assert_device_timed(report, "forward", "backward", "optimizer", "zero_grad")


def _ddp_on_nccl(rank: int, world_size: int) -> dict[str, Any]:
    """One NCCL rank: DDP's all-reduce under ``backward``, a collective on the device clock,
    and the cross-rank gather's NCCL exchange (one GPU: a group of one)."""
    from instrument.distributed.gather import gather_totals

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TinyLM().cuda(), device_ids=[0])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sink = InMemory()
    with instrument.auto(model, opt, every=2, sinks=[sink], ranks="minmax", clock="cuda"):
        for i in range(4):
            lm_loss(model, tokens(i)).backward()
            opt.step()
            opt.zero_grad()
            flag = torch.ones(1, device="cuda")
            dist.all_reduce(flag)
    report = sink.reports[-1]
    reduce = report["backward/ddp_all_reduce"]
    return {
        "steps": [r.steps for r in sink.reports],
        "paths": report.paths(),
        "reduce_device": None if reduce.device is None else reduce.device.total,
        "all_reduce_clock": report["all_reduce"].clock,
        "ranks": (report.ranks, report.world_size),
        "gathered": gather_totals([1.5, None, 2.0]),
    }


def test_ddp_on_nccl_times_the_gradient_all_reduce_and_gathers() -> None:
    (seen,) = run_ranks(_ddp_on_nccl, 1, backend="nccl", timeout=240)
    assert seen["steps"] == [2, 2]
    assert seen["reduce_device"] is not None
    assert seen["reduce_device"] > 0
    assert seen["all_reduce_clock"] == "cuda"
    assert seen["ranks"] == ("local", 1)  # a group of one is not combined
    assert seen["gathered"] == [[1.5, None, 2.0]]  # through a CUDA tensor on NCCL


def test_hf_trainer_on_the_gpu_reports_device_time() -> None:
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from test_integration_transformers import gpt2, train

    from instrument.integrations.transformers import InstrumentCallback

    sink = InMemory()
    trainer = train(gpt2, InstrumentCallback(sinks=[sink]), steps=4, use_cpu=False)
    assert next(trainer.model.parameters()).is_cuda
    report = sink.reports[-1]
    assert report.steps == 2
    assert_device_timed(report, "forward", "backward", "optimizer")


def test_lightning_on_the_gpu_reports_device_time() -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from instrument.integrations.lightning import InstrumentCallback

    class Regressor(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 32, generator=gen), torch.randn(64, 1))
    sink = InMemory()
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=8, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False,
        callbacks=[InstrumentCallback(every=4, sinks=[sink])],
    )  # fmt: skip
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
    assert [r.steps for r in sink.reports] == [4, 4]
    report = sink.reports[-1]
    assert_device_timed(report, "training_step", "backward", "optimizer")
