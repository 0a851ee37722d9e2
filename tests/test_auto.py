"""instrument.auto(): module, backward, optimizer and data regions on real models."""

from __future__ import annotations

import contextlib
import copy
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import TinyLM, lm_loss
from torch import nn

import instrument
from instrument.hooks import modules as module_hooks
from instrument.sinks import InMemory
from instrument.testing import FakeClock, use_clock

VOCAB = 64


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(n: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4, 12), generator=gen) for _ in range(n)]


@pytest.fixture
def sink() -> InMemory:
    return InMemory()


def train(model: nn.Module, opt: torch.optim.Optimizer, data: list[torch.Tensor]) -> None:
    for tokens in data:
        lm_loss(model, tokens).backward()
        opt.step()
        opt.zero_grad()


# -- names and nesting --------------------------------------------------------------------


def test_regions_nest_as_calls_with_container_indices_joined(sink: InMemory) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=3, sinks=[sink], collectives=False)
    train(model, opt, batches(3))
    report = sink.last
    paths = set(report.paths())
    assert {"forward", "forward/embed", "forward/encoder", "forward/head"} <= paths
    assert "forward/encoder/layers.0/self_attn" in paths
    assert "forward/encoder/layers.1/linear2" in paths
    assert not any(p.endswith("/layers") or "/0/" in p for p in paths)  # ModuleList never runs
    assert {"backward", "optimizer", "zero_grad"} <= paths
    assert report.steps == 3
    assert report["forward/encoder/layers.0"].count == 3
    assert "step (3 steps)" in report.render()
    handle.remove()


def test_sequential_children_are_named_by_index() -> None:
    targets = module_hooks.plan(mlp())
    assert [t.name for t in targets] == ["forward", "0", "1", "2"]


def test_depth_include_exclude_select_modules() -> None:
    model = TinyLM()
    names = [t.name for t in module_hooks.plan(model, depth=0)]
    assert names == ["forward"]
    names = [t.name for t in module_hooks.plan(model, depth=1)]
    assert names == ["forward", "embed", "encoder", "head"]
    names = [t.name for t in module_hooks.plan(model, depth=2)]
    assert names == ["forward", "embed", "encoder", "layers.0", "layers.1", "head"]

    included = module_hooks.plan(model, include=["encoder.layers.1"])
    assert [t.name for t in included][:2] == ["forward", "encoder.layers.1"]
    assert all(t.qualname.startswith("encoder.layers.1") for t in included[1:])

    quals = [t.qualname for t in module_hooks.plan(model, exclude=["*dropout*", "head"])]
    assert "head" not in quals
    assert not any("dropout" in q for q in quals)
    assert "encoder.layers.0.linear1" in quals

    by_type = [t.qualname for t in module_hooks.plan(model, exclude=nn.Dropout)]
    assert not any("dropout" in q for q in by_type)
    # excluding a module takes what is below it too; its children are not re-parented
    quals = [t.qualname for t in module_hooks.plan(model, exclude="encoder")]
    assert not any(q.startswith("encoder") for q in quals)


def test_excluded_parent_children_named_relative_to_timed_ancestor(sink: InMemory) -> None:
    model = TinyLM()
    targets = module_hooks.plan(model, include=["encoder.layers.*"])
    assert targets[1].name == "encoder.layers.0"
    with instrument.auto(model, include="encoder.layers.*", sinks=[sink], collectives=False):
        model(batches(1)[0])
    assert "forward/encoder.layers.0/self_attn" in sink.last


def test_shared_module_is_timed_once() -> None:
    shared = nn.Linear(4, 4)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = shared
            self.b = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    assert [t.name for t in module_hooks.plan(Twice())] == ["forward", "a"]


def test_data_parallel_wrapper_is_transparent(sink: InMemory) -> None:
    model = nn.DataParallel(mlp())  # no GPU: DataParallel just calls the module
    assert [t.qualname for t in module_hooks.plan(model)] == ["", "0", "1", "2"]
    with instrument.auto(model, sinks=[sink], collectives=False):
        model(torch.randn(2, 8))
    assert set(sink.last.paths()) == {"forward", "forward/0", "forward/1", "forward/2"}


