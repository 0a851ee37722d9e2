"""Lightning: ``InstrumentCallback`` and ``InstrumentProfiler`` on a real ``Trainer.fit()``.

The model, loader and optimizer advance a FakeClock by known amounts, so every line of the
tree is asserted exactly: ``training_step`` (forward and loss), ``backward``, ``optimizer``
(the update alone, although Lightning runs training_step, zero_grad and backward inside
``optimizer.step(closure)``), ``zero_grad``, ``data`` — and nothing is left in ``(other)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_helpers import free_port
from torch import nn

import instrument
from instrument.auto import installed_handles
from instrument.hooks import data as data_hooks
from instrument.sinks import InMemory
from instrument.testing import FakeClock

pl = pytest.importorskip("lightning.pytorch")

from instrument.integrations.lightning import (  # noqa: E402
    InstrumentCallback,
    InstrumentProfiler,
    batch_counts,
)

# fake seconds each piece of a step takes
DATA, FORWARD, LOSS, BACKWARD, UPDATE, ZERO, SCHED = 1, 3, 0.5, 4, 5, 0.25, 2.0
BATCH, FEATURES = 4, 3


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: FakeClock) -> torch.Tensor:
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.advance(BACKWARD)
        return grad, None


class Net(nn.Module):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.lin = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(FORWARD)
        return _SlowBackward.apply(self.lin(x), self.clock)  # type: ignore[no-any-return]


class ClockedSGD(torch.optim.Optimizer):
    """SGD whose update takes UPDATE and whose zero_grad takes ZERO fake seconds."""

    def __init__(self, params: Any, clock: FakeClock) -> None:
        super().__init__(params, {"lr": 0.05})
        self.clock = clock

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.clock.advance(UPDATE)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.clock.advance(ZERO)
        super().zero_grad(set_to_none)


class ClockedScheduler(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer: ClockedSGD) -> None:
        self.clock = optimizer.clock
        super().__init__(optimizer, lambda epoch: 1.0)

    def step(self, epoch: int | None = None) -> None:
        if getattr(self, "clock", None) is not None:
            self.clock.advance(SCHED)
        super().step(epoch)


class Module(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, clock: FakeClock, *, manual: bool = False, scheduler: bool = False) -> None:
        super().__init__()
        self.clock = clock
        self.net = Net(clock)
        self.automatic_optimization = not manual
        self.scheduler = scheduler
        self.losses: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.clock.advance(LOSS)
        self.losses.append(loss.detach().clone())
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self) -> Any:
        opt = ClockedSGD(self.parameters(), self.clock)
        if not self.scheduler:
            return opt
        schedule = {"scheduler": ClockedScheduler(opt), "interval": "step"}
        return {"optimizer": opt, "lr_scheduler": schedule}


class ValidatedModule(Module):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        nn.functional.mse_loss(self(x), y)


class ClockedCollate:
    """Stacks a batch and takes DATA fake seconds doing it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        self.clock.advance(DATA)
        return torch.utils.data.default_collate(items)


def loader(clock: FakeClock, batches: int = 8) -> torch.utils.data.DataLoader[Any]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batches * BATCH, FEATURES, generator=gen)
    y = torch.randn(batches * BATCH, 1, generator=gen)
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, collate_fn=ClockedCollate(clock))


def fit(
    clock: FakeClock,
    logger: Any = False,
    *,
    callbacks: list[Any] | None = None,
    profiler: Any = None,
    steps: int = 4,
    epochs: int = 1,
    batches: int = 8,
    val: bool = False,
    manual: bool = False,
    scheduler: bool = False,
    module: type[Module] | None = None,
    **trainer_options: Any,
) -> Module:
    torch.manual_seed(0)
    kind = module or (ValidatedModule if val else Module)
    model = kind(clock, manual=manual, scheduler=scheduler)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=epochs,
        callbacks=callbacks,
        profiler=profiler,
        enable_progress_bar=False,
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=2 if val else 0,
        num_sanity_val_steps=2 if val else 0,
        **trainer_options,
    )
    trainer.fit(model, loader(clock, batches), loader(clock, 2) if val else None)
    return model


