"""optimizer.step(closure): the closure's regions land where a plain loop puts them, and
``optimizer`` is the update alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import instrument
from instrument.regions.frames import ROOT_FRAME, get_top
from instrument.sinks import InMemory
from instrument.testing import FakeClock

FORWARD, BACKWARD, UPDATE, ZERO = 0.2, 0.4, 0.3, 0.05


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: FakeClock) -> torch.Tensor:
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.clock.advance(BACKWARD)
        return grad, None


class Clocked(nn.Module):
    """A model whose forward takes FORWARD and whose backward takes BACKWARD fake seconds."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(FORWARD)
        return _SlowBackward.apply(self.lin(x).sum(), self.clock)  # type: ignore[no-any-return]


class ClockedSGD(torch.optim.Optimizer):
    """Plain SGD whose update takes UPDATE and whose zero_grad takes ZERO fake seconds; like
    torch's optimizers it calls the closure first."""

    def __init__(self, params: Any, clock: FakeClock) -> None:
        super().__init__(params, {"lr": 0.1})
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


def _setup(clock: FakeClock) -> tuple[Clocked, ClockedSGD, InMemory]:
    torch.manual_seed(0)
    model = Clocked(clock)
    return model, ClockedSGD(model.parameters(), clock), InMemory()


def _plain(model: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor]) -> list[float]:
    losses = []
    for x in xs:
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _with_closure(
    model: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor], keyword: bool
) -> list[float]:
    losses = []
    for x in xs:

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            return loss

        loss = opt.step(closure=closure) if keyword else opt.step(closure)
        losses.append(loss.item())
    return losses


def _inputs(n: int = 4) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(3, 4, generator=gen) for _ in range(n)]


@pytest.mark.parametrize("keyword", [False, True], ids=["positional", "keyword"])
def test_closure_loop_gives_the_plain_loops_tree(clock: FakeClock, keyword: bool) -> None:
    model, opt, plain_sink = _setup(clock)
    with instrument.auto(model, opt, every=4, sinks=[plain_sink], collectives=False):
        plain_losses = _plain(model, opt, _inputs())
    model, opt, closure_sink = _setup(clock)
    with instrument.auto(model, opt, every=4, sinks=[closure_sink], collectives=False):
        closure_losses = _with_closure(model, opt, _inputs(), keyword)

    assert closure_losses == plain_losses
    plain, closed = plain_sink.reports[0], closure_sink.reports[0]
    assert plain.steps == closed.steps == 4
    assert (
        set(closed.paths())
        == set(plain.paths())
        == {
            "forward",
            "forward/lin",
            "backward",
            "optimizer",
            "zero_grad",
        }
    )
    for path in plain.paths():
        assert closed[path].count == plain[path].count == 4, path
        assert closed[path].total == plain[path].total, path
    assert closed["optimizer"].total == pytest.approx(UPDATE)  # per step: the update alone
    assert closed["forward"].total == pytest.approx(FORWARD)
    assert closed["backward"].total == pytest.approx(BACKWARD)
    assert closed["zero_grad"].total == pytest.approx(ZERO)
    assert get_top() is ROOT_FRAME


def test_closure_under_an_outer_region_nests_like_the_plain_loop(clock: FakeClock) -> None:
    model, opt, sink = _setup(clock)
    with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
        for x in _inputs(2):
            with instrument.timed("step"):

                def closure(x: torch.Tensor = x) -> torch.Tensor:
                    loss = model(x)
                    loss.backward()
                    return loss

                opt.step(closure)
        report = handle.reporter.flush()
    assert {"step/forward", "step/backward", "step/optimizer"} <= set(report.paths())
    assert report["step/optimizer"].total == pytest.approx(UPDATE)
    assert report["step"].total == pytest.approx(FORWARD + BACKWARD + UPDATE)


def test_lbfgs_calls_the_closure_many_times_and_optimizer_is_one_update(clock: FakeClock) -> None:
    torch.manual_seed(0)
    model = Clocked(clock)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    sink = InMemory()
    calls = 0
    with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False):
        for x in _inputs(3):

            def closure(x: torch.Tensor = x) -> torch.Tensor:
                nonlocal calls
                calls += 1
                opt.zero_grad()
                loss = model(x)
                loss.backward()
                return loss

            opt.step(closure)
    report = sink.reports[0]
    assert calls > 3  # LBFGS re-evaluates inside one step
    assert not any(p.startswith("optimizer/") for p in report.paths())
    assert report["optimizer"].count == 3
    assert report["optimizer"].total == 0.0  # LBFGS's own math takes no fake time
    assert report["forward"].count == calls
    assert report["backward"].count == calls
    assert report["zero_grad"].count == calls
    assert report["forward"].total == pytest.approx(FORWARD * calls / 3)


def test_a_closure_that_raises_propagates_and_leaves_the_stack_clean(clock: FakeClock) -> None:
    model, opt, sink = _setup(clock)
    with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:

        def broken() -> torch.Tensor:
            clock.advance(1.0)
            raise ValueError("bad batch")

        with pytest.raises(ValueError, match="bad batch"):
            opt.step(broken)
        assert get_top() is ROOT_FRAME
        _with_closure(model, opt, _inputs(2), keyword=False)
        report = handle.reporter.flush()
    # the raising step counts as one optimizer call with no update time; the two real ones
    assert report["optimizer"].count == 3
    assert report["optimizer"].total == pytest.approx(2 * UPDATE / report.steps)
    assert report.steps == 2
    assert set(report.paths()) == {"forward", "forward/lin", "backward", "optimizer", "zero_grad"}
    assert get_top() is ROOT_FRAME


def test_closure_under_the_profiler_closes_every_range(clock: FakeClock) -> None:
    from instrument import observe

    model, opt, sink = _setup(clock)
    with (
        instrument.auto(model, opt, every=2, sinks=[sink], collectives=False),
        torch.profiler.profile(),
    ):
        _with_closure(model, opt, _inputs(2), keyword=True)
    assert not observe.open_ranges
    assert sink.reports[0]["optimizer"].total == pytest.approx(UPDATE)


def test_closure_called_after_the_step_is_passed_through(clock: FakeClock) -> None:
    """A closure the optimizer keeps and calls later is not inside the optimizer region."""
    model, opt, sink = _setup(clock)
    kept: list[Callable[[], Any]] = []

    class Keeper(ClockedSGD):
        def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
            if closure is not None:
                kept.append(closure)
            return None

    opt = Keeper(model.parameters(), clock)
    with instrument.auto(model, opt, every=None, sinks=[sink], collectives=False) as handle:
        opt.step(lambda: model(_inputs(1)[0]))
        kept[0]()
        report = handle.reporter.flush()
    assert report["forward"].count == 1
    assert "optimizer/forward" not in report.paths()