def test_bad_arguments_get_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        instrument.auto("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        instrument.auto(mlp(), "adam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown backward 'yes'"):
        instrument.auto(mlp(), backward="yes")
    with pytest.raises(TypeError, match="include entries"):
        instrument.auto(mlp(), include=[3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="level must be an int"):
        instrument.auto(mlp(), depth=-1)
    with pytest.raises(ValueError, match="unknown clock"):
        instrument.auto(mlp(), clock="gpu")
    with pytest.raises(ValueError, match="not both"):
        instrument.auto(mlp(), reporter=instrument.Reporter(every=None), sinks=[])


# -- the step line, (other), exact times with a fake clock ----------------------------------


class Busy(nn.Module):
    """Advances a fake clock by ``seconds`` per call, then calls its children."""

    def __init__(self, clock: FakeClock, seconds: float, *children: nn.Module) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds
        self.inner = nn.ModuleList(children)
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.seconds)
        for child in self.inner:
            x = child(x)
        return x * self.weight


def test_step_line_other_and_self_times_add_up(sink: InMemory) -> None:
    clock = FakeClock()
    with use_clock(clock):
        model = Busy(clock, 0.010, Busy(clock, 0.020), Busy(clock, 0.030))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        handle = instrument.auto(model, opt, every=2, sinks=[sink], collectives=False)
        for _ in range(2):
            clock.advance(0.005)  # outside every region: (other)
            model(torch.ones(1)).sum().backward()
            opt.step()
        handle.remove()
    report = sink.reports[0]
    assert report.steps == 2
    assert report.step_time is not None
    assert report.step_time.total == pytest.approx(0.065)  # per step
    assert report["forward"].total == pytest.approx(0.060)
    assert report["forward"].self == pytest.approx(0.010)
    assert report["forward/inner.0"].total == pytest.approx(0.020)
    assert report["forward/inner.1"].total == pytest.approx(0.030)
    assert report.other == pytest.approx(0.005)
    text = report.render()
    assert "(other)" in text
    assert "step (2 steps)" in text


# -- exceptions ---------------------------------------------------------------------------


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom inside forward")


def test_exception_in_a_module_propagates_and_closes_regions(sink: InMemory) -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Boom()))
    with instrument.auto(model, sinks=[sink], collectives=False) as handle:
        with pytest.raises(ValueError, match="boom inside forward"):
            model(torch.ones(1, 2))
        assert instrument.current_path() == ""
        report = handle.reporter.flush()
    assert report["forward/1/0"].count == 1
    assert report["forward/1"].count == 1
    assert report["forward"].count == 1


# -- backward -----------------------------------------------------------------------------


def test_backward_modules_nest_under_backward(sink: InMemory) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "no inputs require gradients"
        with instrument.auto(model, backward="modules", sinks=[sink], collectives=False) as h:
            lm_loss(model, batches(1)[0]).backward()
            report = h.reporter.flush()
    assert report["backward"].count == 1
    assert "backward/encoder/layers.0/self_attn" in report
    assert "backward/head" in report
    assert "backward/forward" not in report  # the root's backward is the backward region
    assert not any(p.startswith(("encoder", "head")) for p in report.paths())


class _TwoBranches(nn.Module):
    """Two branches fed the raw input: neither needs an input gradient, so PyTorch calls
    each branch's two backward hooks together, before its layers' backward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.b = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)  # type: ignore[no-any-return]


def test_backward_modules_are_named_as_in_forward_when_a_parent_closes_early(
    sink: InMemory,
) -> None:
    """Each layer's backward sits below its branch, as in forward: they were flattened to
    ``backward/0`` ... and the two branches' layers merged (6 calls in 3 steps)."""
    model = _TwoBranches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "no inputs require gradients"
        with instrument.auto(model, backward="modules", sinks=[sink], collectives=False) as h:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
            report = h.reporter.flush()
    forward = {p.removeprefix("forward/") for p in report.paths() if p.startswith("forward/")}
    backward = {p.removeprefix("backward/") for p in report.paths() if p.startswith("backward/")}
    assert backward == forward == {"a", "b", *(f"{br}/{i}" for br in "ab" for i in range(3))}
    assert all(report[f"backward/{path}"].count == 3 for path in backward)


