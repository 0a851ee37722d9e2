"""instrument.auto on FSDP (fully_shard, and the FSDP v1 wrapper) over 2 gloo processes."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from distributed_helpers import run_ranks
from models import TinyLM, lm_loss

import instrument


def _train(model: torch.nn.Module) -> instrument.Report:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with instrument.auto(model, opt, every=None, sinks=[]) as handle:
        for _ in range(2):
            lm_loss(model, torch.randint(0, 64, (4, 12))).backward()
            opt.step()
            opt.zero_grad()
        return handle.reporter.flush()


def fsdp_worker(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    warnings.simplefilter("ignore", UserWarning)
    mesh = init_device_mesh("cpu", (world_size,))  # CPU even where CUDA is present
    torch.manual_seed(0)
    model = TinyLM()
    for layer in model.encoder.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fsdp2 = _train(model)
    torch.manual_seed(0)
    wrapped = FullyShardedDataParallel(TinyLM(), device_id=torch.device("cpu"))
    fsdp1 = _train(wrapped)
    return {"fsdp2": fsdp2.to_dict(), "fsdp1": fsdp1.to_dict()}


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(150)
def test_fsdp_models_keep_their_names() -> None:
    for result in run_ranks(fsdp_worker, 2, timeout=120):
        for kind in ("fsdp2", "fsdp1"):
            report = instrument.Report.from_dict(result[kind])
            paths = report.paths()
            assert "forward/encoder/layers.1/self_attn" in paths, kind
            assert not any("_fsdp_wrapped_module" in p or "/module" in p for p in paths)
            assert report["forward"].count == 2
            assert report.steps == 2
            # FSDP's own collectives are timed where they run
            assert any(p.startswith("backward/reduce_scatter") for p in paths), kind
