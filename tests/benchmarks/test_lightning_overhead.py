"""What ``InstrumentCallback`` / ``InstrumentProfiler`` add to a Lightning step, next to
Lightning's own ``SimpleProfiler`` and ``PyTorchProfiler``.

Each round runs one short ``Trainer.fit()`` per configuration, in an order that rotates
from round to round; a probe callback reads the clock at every ``on_train_batch_start``,
and a fit's step time is the median of its steps after the first few. Each configuration's
ratio to the uninstrumented fit *of the same round* is taken, and the median of those
ratios over the rounds is the figure (the ``paired`` table of ``report_ratios.py``).

The clock is the main thread's CPU time (``time.thread_time_ns``; torch runs one intra-op
thread here, so a step is that thread's work): on a shared machine, wall time also counts
the time other processes held the core, which swamps a few percent. The wall-time ratio
is kept in ``extra_info["wall_median"]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from time import perf_counter_ns, thread_time_ns
from typing import Any

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch")
profilers = pytest.importorskip("lightning.pytorch.profilers")

from instrument.integrations.lightning import InstrumentCallback, InstrumentProfiler  # noqa: E402

STEPS = 40  # optimizer steps per fit
SKIP = 5  # first steps left out of a fit's median
ROUNDS = 20
BATCH = 16


class Probe(pl.Callback):  # type: ignore[misc]
    """Reads the clocks at the start of every batch."""

    def __init__(self) -> None:
        self.cpu: list[int] = []
        self.wall: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        self.cpu.append(thread_time_ns())
        self.wall.append(perf_counter_ns())

    @staticmethod
    def median_step(starts: list[int]) -> float:
        gaps = [b - a for a, b in pairwise(starts)]
        return statistics.median(gaps[SKIP:])


class TinyModule(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def loader() -> torch.utils.data.DataLoader[Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH, 32, generator=gen)
    y = torch.randint(0, 10, (STEPS * BATCH,), generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


Options = Callable[[Path], dict[str, Any]]

CONFIGS: dict[str, Options] = {
    "uninstrumented": lambda tmp: {},
    "InstrumentCallback (every=50)": lambda tmp: {
        "callbacks": [InstrumentCallback(every=50, sinks=[])]
    },
    "InstrumentProfiler (every=50)": lambda tmp: {
        "profiler": InstrumentProfiler(every=50, sinks=[])
    },
    "Lightning SimpleProfiler": lambda tmp: {
        "profiler": profilers.SimpleProfiler(dirpath=tmp, filename="simple")
    },
    "Lightning PyTorchProfiler (default schedule)": lambda tmp: {
        "profiler": profilers.PyTorchProfiler(dirpath=tmp, filename="torch")
    },
}


def fit_step_ns(options: dict[str, Any]) -> tuple[float, float]:
    """The median step (CPU time, wall time) of one short fit with these Trainer options."""
    torch.manual_seed(0)
    probe = Probe()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **{**options, "callbacks": [probe, *options.get("callbacks", [])]},
    )
    trainer.fit(TinyModule(), loader())
    return probe.median_step(probe.cpu), probe.median_step(probe.wall)


@pytest.fixture(scope="module")
def step_ns(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, list[tuple[float, float]]]]:
    """Every configuration's step time, round by round (one interleaved run)."""
    import logging

    quiet = logging.getLogger("lightning.pytorch")
    level, threads = quiet.level, torch.get_num_threads()
    quiet.setLevel(logging.WARNING)
    torch.set_num_threads(1)  # a tiny model: intra-op threads only add contention
    tmp = tmp_path_factory.mktemp("profiles")
    names = list(CONFIGS)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    try:
        for name in names:  # warm every path once
            fit_step_ns(CONFIGS[name](tmp))
        for r in range(ROUNDS):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(fit_step_ns(CONFIGS[name](tmp)))
        yield times
    finally:
        quiet.setLevel(level)
        torch.set_num_threads(threads)


@pytest.mark.benchmark(group="paired-step")
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "uninstrumented"])
def test_lightning_step_ratio(
    benchmark: Any, step_ns: dict[str, list[tuple[float, float]]], name: str
) -> None:
    base = [cpu for cpu, _ in step_ns["uninstrumented"]]
    mine = [cpu for cpu, _ in step_ns[name]]
    ratios = sorted(m / b for m, b in zip(mine, base, strict=True))
    median = ratios[len(ratios) // 2]
    wall = sorted(
        m[1] / b[1] for m, b in zip(step_ns[name], step_ns["uninstrumented"], strict=True)
    )
    benchmark.extra_info.update(
        label=f"Lightning tiny-MLP step (CPU time): {name} / uninstrumented, paired",
        inner=1,
        paired_median=median,
        paired_min_ratio=min(mine) / min(base),
        base_min_ns=min(base),
        wall_median=wall[len(wall) // 2],
        note=f"median of {ROUNDS} per-round ratios of median steps ({STEPS} steps per fit)",
    )
    print(f"\n{name}: {median:.3f}x CPU, {wall[len(wall) // 2]:.3f}x wall")
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # keeps it a benchmark