def test_tensor_backward_and_autograd_backward_are_timed_once_each(sink: InMemory) -> None:
    model = mlp()
    with instrument.auto(model, sinks=[sink], collectives=False) as h:
        model(torch.randn(2, 8)).sum().backward()
        torch.autograd.backward(model(torch.randn(2, 8)).sum())
        report = h.reporter.flush()
    assert report["backward"].count == 2
    assert "backward/backward" not in report


# -- optimizer ----------------------------------------------------------------------------


def test_gradient_accumulation_reports_per_optimizer_step(sink: InMemory) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters())
    with instrument.auto(model, opt, every=2, sinks=[sink], collectives=False):
        for i, tokens in enumerate(batches(8)):
            (lm_loss(model, tokens) / 4).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()
    report = sink.reports[0]
    assert report.steps == 2
    assert report["forward"].count == 8
    assert report["backward"].count == 8
    assert report["optimizer"].count == 2


def test_several_optimizers_tick_once_per_iteration(sink: InMemory) -> None:
    model = mlp()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters())
    with instrument.auto(model, [first, second], every=3, sinks=[sink], collectives=False):
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            first.step()
            second.step()
    report = sink.reports[0]
    assert report.steps == 3
    assert report["optimizer"].count == 6


def test_grad_scaler_skipped_step_still_ends_the_iteration(sink: InMemory) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False) as handle:
        for i in range(3):
            loss = model(torch.randn(2, 8)).sum()
            scaler.scale(loss).backward()
            if i == 1:
                next(model.parameters()).grad.fill_(float("inf"))  # type: ignore[union-attr]
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert handle.skipped_steps == 1
    report = sink.reports[0]
    assert report.steps == 3
    assert report["optimizer"].count == 3
    assert "optimizer/optimizer" not in report


def test_the_step_after_one_that_raised_closes_its_region(sink: InMemory) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        raise RuntimeError("closure failed")

    with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
        with pytest.raises(RuntimeError, match="closure failed"):
            opt.step(closure)
        assert instrument.current_path() == ""  # a raising closure closes the step's region
        opt.step()
        assert instrument.current_path() == ""
        report = handle.reporter.flush()
    assert report["optimizer"].count == 2  # like any region that raised, it still counts
    assert "optimizer/optimizer" not in report


@pytest.mark.parametrize("scheduler", ["none", "before", "after"])
def test_a_step_that_raises_closes_its_region_and_the_loop_goes_on(
    sink: InMemory, scheduler: str
) -> None:
    """An exception inside ``step()`` skips PyTorch's post hook: the ``optimizer`` region
    stayed open and a loop that caught it filed its next iteration below it. The guard on
    ``step`` works with torch's LR scheduler wrapping ``step`` before or after auto()."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    failing = [False]

    def check(optimizer: object, args: object, kwargs: object) -> None:
        if failing[0]:
            raise FloatingPointError("nan in the gradients")

    def make_scheduler() -> torch.optim.lr_scheduler.LRScheduler:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1)

    schedulers = [make_scheduler()] if scheduler == "before" else []
    own_before = dict(vars(opt))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # also: no "lr_scheduler.step() before optimizer.step()"
        with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
            opt.register_step_pre_hook(check)  # runs after auto's pre hook
            if scheduler == "after":
                schedulers.append(make_scheduler())
            for i in range(4):
                model(torch.randn(2, 8)).sum().backward()
                failing[0] = i == 1
                try:
                    opt.step()
                except FloatingPointError:
                    assert instrument.current_path() == ""
                for s in schedulers:
                    s.step()
                opt.zero_grad()
            report = handle.reporter.flush()
    top = {p for p in report.paths() if "/" not in p}
    assert top == {"backward", "forward", "optimizer", "zero_grad"}
    assert not any(p.startswith("optimizer/") for p in report.paths())
    assert report["forward"].count == 4
    assert report["optimizer"].count == 4  # like any region that raised, it still counts
    assert report.steps == 3  # the step that raised ends no iteration
    if scheduler != "after":  # (a scheduler made meanwhile keeps its wrapper on opt)
        assert vars(opt).get("step") is own_before.get("step")
    for s in schedulers:
        assert s.last_epoch == 4


class ClippingSGD(torch.optim.SGD):
    """A subclass whose ``step`` calls ``super().step()``: once any SGD exists, torch has
    hooked ``SGD.step`` too, and runs the optimizer's step hooks twice per step."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.clamp_(-1.0, 1.0)
        if self.defaults.get("fail"):
            raise FloatingPointError("nan in the gradients")
        return super().step(closure)


