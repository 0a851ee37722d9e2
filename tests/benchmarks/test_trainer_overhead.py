"""What ``InstrumentCallback`` adds to an HF ``Trainer`` step, paired in one run.

Each round trains the same tiny GPT-2 twice, for ``STEPS`` optimizer steps: once plain
(the baseline) and once with ``InstrumentCallback`` (report every 50 steps to no sink),
in alternating order. A step's time is the wall time between consecutive ``on_step_end``
events (data, forward, backward, clipping, optimizer, scheduler, zero_grad, the Trainer's
own bookkeeping), and also the process CPU time between them (less disturbed by other
processes on a busy machine; torch runs on one thread here so the two agree on a quiet
one); the first ``WARMUP`` steps of each ``train()`` are dropped. The medians over all
rounds and their ratios land in ``extra_info`` and are printed; the target is a ratio
≤ 1.05.

Run: ``HF_HUB_OFFLINE=1 pytest tests/benchmarks/test_trainer_overhead.py --benchmark-only -s``
"""

from __future__ import annotations

import itertools
import os
import statistics
from time import perf_counter_ns, process_time_ns
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from instrument.integrations.transformers import InstrumentCallback  # noqa: E402

STEPS = 16
WARMUP = 2
ROUNDS = 5
SEQ = 64


class StepTimes(transformers.TrainerCallback):  # type: ignore[misc]
    """Wall and process CPU time between consecutive optimizer steps, in ns."""

    def __init__(self) -> None:
        self.ends: list[tuple[int, int]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append((perf_counter_ns(), process_time_ns()))

    def steps(self) -> list[tuple[int, int]]:
        ends = self.ends[WARMUP:]
        return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(ends)]


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 8 * (STEPS + 1)) -> None:
        self.ids = torch.randint(0, 256, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def step_times(instrumented: bool) -> list[tuple[int, int]]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    clock = StepTimes()
    callbacks: list[Any] = [clock]
    if instrumented:
        callbacks.append(InstrumentCallback(every=50, sinks=[], log="none"))
    args = transformers.TrainingArguments(
        output_dir="/tmp/instrument-bench-hf",
        per_device_train_batch_size=8,
        max_steps=STEPS,
        logging_steps=1000,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        max_grad_norm=1.0,
    )
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(),
        callbacks=callbacks,
    )
    trainer.train()
    return clock.steps()


@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="hf-trainer-step")
def test_trainer_step_with_and_without_the_callback(benchmark: Any) -> None:
    plain: list[tuple[int, int]] = []
    timed: list[tuple[int, int]] = []
    order = [False, True]

    def one_round() -> None:
        for instrumented in order:
            (timed if instrumented else plain).extend(step_times(instrumented))
        order.reverse()  # alternate which one runs first

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        benchmark.pedantic(one_round, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    finally:
        torch.set_num_threads(threads)
    wall = [statistics.median(t[0] for t in runs) / 1e6 for runs in (plain, timed)]
    cpu = [statistics.median(t[1] for t in runs) / 1e6 for runs in (plain, timed)]
    benchmark.extra_info.update(
        label="InstrumentCallback / plain (median step)",
        plain_median_ms=wall[0],
        instrumented_median_ms=wall[1],
        ratio=wall[1] / wall[0],
        plain_cpu_median_ms=cpu[0],
        instrumented_cpu_median_ms=cpu[1],
        cpu_ratio=cpu[1] / cpu[0],
        steps_each=len(plain),
    )
    print(
        f"\nHF Trainer tiny GPT-2 median step ({len(plain)} steps each): wall plain "
        f"{wall[0]:.2f} ms, with InstrumentCallback {wall[1]:.2f} ms, ratio "
        f"{wall[1] / wall[0]:.3f}; process CPU plain {cpu[0]:.2f} ms, with "
        f"{cpu[1]:.2f} ms, ratio {cpu[1] / cpu[0]:.3f}"
    )