def assert_step(report: instrument.Report, steps: int, accumulate: int = 1) -> None:
    """The exact tree of ``steps`` optimizer steps of ``accumulate`` batches each."""
    assert report.steps == steps
    expected = {
        "data": (DATA * accumulate, steps * accumulate),
        "training_step": ((FORWARD + LOSS) * accumulate, steps * accumulate),
        "training_step/forward": (FORWARD * accumulate, steps * accumulate),
        "training_step/forward/net": (FORWARD * accumulate, steps * accumulate),
        "backward": (BACKWARD * accumulate, steps * accumulate),
        "optimizer": (UPDATE, steps),
        "zero_grad": (ZERO, steps),
    }
    for path, (per_step, count) in expected.items():
        node = report[path]
        assert (node.total, node.count) == (pytest.approx(per_step), count), path
    assert report.step_time is not None
    assert report.step_time.total == pytest.approx(
        (DATA + FORWARD + LOSS + BACKWARD) * accumulate + UPDATE + ZERO
    )
    assert report.other == pytest.approx(0.0, abs=1e-9)
    assert report.throughput is not None
    assert report.throughput.samples_per_sec == pytest.approx(
        BATCH * accumulate / report.step_time.total
    )


def assert_nothing_left(model: Module) -> None:
    assert installed_handles() == ()
    for attr in ("forward", "training_step", "manual_backward", "lr_scheduler_step"):
        assert attr not in model.__dict__, attr
    assert "forward" not in model.net.__dict__
    opt = model.trainer.optimizers[0]
    assert not opt._optimizer_step_pre_hooks
    assert not opt._optimizer_step_post_hooks
    assert "zero_grad" not in opt.__dict__
    fetcher = model.trainer.fit_loop._data_fetcher
    assert fetcher is None or type(fetcher) not in data_hooks._subclasses.values()
    assert instrument.Reporter(every=None).flush().paths() == ()  # no stray record


@pytest.fixture
def sink() -> InMemory:
    return InMemory()


# -- the tree ----------------------------------------------------------------------------


def test_callback_gives_the_plain_loop_tree_from_the_first_batch(
    clock: FakeClock, sink: InMemory
) -> None:
    model = fit(clock, callbacks=[InstrumentCallback(every=2, sinks=[sink])], steps=4)
    assert len(sink.reports) == 2
    for report in sink.reports:  # the first one has the first epoch's first batches
        assert_step(report, 2)
        assert set(report.paths()) == {
            "data",
            "training_step",
            "training_step/forward",
            "training_step/forward/net",
            "training_step/forward/net/lin",
            "backward",
            "optimizer",
            "zero_grad",
        }
    assert_nothing_left(model)


def test_profiler_gives_the_same_tree(clock: FakeClock, sink: InMemory) -> None:
    callback_sink = InMemory()
    fit(clock, callbacks=[InstrumentCallback(every=2, sinks=[callback_sink])])
    profiler = InstrumentProfiler(every=2, sinks=[sink])
    model = fit(clock, profiler=profiler)
    assert len(sink.reports) == len(callback_sink.reports) == 2
    for mine, theirs in zip(sink.reports, callback_sink.reports, strict=True):
        assert mine.paths() == theirs.paths()
        assert [n.total for n in mine.nodes] == [n.total for n in theirs.nodes]
        assert [n.count for n in mine.nodes] == [n.count for n in theirs.nodes]
    assert_step(sink.reports[0], 2)
    assert profiler.reporter is not None
    assert profiler.reporter.closed
    assert profiler._callback not in model.trainer.callbacks  # taken out at teardown
    assert_nothing_left(model)


def test_gradient_accumulation_is_counted_once_in_one_place(
    clock: FakeClock, sink: InMemory
) -> None:
    model = fit(
        clock,
        callbacks=[InstrumentCallback(every=2, sinks=[sink])],
        steps=4,
        accumulate_grad_batches=2,
    )
    assert len(sink.reports) == 2  # one step per optimizer step, not per batch
    for report in sink.reports:
        assert_step(report, 2, accumulate=2)
        assert not any(path.startswith("optimizer/") for path in report.paths())
    assert_nothing_left(model)