def test_a_subclass_calling_super_step_is_one_step(sink: InMemory) -> None:
    """Torch ran auto's hooks twice per step: every step counted twice (throughput
    doubled), the outer region dropped and a warning about an unmatched exit."""
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)  # SGD.step is hooked by torch
    model = mlp()
    opt = ClippingSGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.randn(2, 8)).sum()
        loss.backward()
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
            for _ in range(3):
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
            opt.step(closure)  # the closure is timed once, below no optimizer
            opt.defaults["fail"] = True
            with pytest.raises(FloatingPointError):
                opt.step()
            assert instrument.current_path() == ""
            report = handle.reporter.flush()
    assert report.steps == 4
    assert report["optimizer"].count == 5  # the one that raised counts, like any region
    assert report["forward"].count == 4
    assert not any(p.startswith("optimizer/") for p in report.paths())


def test_a_step_that_bypasses_the_instance_step_is_timed_by_the_hooks(sink: InMemory) -> None:
    """The instance's ``step`` times the step; a ``step`` bound before ``auto`` (or the
    class's called directly) does not pass through it: the step hooks time those, and the
    iteration still ends — else no report at all. Each step is timed once either way."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bound_before = opt.step
    with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
        for how in ("bound before", "class", "instance"):
            model(torch.randn(2, 8)).sum().backward()
            if how == "bound before":
                bound_before()
            elif how == "class":
                type(opt).step(opt)
            else:
                opt.step()
            opt.zero_grad()
        report = handle.reporter.flush()
    assert report.steps == 3
    assert report["optimizer"].count == 3
    assert report["forward"].count == 3


def test_zero_grad_is_timed_and_restored() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with instrument.auto(model, opt, every=None, collectives=False) as handle:
        opt.zero_grad()
        assert handle.reporter.flush()["zero_grad"].count == 1
    assert "zero_grad" not in vars(opt)


# -- data ---------------------------------------------------------------------------------


def test_dataloader_with_workers_is_timed_in_place(sink: InMemory) -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(24.0).reshape(12, 2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with instrument.auto(
        model, opt, every=None, dataloader=loader, sinks=[sink], collectives=False
    ):
        assert isinstance(loader, torch.utils.data.DataLoader)
        seen = 0
        for (x,) in loader:
            model(x).sum().backward()
            opt.step()
            seen += len(x)
    assert seen == 12
    assert sink.last["data"].count == 4  # the end of the data is not a batch
    assert type(loader) is torch.utils.data.DataLoader


def test_data_wraps_any_iterable() -> None:
    reporter = instrument.Reporter(every=None)
    assert list(instrument.data(iter(range(3)))) == [0, 1, 2]
    wrapped = instrument.data([1, 2], name="batches")
    assert len(wrapped) == 2  # type: ignore[arg-type]
    assert list(wrapped) == [1, 2]
    report = reporter.flush()
    assert report["data"].count == 3
    assert report["batches"].count == 2


def test_a_generator_cannot_be_timed_in_place() -> None:
    with pytest.raises(TypeError, match=r"instrument\.data"):
        instrument.auto(mlp(), dataloader=(i for i in range(3)), collectives=False)


# -- numerics, autocast, undo -------------------------------------------------------------


def run_training(instrumented: bool, autocast: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = (
        instrument.auto(model, opt, every=2, sinks=[], collectives=False) if instrumented else None
    )
    for tokens in batches(4):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = lm_loss(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
    if handle is not None:
        handle.remove()
    return copy.deepcopy(model.state_dict())


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_results_are_bit_identical_with_and_without_instrument(autocast: bool) -> None:
    plain = run_training(False, autocast)
    timed = run_training(True, autocast)
    assert plain.keys() == timed.keys()
    for key in plain:
        assert torch.equal(plain[key], timed[key]), key


def hook_counts(model: nn.Module) -> list[int]:
    return [
        len(m._forward_hooks)
        + len(m._forward_pre_hooks)
        + len(m._backward_hooks)
        + len(m._backward_pre_hooks)
        for m in model.modules()
    ]


def test_remove_leaves_no_hook_anywhere() -> None:
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(batches(2), batch_size=None)
    originals = (torch.autograd.backward, vars(torch.amp.GradScaler)["step"])
    handle = instrument.auto(model, opt, dataloader=loader, backward="modules")
    assert sum(hook_counts(model)) > 0
    assert all("forward" in vars(m) for m in model.modules() if not isinstance(m, nn.ModuleList))
    assert torch.autograd.backward is not originals[0]
    handle.remove()
    handle.remove()  # idempotent
    assert sum(hook_counts(model)) == 0
    assert not any("forward" in vars(m) for m in model.modules())
    assert not opt._optimizer_step_pre_hooks
    assert not opt._optimizer_step_post_hooks
    assert "zero_grad" not in vars(opt)
    assert (torch.autograd.backward, vars(torch.amp.GradScaler)["step"]) == originals
    assert type(loader) is torch.utils.data.DataLoader
    assert torch.distributed.all_reduce is torch.distributed.distributed_c10d.all_reduce


def test_signature_and_deepcopy_see_the_real_forward(sink: InMemory) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    tokens = batches(1)[0]
    with instrument.auto(model, sinks=[sink], collectives=False) as handle:
        assert list(inspect.signature(model.forward).parameters) == ["tokens"]
        ema = copy.deepcopy(model)  # an EMA copy made while instrumented
        with torch.no_grad():
            for p in ema.parameters():
                p.mul_(0.5)
        assert not torch.equal(ema(tokens), model(tokens))  # the copy runs its own weights
        report = handle.reporter.flush()
    assert report["forward"].count == 1  # the copy runs untimed (see the next test)
    assert "forward" not in vars(ema)


def test_an_ema_copy_made_under_auto_is_not_counted_as_training_forward(
    sink: InMemory,
) -> None:
    """``AveragedModel`` (EMA/SWA) deep-copies the model; made under ``auto``, the copy ran
    the timed forward under the original's names, so each evaluation of the EMA model
    counted as training's ``forward``: 2x the calls, the line too long."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = batches(4)
    with instrument.auto(model, opt, every=4, sinks=[sink], collectives=False):
        ema = torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        )
        for tokens in data:
            lm_loss(model, tokens).backward()
            opt.step()
            opt.zero_grad()
            ema.update_parameters(model)
            with torch.no_grad():
                ema(tokens)  # an evaluation of the EMA weights each step
    report = sink.reports[0]
    assert report.steps == 4
    assert report["forward"].count == 4
    assert report["forward/embed"].count == 4
    with torch.no_grad():
        assert not torch.equal(ema(data[0]), model(data[0]))  # its own (averaged) weights


