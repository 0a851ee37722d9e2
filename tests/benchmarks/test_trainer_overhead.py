"""What ``InstrumentCallback`` adds to an HF ``Trainer`` step, paired in one run.

Each round trains the same tiny GPT-2 twice, for ``STEPS`` optimizer steps: once plain
(the baseline) and once with ``InstrumentCallback`` (report every 50 steps to no sink),
in alternating order. A step's time is the wall time between consecutive ``on_step_end``
events (data, forward, backward, clipping, optimizer, scheduler, zero_grad, the Trainer's
own bookkeeping); the first ``WARMUP`` steps of each ``train()`` are dropped. The medians
over all rounds and their ratio land in ``extra_info`` and are printed; the target is a
ratio ≤ 1.05.

Run: ``HF_HUB_OFFLINE=1 pytest tests/benchmarks/test_trainer_overhead.py --benchmark-only -s``
"""

from __future__ import annotations

import itertools
import os
import statistics
from time import perf_counter_ns
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
    """Wall time between consecutive optimizer steps, in ns."""

    def __init__(self) -> None:
        self.ends: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(perf_counter_ns())

    def steps(self) -> list[int]:
        ends = self.ends[WARMUP:]
        return [b - a for a, b in itertools.pairwise(ends)]


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 8 * (STEPS + 1)) -> None:
        self.ids = torch.randint(0, 256, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def step_times(instrumented: bool) -> list[int]:
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
    plain: list[int] = []
    timed: list[int] = []
    order = [False, True]

    def one_round() -> None:
        for instrumented in order:
            (timed if instrumented else plain).extend(step_times(instrumented))
        order.reverse()  # alternate which one runs first

    benchmark.pedantic(one_round, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    plain_ms = statistics.median(plain) / 1e6
    timed_ms = statistics.median(timed) / 1e6
    ratio = timed_ms / plain_ms
    benchmark.extra_info.update(
        label="InstrumentCallback / plain (median step)",
        plain_median_ms=plain_ms,
        instrumented_median_ms=timed_ms,
        ratio=ratio,
        steps_each=len(plain),
    )
    print(
        f"\nHF Trainer tiny GPT-2 median step: plain {plain_ms:.2f} ms, with "
        f"InstrumentCallback {timed_ms:.2f} ms, ratio {ratio:.3f} ({len(plain)} steps each)"
    )