def test_manual_optimization_gives_the_same_tree(clock: FakeClock, sink: InMemory) -> None:
    model = fit(clock, callbacks=[InstrumentCallback(every=2, sinks=[sink])], manual=True)
    assert len(sink.reports) == 2
    for report in sink.reports:
        assert_step(report, 2)
        assert not any(
            path.startswith(("training_step/backward", "training_step/optimizer"))
            for path in report.paths()
        )
    assert_nothing_left(model)


def test_every_epoch_has_its_data_line(clock: FakeClock, sink: InMemory) -> None:
    fit(
        clock,
        callbacks=[InstrumentCallback(every=4, sinks=[sink])],
        steps=-1,
        epochs=2,
        batches=4,
    )
    assert [r["data"].count for r in sink.reports] == [4, 4]
    for report in sink.reports:
        assert_step(report, 4)


def test_validation_clipping_and_scheduler_lines(clock: FakeClock, sink: InMemory) -> None:
    model = fit(
        clock,
        callbacks=[InstrumentCallback(every=4, sinks=[sink])],
        steps=-1,
        epochs=2,
        batches=4,
        val=True,
        scheduler=True,
        gradient_clip_val=0.5,
    )
    first, second = sink.reports
    assert "validation" not in first  # the sanity check runs before training starts
    # the first epoch's validation ran after its last step: in the second interval
    assert second["validation"].count == 1
    assert second["validation/forward/net"].count == 2
    assert second["validation/forward"].total == pytest.approx(2 * FORWARD / 4)
    # the scheduler steps after each optimizer step: the 4th step's is in the 2nd interval,
    # and the last one's (after the last step) is in none
    assert [r["lr_scheduler"].count for r in sink.reports] == [3, 4]
    assert second["lr_scheduler"].total == pytest.approx(SCHED)
    assert [r["clip_grad_norm"].count for r in sink.reports] == [4, 4]
    assert not any(path.startswith("optimizer/") for r in sink.reports for path in r.paths())
    for report in sink.reports:
        assert report.other == pytest.approx(0.0, abs=1e-9)
    assert_nothing_left(model)