def test_remove_takes_the_timing_off_copies_made_meanwhile(tmp_path: Any) -> None:
    """An EMA copy made under ``auto`` kept its timed forward and backward hooks after
    ``remove()``: it went on recording, ``torch.save(copy)`` failed on the hooks, and
    ``auto(copy)`` timed it twice (``forward/forward/...``)."""
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "no inputs require gradients"
        with instrument.auto(model, backward="modules", sinks=[], collectives=False):
            ema = copy.deepcopy(model)
        assert not any("forward" in vars(m) for m in ema.modules())
        assert not any(m._backward_pre_hooks or m._backward_hooks for m in ema.modules())
        torch.save(ema, tmp_path / "ema.pt")
        ema(torch.randn(2, 8)).sum().backward()
        assert instrument.Reporter(every=None, sinks=[]).flush().paths() == ()
        with instrument.auto(ema, sinks=[], collectives=False) as handle:
            ema(torch.randn(2, 8))
            paths = handle.reporter.flush().paths()
    assert not any(p.startswith("forward/forward") for p in paths)


class Halved(nn.Module):
    """A module with its own instance ``forward`` (a bound method, as wrappers put there)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.forward = self.halved  # type: ignore[method-assign]

    def halved(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) / 2


def test_a_copy_gets_back_its_own_instance_forward_bound_to_itself() -> None:
    """``remove()`` took the timed forward off a copy and left it the class's ``forward``,
    not the instance ``forward`` the module had."""
    model = nn.Sequential(Halved())
    with instrument.auto(model, sinks=[], collectives=False):
        twin = copy.deepcopy(model)
    own = vars(twin[0])["forward"]
    assert own.__func__ is Halved.halved
    assert own.__self__ is twin[0]
    with torch.no_grad():
        twin[0].lin.weight.zero_()
        twin[0].lin.bias.fill_(4.0)
    assert torch.equal(twin(torch.ones(1, 4)), torch.full((1, 4), 2.0))


def test_a_data_parallel_replica_runs_its_own_weights() -> None:
    """``nn.DataParallel`` on several devices copies each module's ``__dict__`` into a
    replica (``_replicate_for_data_parallel``): the timed ``forward``, bound to the
    original, ran the original's weights (on another device: a device-mismatch error)."""
    model = nn.Sequential(nn.Linear(4, 4), Halved())
    with instrument.auto(nn.DataParallel(model), sinks=[], collectives=False):
        replicas = [m._replicate_for_data_parallel() for m in model]
        for replica in replicas:
            lin = replica if isinstance(replica, nn.Linear) else replica.lin
            lin.weight = nn.Parameter(torch.zeros(4, 4))
            lin.bias = nn.Parameter(torch.full((4,), 4.0))
        assert torch.equal(replicas[0](torch.ones(1, 4)), torch.full((1, 4), 4.0))
        assert torch.equal(replicas[1](torch.ones(1, 4)), torch.full((1, 4), 2.0))
        assert "forward" in vars(model[0])  # the original stays timed
    assert "_replicate_for_data_parallel" not in vars(nn.Sequential)


