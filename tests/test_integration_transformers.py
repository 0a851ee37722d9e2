"""HF transformers: real ``Trainer.train()`` on tiny GPT-2 and Llama models, instrumented."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_helpers import torchrun

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from instrument import Reporter, registry  # noqa: E402
from instrument.hooks import modules as module_hooks  # noqa: E402
from instrument.hooks import optim as optim_hooks  # noqa: E402
from instrument.hooks import patches  # noqa: E402
from instrument.integrations.transformers import (  # noqa: E402
    InstrumentCallback,
    count_batch,
    figures,
)
from instrument.reading import read_file  # noqa: E402
from instrument.sinks import JSONL, InMemory  # noqa: E402

SEQ = 16
BATCH = 4


class TokenData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 32) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name
# warns); earlier 5.x releases, which Python 3.10 resolves to, know only the old one
CHECKPOINTING_ARG = (
    "activation_checkpointing"
    if "activation_checkpointing" in inspect.signature(transformers.TrainingArguments).parameters
    else "gradient_checkpointing"
)


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def train(
    make: Any,
    callback: InstrumentCallback | None,
    steps: int = 4,
    eval_dataset: Any = None,
    **args: Any,
) -> transformers.Trainer:
    torch.manual_seed(0)
    model = make()
    options: dict[str, Any] = {
        "output_dir": "/tmp/instrument-hf-tests",
        "per_device_train_batch_size": BATCH,
        "max_steps": steps,
        "logging_steps": 2,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    options.update(args)
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(**options),
        train_dataset=TokenData(),
        eval_dataset=eval_dataset,
        callbacks=[callback] if callback is not None else [],
    )
    trainer.train()
    return trainer


def losses(trainer: transformers.Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def assert_nothing_left(trainer: transformers.Trainer) -> None:
    assert not patches._active
    assert not module_hooks._timed
    assert not optim_hooks._tracked
    assert not any("forward" in vars(m) for m in trainer.model.modules())
    assert not any(node.has_records() for node in registry.walk())
    loader_class = type(trainer.callback_handler.train_dataloader)
    assert loader_class.__name__ == "DataLoaderShard"
    assert loader_class.__module__ == "accelerate.data_loader"


def test_trainer_tree_with_gradient_accumulation_and_logged_figures() -> None:
    sink = InMemory()
    callback = InstrumentCallback(sinks=[sink])
    trainer = train(gpt2, callback, gradient_accumulation_steps=2, max_grad_norm=1.0)

    assert [r.steps for r in sink.reports] == [2, 2]  # every = logging_steps optimizer steps
    report = sink.reports[1]
    paths = set(report.paths())
    assert {
        "forward/transformer/h.0/attn/c_attn",
        "forward/transformer/h.1/mlp",
        "forward/lm_head",
        "backward",
        "optimizer",
        "zero_grad",
        "data",
        "clip_grad_norm",
        "lr_scheduler",
    } <= paths
    assert not any(p.startswith(("optimizer/", "backward/forward")) for p in paths)
    assert report["forward"].count == report["backward"].count == 4  # 2 micro-batches a step
    assert report["data"].count == 4
    for one_per_step in ("optimizer", "zero_grad", "clip_grad_norm", "lr_scheduler"):
        assert report[one_per_step].count == 2, one_per_step
    rates = report.throughput
    assert rates is not None
    assert rates.samples == rates.steps * 2 * BATCH
    assert rates.tokens == rates.samples * SEQ

    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logged] == [2, 4]
    for entry, rep in zip(logged, sink.reports, strict=True):
        assert entry["instrument/forward_ms"] == pytest.approx(rep["forward"].total * 1e3)
        assert entry["instrument/optimizer_ms"] == pytest.approx(rep["optimizer"].total * 1e3)
        assert "instrument/step_ms" in entry
    assert trainer.callback_handler.callbacks[0] is callback  # ahead of report_to callbacks
    compact = figures(report)
    assert {"instrument/forward_ms", "instrument/backward_ms", "instrument/step_ms"} <= set(compact)
    assert "instrument/tokens_per_sec" in compact
    assert not any(k.startswith("instrument/forward/") for k in compact)
    assert "instrument/forward/transformer_ms" in figures(report, depth=2)
    assert "instrument/time/forward/total_ms" in figures(report, "all")
    assert callback.handle is None
    assert_nothing_left(trainer)


def test_evaluation_during_training_is_its_own_region() -> None:
    """``eval_strategy="steps"``: the evaluation's forwards were counted as training's
    ``forward`` (16 calls in 4 steps, its time 3x the training forward's)."""
    sink = InMemory()
    callback = InstrumentCallback(every=4, sinks=[sink])
    evals = {"train": TokenData(24), "other": TokenData(8)}  # evaluate() calls itself per set
    trainer = train(
        gpt2, callback, steps=8, eval_dataset=evals, eval_strategy="steps", eval_steps=2,
        per_device_eval_batch_size=BATCH, logging_steps=4,
    )  # fmt: skip
    assert [r.steps for r in sink.reports] == [4, 4]
    # evaluations after steps 2 | 4, 6 (the one after step 8 follows the last report)
    assert [r["evaluate"].count for r in sink.reports] == [1, 2]
    for report in sink.reports:
        assert report["forward"].count == 4  # training's own
        assert report["evaluate/forward"].count == report["evaluate"].count * (6 + 2)
        assert report["evaluate/forward/transformer/h.0"].count > 0
        assert not any(p.startswith("evaluate/evaluate") for p in report.paths())
        assert report["evaluate"].total > report["evaluate/forward"].total > 0
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert logged[-1]["instrument/evaluate_ms"] == pytest.approx(
        sink.reports[-1]["evaluate"].total * 1e3
    )
    trainer.evaluate()  # after train(): nothing installed, nothing recorded
    assert_nothing_left(trainer)


DDP_RUN = """
import json, os, sys
sys.path.insert(0, {tests!r})
import torch.distributed, transformers
from test_integration_transformers import gpt2, TokenData
from instrument.integrations.transformers import InstrumentCallback
from instrument.sinks import InMemory
sink = InMemory()
args = transformers.TrainingArguments(
    output_dir={out!r}, per_device_train_batch_size=4, max_steps=4, logging_steps=2,
    report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, ddp_backend="gloo",
)
trainer = transformers.Trainer(
    model=gpt2(), args=args, train_dataset=TokenData(), callbacks=[InstrumentCallback(sinks=[sink])]
)
trainer.train()
report = sink.reports[-1]
grads = report["backward/ddp_all_reduce"] if "backward/ddp_all_reduce" in report else None
with open(os.path.join({out!r}, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({{"steps": report.steps, "grad_bytes": grads and grads.bytes,
               "parameters": sum(p.numel() for p in gpt2().parameters())}}, f)
# as PyTorch documents: without it gloo's teardown at exit can abort a rank (SIGABRT,
# "terminate called without an active exception") -- with or without instrument
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(180)
def test_ddp_training_shows_the_gradient_all_reduce(tmp_path: Path) -> None:
    """Under torchrun the callback gets the Trainer's model, not the DDP wrapper the
    Trainer trains: the gradient all-reduce was hidden in ``backward``."""
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_RUN.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    done = torchrun(script, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["steps"] == 2
        assert result["grad_bytes"] == 2 * 4 * result["parameters"]  # fp32 grads, 2 steps


def test_the_trainer_saves_checkpoints_under_the_callback(tmp_path: Path) -> None:
    """A checkpoint holds the scheduler's state_dict (its ``__dict__``): the timed ``step``
    must not be in it (it crashed ``torch.save`` at the first save)."""
    sink = InMemory()
    trainer = train(
        gpt2,
        InstrumentCallback(sinks=[sink]),
        output_dir=str(tmp_path),
        save_strategy="steps",
        save_steps=2,
    )
    saved = torch.load(tmp_path / "checkpoint-4" / "scheduler.pt", weights_only=False)
    assert not any(callable(value) for value in saved.values())
    assert [r["lr_scheduler"].count for r in sink.reports] == [1, 2]  # (after the tick)
    # the save after step 2 is in the second report (the one after step 4 follows the last)
    assert ["checkpoint" in r for r in sink.reports] == [False, True]
    saving = sink.reports[1]["checkpoint"]
    assert saving.count == 1
    assert saving.total > 0  # the files written: not in (other)
    assert_nothing_left(trainer)


def test_a_resumed_run_times_the_loader_that_skips_the_seen_batches(tmp_path: Path) -> None:
    """Resumed mid-epoch, the Trainer iterates the loader ``skip_first_batches`` makes from
    the train loader: it is timed too (the ``data`` line and samples were missing)."""
    train(gpt2, None, steps=2, output_dir=str(tmp_path), save_strategy="steps", save_steps=2)
    sink = InMemory()
    callback = InstrumentCallback(sinks=[sink])
    torch.manual_seed(0)
    trainer = transformers.Trainer(
        model=gpt2(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=BATCH, max_steps=6,
            logging_steps=2, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        ),
        train_dataset=TokenData(),
        callbacks=[callback],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [r.steps for r in sink.reports] == [2, 2]  # steps 3-4 and 5-6
    for report in sink.reports:
        assert report["data"].count == report["forward"].count == 2
        rates = report.throughput
        assert rates is not None
        assert rates.samples == rates.steps * BATCH
    assert_nothing_left(trainer)


def test_a_ratio_of_logging_steps_reports_at_each_log() -> None:
    """``logging_steps=0.5`` of 4 steps: the Trainer logs every 2 steps, so do the reports."""
    sink = InMemory()
    trainer = train(gpt2, InstrumentCallback(sinks=[sink]), logging_steps=0.5)
    assert [r.steps for r in sink.reports] == [2, 2]
    logged = [e["step"] for e in trainer.state.log_history if "instrument/step_ms" in e]
    assert logged == [2, 4]


def test_a_given_reporter_is_used_feeds_the_logs_and_is_left_open() -> None:
    sink = InMemory()
    reporter = Reporter(every=2, sinks=[sink], normalizer="steps")
    trainer = train(gpt2, InstrumentCallback(reporter=reporter))
    assert [r.steps for r in sink.reports] == [2, 2]
    assert not reporter.closed
    logged = [e["step"] for e in trainer.state.log_history if "instrument/step_ms" in e]
    assert logged == [2, 4]
    reporter.close(flush=False)


class _Failing(transformers.TrainerCallback):  # type: ignore[misc]
    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom")


def test_after_a_train_that_raised_remove_takes_everything_off() -> None:
    """The Trainer has no exception event: ``callback.remove()`` after catching it."""
    callback = InstrumentCallback(sinks=[])
    torch.manual_seed(0)
    trainer = transformers.Trainer(
        model=gpt2(),
        args=transformers.TrainingArguments(
            output_dir="/tmp/instrument-hf-tests", per_device_train_batch_size=BATCH,
            max_steps=4, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        ),
        train_dataset=TokenData(),
        callbacks=[callback, _Failing()],
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert callback.handle is not None  # (no on_train_end)
    callback.remove()
    callback.remove()
    assert callback.handle is None
    assert_nothing_left(trainer)


def test_losses_are_bit_identical_with_and_without_the_callback() -> None:
    plain = train(gpt2, None, steps=3, logging_steps=1)
    timed = train(gpt2, InstrumentCallback(sinks=[]), steps=3, logging_steps=1)
    assert losses(timed) == losses(plain)
    for a, b in zip(plain.model.parameters(), timed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_llama_gradient_checkpointing_attributes_recompute_per_block() -> None:
    sink = InMemory()
    trainer = train(
        llama,
        InstrumentCallback(sinks=[sink], log="none"),
        steps=2,
        **{CHECKPOINTING_ARG: True},
    )
    report = sink.reports[-1]
    paths = set(report.paths())
    for block in ("layers.0", "layers.1"):
        assert f"backward/recompute/model/{block}/self_attn" in paths
        assert f"backward/recompute/model/{block}/mlp" in paths
        assert report[f"backward/recompute/model/{block}"].count == 2
    assert "backward/self_attn" not in paths
    assert "backward/mlp" not in paths
    assert report["backward/recompute"].count == 4  # two blocks, two steps
    assert "instrument/forward_ms" not in trainer.state.log_history[0]
    assert_nothing_left(trainer)


def test_gpt2_gradient_checkpointing_keeps_blocks_apart() -> None:
    torch.manual_seed(0)
    model = gpt2()
    enable = getattr(model, "activation_checkpointing_enable", None)  # 5.23+; before: gradient_
    (enable or model.gradient_checkpointing_enable)()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = TokenData()[0]["input_ids"][None]
    import instrument

    sink = InMemory()
    with instrument.auto(model, opt, every=1, sinks=[sink], collectives=False):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    paths = set(sink.reports[0].paths())
    assert "backward/recompute/transformer/h.0/attn" in paths
    assert "backward/recompute/transformer/h.1/mlp/c_fc" in paths
    assert "backward/attn" not in paths


@pytest.mark.slow
def test_torch_compile_flag_keeps_forward() -> None:
    sink = InMemory()
    train(
        gpt2,
        InstrumentCallback(sinks=[sink], log="none"),
        steps=2,
        torch_compile=True,
        torch_compile_backend="eager",
    )
    report = sink.reports[-1]
    assert report["forward"].count == 2
    assert report["forward"].total > 0
    assert report["backward"].count == 2
    assert not any(p.startswith("forward/") for p in report.paths())  # one compiled call
    assert (report.other or 0.0) < report["forward"].total


def test_count_batch_reads_shapes() -> None:
    ids = torch.zeros(3, 7, dtype=torch.long)
    assert count_batch({"input_ids": ids}) == (3, 21)
    assert count_batch(torch.zeros(5)) == (5, None)
    assert count_batch({"pixel_values": torch.zeros(2, 3)}) == (None, None)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown log 'loud'"):
        InstrumentCallback(log="loud")
    with pytest.raises(TypeError, match="unexpected keyword argument 'optimizer'"):
        InstrumentCallback(optimizer=None)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown backward 'no'"):
        InstrumentCallback(backward="no")  # checked when made, not at train()
    with pytest.raises(TypeError, match="count_batch must be"):
        InstrumentCallback(count_batch=3)  # type: ignore[arg-type]


def test_count_tokens_is_a_deprecated_spelling_of_count_batch() -> None:
    with pytest.warns(DeprecationWarning, match="use count_batch="):
        callback = InstrumentCallback(count_tokens=False)
    assert callback.count_batch is None
    counted = InstrumentCallback(count_batch=lambda batch: (1, None))
    assert callable(counted.count_batch)


@pytest.mark.slow  # a subprocess
def test_core_import_pulls_in_no_trainer_library() -> None:
    code = (
        "import sys, instrument, instrument.integrations; "
        "import torch; m = torch.nn.Linear(2, 2); "
        "h = instrument.auto(m, torch.optim.SGD(m.parameters(), lr=0.1), sinks=[]); h.remove(); "
        "bad = [n for n in ('transformers', 'accelerate', 'lightning', 'pytorch_lightning') "
        "if n in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    with warnings.catch_warnings():
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_loader_that_cannot_be_timed_never_stops_training() -> None:
    from types import SimpleNamespace

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    callback = InstrumentCallback(sinks=[])
    args = SimpleNamespace(logging_strategy="steps", logging_steps=5)
    with pytest.warns(RuntimeWarning, match=r"generator in place.*without the 'data' line"):
        callback.on_train_begin(
            args, None, None, model=model, optimizer=opt, train_dataloader=(i for i in range(3))
        )
    assert callback.handle is not None
    assert callback.handle.reporter.every == 5
    callback.on_train_end(args, None, None)
    assert callback.handle is None


def test_a_users_own_reporter_sees_every_step_beside_the_callback(tmp_path: Path) -> None:
    sink = InMemory()
    mine = Reporter(every=None, sinks=[JSONL(tmp_path / "mine.jsonl")], diagnose=False)
    train(gpt2, InstrumentCallback(sinks=[sink]), steps=4, logging_steps=2)
    mine.close()
    (own,) = read_file(tmp_path / "mine.jsonl").reports
    callback_forwards = sum(report["forward"].count for report in sink.reports)
    assert [report.steps for report in sink.reports] == [2, 2]
    assert callback_forwards == own["forward"].count == 4  # both saw every step's forward
    assert sum(report["optimizer"].count for report in sink.reports) == own["optimizer"].count