def test_checkpoint_saves_have_their_own_line(
    clock: FakeClock, sink: InMemory, tmp_path: Path
) -> None:
    """``ModelCheckpoint`` writes through ``trainer.save_checkpoint``: one ``checkpoint``
    region per save (it was in ``(other)``), in the interval after the step that saved."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=8, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[InstrumentCallback(every=4, sinks=[sink]), saving],
    )  # fmt: skip
    model = Module(clock)
    trainer.fit(model, loader(clock, 8))
    assert len(list(tmp_path.glob("*.ckpt"))) == 4
    # saves after steps 2 | 4, 6 (the one after step 8 follows the last report)
    assert [r["checkpoint"].count if "checkpoint" in r else 0 for r in sink.reports] == [1, 2]
    assert "save_checkpoint" not in vars(trainer)
    assert_nothing_left(model)


@pytest.mark.parametrize("ending", ["max_epochs", "max_steps", "manual"])
def test_what_follows_the_last_step_is_dropped_also_from_a_partial_interval(
    clock: FakeClock, sink: InMemory, ending: str
) -> None:
    """5 steps reported every 3: the last report has 2 steps, and the epoch-end validation
    and the last scheduler step that run after the fit's last step are in no report — as
    when ``every`` divides the steps (they were in the partial one: validation at
    thousands of % of its one step)."""
    by = {"steps": 5, "epochs": 2} if ending == "max_steps" else {"steps": -1, "epochs": 1}
    manual = ending == "manual"  # (Lightning steps no scheduler then)
    model = fit(
        clock,
        callbacks=[InstrumentCallback(every=3, sinks=[sink])],
        batches=5,
        val=True,
        scheduler=not manual,
        manual=manual,
        **by,
    )
    first, last = sink.reports
    assert (first.steps, last.steps) == (3, 2)
    assert "validation" not in last
    if not manual:
        assert [r["lr_scheduler"].count for r in sink.reports] == [2, 2]
    assert last.other == pytest.approx(0.0, abs=1e-9)
    assert_nothing_left(model)


def test_no_clip_grad_norm_line_without_clipping(clock: FakeClock, sink: InMemory) -> None:
    fit(clock, callbacks=[InstrumentCallback(every=4, sinks=[sink])])
    assert "clip_grad_norm" not in sink.last
    assert "lr_scheduler" not in sink.last


# -- training is unchanged ---------------------------------------------------------------


@pytest.mark.parametrize("manual", [False, True])
def test_losses_and_weights_are_bit_identical(clock: FakeClock, manual: bool) -> None:
    plain = fit(clock, manual=manual, steps=6)
    timed = fit(clock, callbacks=[InstrumentCallback(every=2, sinks=[])], manual=manual, steps=6)
    profiled = fit(clock, profiler=InstrumentProfiler(every=2, sinks=[]), manual=manual, steps=6)
    assert len(plain.losses) == 6
    for other in (timed, profiled):
        assert all(torch.equal(a, b) for a, b in zip(plain.losses, other.losses, strict=True))
        for a, b in zip(plain.parameters(), other.parameters(), strict=True):
            assert torch.equal(a, b)


def test_an_exception_in_training_step_tears_everything_down(
    clock: FakeClock, sink: InMemory
) -> None:
    class Failing(Module):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 2:
                raise ValueError("boom at batch 2")
            return super().training_step(batch, batch_idx)  # type: ignore[no-any-return]

    model = Failing(clock)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        callbacks=[InstrumentCallback(every=None, sinks=[sink])],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    with pytest.raises(ValueError, match="boom at batch 2"):
        trainer.fit(model, loader(clock))
    assert sink.last.steps == 2
    assert_nothing_left(model)


def test_a_fit_that_cannot_be_timed_warns_and_trains(clock: FakeClock, sink: InMemory) -> None:
    torch.manual_seed(0)
    model = Module(clock)
    handle = instrument.auto(model, every=None, sinks=[])  # the user's own auto on the model
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=[InstrumentCallback(every=1, sinks=[sink])],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    with pytest.warns(RuntimeWarning, match="this fit is not timed: instrument.auto is already"):
        trainer.fit(model, loader(clock))
    assert len(model.losses) == 2
    assert sink.reports == []
    assert "training_step" not in model.__dict__
    handle.remove()


# -- options and counting ----------------------------------------------------------------


def test_batch_counts() -> None:
    x = torch.zeros(5, 2)
    assert batch_counts(x) == (5, None)
    assert batch_counts((x, torch.zeros(5))) == (5, None)
    assert batch_counts([{"a": 1}, [x]]) == (5, None)
    ids = torch.zeros(3, 7, dtype=torch.long)
    assert batch_counts({"input_ids": ids, "labels": ids}) == (3, 21)
    assert batch_counts("text") == (None, None)
    assert batch_counts(torch.tensor(1.0)) == (None, None)


def test_count_batch_function_and_none(clock: FakeClock, sink: InMemory) -> None:
    fit(clock, callbacks=[InstrumentCallback(every=4, sinks=[sink], count_batch=lambda b: (1, 10))])
    rates = sink.last.throughput
    assert rates is not None
    assert sink.last.step_time is not None
    assert rates.tokens_per_sec == pytest.approx(10 / sink.last.step_time.total)
    sink.clear()
    fit(clock, callbacks=[InstrumentCallback(every=4, sinks=[sink], count_batch=None)])
    assert sink.last.throughput is not None
    assert sink.last.throughput.samples_per_sec is None


def test_a_failing_count_batch_warns_once_and_training_goes_on(
    clock: FakeClock, sink: InMemory
) -> None:
    def broken(batch: Any) -> tuple[int, int]:
        raise KeyError("no such field")

    with pytest.warns(RuntimeWarning, match="counting the batch failed"):
        fit(clock, callbacks=[InstrumentCallback(every=4, sinks=[sink], count_batch=broken)])
    assert sink.last.steps == 4


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"every": 0}, ValueError, "every must be a positive int"),
        ({"backward": "yes"}, ValueError, "unknown backward"),
        ({"clock": "sundial"}, ValueError, "sundial"),
        ({"count_batch": 3}, TypeError, "count_batch must be"),
        ({"log": "some"}, ValueError, "unknown log"),
        ({"reporter": instrument.Reporter, "every": 5}, ValueError, "pass either reporter="),
    ],
)
def test_bad_options_fail_when_made(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        InstrumentCallback(**options)
    with pytest.raises(error, match=match):
        InstrumentProfiler(**options)


def test_a_given_reporter_is_used_and_left_open(clock: FakeClock, sink: InMemory) -> None:
    reporter = instrument.Reporter(every=2, sinks=[sink], normalizer="steps")
    callback = InstrumentCallback(reporter=reporter)
    fit(clock, callbacks=[callback])
    assert callback.reporter is reporter
    assert not reporter.closed
    assert len(sink.reports) == 2
    assert_step(sink.last, 2)
    reporter.close()


class RecordingLogger(pl.loggers.Logger):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


@pytest.mark.parametrize("log", ["compact", "all", "none"])
def test_reports_reach_the_trainers_loggers(clock: FakeClock, sink: InMemory, log: str) -> None:
    recording = RecordingLogger()
    fit(clock, callbacks=[InstrumentCallback(every=2, sinks=[sink], log=log)], logger=recording)
    mine = [
        (step, m) for step, m in recording.logged if any(k.startswith("instrument/") for k in m)
    ]
    if log == "none":
        assert mine == []
        return
    assert [step for step, _ in mine] == [2, 4]  # the global step after each report's last
    metrics = mine[0][1]
    if log == "compact":
        assert metrics["instrument/optimizer_ms"] == pytest.approx(UPDATE * 1e3)
        assert metrics["instrument/training_step_ms"] == pytest.approx((FORWARD + LOSS) * 1e3)
        assert metrics["instrument/other_ms"] == pytest.approx(0.0, abs=1e-6)
        assert "instrument/samples_per_sec" in metrics
        assert not any("forward" in key for key in metrics)  # log_depth=1
    else:
        assert metrics["instrument/time/training_step/forward/total_ms"] == pytest.approx(
            FORWARD * 1e3
        )


class TwoOptimizers(Module):
    """Manual optimization with two optimizers (a GAN's shape): Lightning's global step
    counts both steps, instrument's steps the last one's."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        first, second = self.optimizers()
        for opt in (first, second):
            loss = nn.functional.mse_loss(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self) -> Any:
        return ClockedSGD(self.parameters(), self.clock), ClockedSGD(self.parameters(), self.clock)


class GlobalSteps(pl.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.seen.append(trainer.global_step)


def test_reports_are_logged_at_the_global_step_of_their_last_step(
    clock: FakeClock, sink: InMemory
) -> None:
    """Two optimizers stepped by hand: each batch is two global steps and one instrument
    step; a report of 2 steps goes to the loggers at the global step its last batch ended
    at (4, 8, 12), not at instrument's step count (2, 4, 6)."""
    recording, steps = RecordingLogger(), GlobalSteps()
    callback = InstrumentCallback(every=2, sinks=[sink])
    fit(
        clock,
        callbacks=[callback, steps],
        logger=recording,
        steps=12,
        batches=6,
        manual=True,
        module=TwoOptimizers,
    )
    logged = [step for step, m in recording.logged if "instrument/step_ms" in m]
    assert steps.seen == [2, 4, 6, 8, 10, 12]
    assert [report.step for report in sink.reports] == [2, 4, 6]
    assert logged == [4, 8, 12]


DDP_FIT = """
import json, os, sys
import torch
import lightning.pytorch as pl
from torch import nn
from instrument.integrations.lightning import InstrumentCallback
from instrument.sinks import InMemory


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, index):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sink = InMemory()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=4, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[InstrumentCallback(every=2, sinks=[sink])],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
    report = sink.reports[-1]
    grads = report["backward/ddp_all_reduce"] if "backward/ddp_all_reduce" in report else None
    with open(os.path.join(sys.argv[1], "rank%d.json" % trainer.global_rank), "w") as f:
        json.dump({"steps": report.steps, "grad_bytes": grads and grads.bytes}, f)
"""


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(180)
def test_ddp_fit_shows_the_gradient_all_reduce(tmp_path: Path) -> None:
    """Lightning's DDP strategy wraps the LightningModule the callback is given: the
    gradient all-reduce was hidden in ``backward``. (Lightning starts rank 1 itself.)"""
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_FIT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["MASTER_PORT"] = str(free_port())
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=170, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    parameters = 8 * 16 + 16 + 16 + 1
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["steps"] == 2
        assert result["grad_bytes"] == 2 * 4 * parameters  # fp32 grads, 2 steps


def test_pytorch_lightning_package(clock: FakeClock, sink: InMemory) -> None:
    ptl = pytest.importorskip("pytorch_lightning")
    from instrument.integrations import pytorch_lightning as integration

    class OldModule(ptl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = Net(clock)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            clock.advance(LOSS)
            return loss

        def configure_optimizers(self) -> Any:
            return ClockedSGD(self.parameters(), clock)

    for option in ("callbacks", "profiler"):
        sink.clear()
        made = integration.InstrumentCallback if option == "callbacks" else None
        extra: dict[str, Any] = (
            {"callbacks": [made(every=2, sinks=[sink])]}
            if made
            else {"profiler": integration.InstrumentProfiler(every=2, sinks=[sink])}
        )
        trainer = ptl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=2,
            enable_progress_bar=False,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            **extra,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(OldModule(), loader(clock))
        # the LightningModule's own forward never runs, its net does: no "forward unseen"
        assert not [w for w in caught if "forward was not timed" in str(w.message)]
        report = sink.last
        assert report["training_step/net"].total == pytest.approx(FORWARD)  # no self(x): net
        assert report["optimizer"].total == pytest.approx(UPDATE)
        assert report.other == pytest.approx(0.0, abs=1e-9)


class _Plain(pl.LightningModule):
    """A module on the real clock, to be compiled (the FakeClock cannot be traced)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_compiled_module_fits_with_fullgraph_and_no_graph_break(sink: InMemory) -> None:
    """``trainer.fit(torch.compile(model, fullgraph=True))`` with the callback: Lightning
    compiles ``forward`` and ``training_step`` in place, and the timed ``forward`` must not
    carry Dynamo's marks of the compiled one (it was taken for it, ``self`` bound twice:
    an error with ``fullgraph=True``, a graph break and no ``forward`` line without)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[InstrumentCallback(every=2, sinks=[sink])],
    )  # fmt: skip
    compiled = torch.compile(_Plain(), backend="eager", fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(compiled, torch.utils.data.DataLoader(data, batch_size=8))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert len(sink.reports) == 2
    for report in sink.reports:
        assert {"training_step", "backward", "optimizer", "zero_grad"} <= set(report.paths())
        assert report["training_step"].count == 2
        assert not any(path.startswith("training_step/") for path in report.paths())
    # the forward ran inside Lightning's compiled training_step: said why, with advice
    # that fits (not auto's "compile the model itself", which the user did)
    said = [str(w.message) for w in caught if "instrument:" in str(w.message)]
    assert len(said) == 1
    assert "makes Lightning compile training_step itself" in said[0]


def test_auto_on_what_fabric_setup_returns(sink: InMemory) -> None:
    """Lightning Fabric: ``auto(*fabric.setup(model, opt))``. Its module wrapper holds yours
    as ``_forward_module`` (seen through: no such path), and its optimizer wrapper runs the
    optimizer class's ``zero_grad`` on itself (timed too: the line was missing)."""
    fabric_module = pytest.importorskip("lightning.fabric")
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    wrapped, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with instrument.auto(wrapped, opt, every=None, sinks=[sink], collectives=False) as handle:
        for _ in range(3):
            fabric.backward(wrapped(torch.randn(4, 8)).sum())
            opt.step()
            opt.zero_grad()
        report = handle.reporter.flush()
    assert set(report.paths()) == {
        "forward", "forward/0", "forward/1", "forward/2", "backward", "optimizer", "zero_grad"
    }  # fmt: skip
    for path in report.paths():
        assert report[path].count == 3, path
    assert "zero_grad" not in vars(opt)
    assert "zero_grad" not in vars(opt.optimizer)
    assert not any("forward" in vars(m) for m in model.modules())