def test_auto_twice_on_one_model_raises_until_removed() -> None:
    model = mlp()
    first = instrument.auto(model, collectives=False)
    with pytest.raises(RuntimeError, match="already installed"):
        instrument.auto(model, collectives=False)
    first.remove()
    with instrument.auto(model, collectives=False) as second:
        assert not second.removed
    assert second.removed


def test_own_reporter_is_used_and_not_closed(sink: InMemory) -> None:
    reporter = instrument.Reporter(every=None, sinks=[sink])
    model = mlp()
    with instrument.auto(model, reporter=reporter, collectives=False) as handle:
        assert handle.reporter is reporter
        model(torch.randn(1, 8))
    assert not reporter.closed
    assert reporter.flush()["forward"].count == 1


# -- torch.compile ------------------------------------------------------------------------


def test_compiled_model_is_one_region(sink: InMemory) -> None:
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    assert [t.name for t in module_hooks.plan(compiled)] == ["forward"]
    with instrument.auto(compiled, sinks=[sink], collectives=False) as handle:
        for _ in range(2):
            compiled(torch.randn(2, 8))
        report = handle.reporter.flush()
    assert report.paths() == ("forward",)
    assert report["forward"].count == 2


def test_compiling_after_auto_adds_no_graph_break(sink: InMemory) -> None:
    torch._dynamo.reset()
    model = TinyLM()
    x = batches(1)[0]
    with instrument.auto(model, sinks=[sink], collectives=False) as handle:
        compiled = torch.compile(model, backend="eager", fullgraph=True)  # raises on a break
        out = compiled(x)
        report = handle.reporter.flush()
    assert torch.equal(out, model(x))
    assert "forward/encoder" not in report  # nothing is timed inside the compiled graph


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_module_compiled_in_place_is_timed_from_outside(sink: InMemory) -> None:
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 8), MLP())
    model[1].compile(backend="eager", fullgraph=True)
    with instrument.auto(model, sinks=[sink], collectives=False) as handle:
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))
        report = handle.reporter.flush()
    assert report["forward/1"].count == 2
    assert "forward/1/up" not in report
    assert model[1]._compiled_call_impl is not None
    assert model[1]._compiled_call_impl.__name__ != "call"  # restored


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_inductor_compiled_model_trains_under_auto(sink: InMemory) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, fullgraph=True)  # the default backend, inductor
    x = torch.randn(4, 8)
    with instrument.auto(compiled, opt, every=None, sinks=[sink]) as handle:
        for _ in range(2):
            compiled(x).sum().backward()
            opt.step()
            opt.zero_grad()
        report = handle.reporter.flush()
    assert set(report.paths()) == {"forward", "backward", "optimizer", "zero_grad"}
    assert report["forward"].count == 2
    assert report.steps == 2
    torch.testing.assert_close(compiled(x), model(x))


def test_module_forward_enters_its_region_through_the_c_call_path(sink: InMemory) -> None:
    """With the C accelerator a module's timed forward is the decorator's C wrapper itself
    (one call enters the region, runs forward and exits; no Python frame of ours), and its
    Dynamo-traceable twin calls the same wrapper; without it, a ``with`` block."""
    from instrument.regions import native

    model = nn.Sequential(nn.Linear(2, 2))
    handle = instrument.auto(model, every=None, sinks=[sink], collectives=False)
    forward = model[0].__dict__["forward"].__func__
    hooks = next(h for m, (_, h) in module_hooks._timed.items() if m is model[0])
    if native.timed_types is None:  # pure Python: the with-block
        cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True))
        assert cells["timed_call"].cell_contents.__name__ == "in_region"
        assert not hooks._untraced
    else:
        assert type(forward) in native.timed_types
        twin = next(t for m, _, t in hooks._untraced if m is model[0]).__func__
        cells = dict(zip(twin.__code__.co_freevars, twin.__closure__ or (), strict=True))
        assert cells["timed_call"].cell_contents is forward
    model(torch.zeros(1, 2))
    report = handle.reporter.flush()
    handle.remove()
    assert report["forward/0"].count == 1


def test_optimizer_ticks_the_reporter_directly_after_the_first_steps(sink: InMemory) -> None:
    """The first steps' check that the model's forward was seen hands its tick over once
    decided: the later steps' optimizer step calls the reporter's step counter itself
    (``end_step``: ``step()`` without counts, C where built)."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=None, sinks=[sink], collectives=False)
    hooks = handle._optimizer_hooks
    assert hooks is not None
    for _ in range(2):
        model(torch.zeros(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert hooks.on_step is handle.reporter.end_step
    assert handle.reporter.steps == 2
    handle.remove()


def test_backward_anchor_from_another_thread_is_the_running_backward(sink: InMemory) -> None:
    """Autograd's device threads find the running ``backward`` region's node through
    ``anchor()`` — under a user region too; a backward inside backward stays one region."""
    import threading

    from instrument.hooks import backward as backward_hooks

    model = mlp()
    handle = instrument.auto(model, every=None, sinks=[sink], collectives=False)
    seen: list[str] = []

    def from_a_thread(grad: torch.Tensor) -> torch.Tensor:
        thread = threading.Thread(target=lambda: seen.append(backward_hooks.anchor().path))
        thread.start()
        thread.join()
        with torch.enable_grad():  # a backward inside backward: no region of its own
            torch.autograd.backward(torch.ones(1, requires_grad=True).sum())
        return grad

    for outer in (None, "step"):
        out = model(torch.randn(2, 8))
        out.register_hook(from_a_thread)
        with instrument.timed(outer) if outer else contextlib.nullcontext():
            out.sum().backward()
    report = handle.reporter.flush()
    handle.remove()
    assert seen == ["backward", "step/backward"]
    assert report["backward"].count == 1
    assert report["step/backward"].count == 1
    assert not any(p.endswith("backward/backward") for p in report.paths())


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1),
        lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
        lambda opt: torch.optim.lr_scheduler.SequentialLR(
            opt,
            [torch.optim.lr_scheduler.ConstantLR(opt), torch.optim.lr_scheduler.StepLR(opt, 1)],
            milestones=[2],
        ),
    ],
)
def test_a_timed_scheduler_saves_and_loads_the_state_it_would_without(
    make: Callable[[torch.optim.Optimizer], Any],
) -> None:
    """torch's schedulers save their ``__dict__``: the timed ``step`` must not end up in a
    checkpoint (HF's Trainer crashed saving one: a wrapper cannot be pickled), and loading
    a checkpoint must not undo the timing."""
    import io

    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = make(opt)
    plain = scheduler.state_dict()
    handle = instrument.auto(model, opt, lr_scheduler=scheduler, every=None, sinks=[])
    state = scheduler.state_dict()
    assert state.keys() == plain.keys()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    scheduler.load_state_dict(torch.load(buffer, weights_only=False))
    opt.step()
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)
    else:
        scheduler.step()
    assert handle.reporter.flush()["lr_scheduler"].count == 1
    handle.remove()
    assert "step" not in vars(scheduler)
    assert "state_dict" not in vars(scheduler)
