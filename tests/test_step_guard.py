"""``auto``'s ``optimizer.step`` guard: with C, a ``StepGuard`` doing what the Python guard
does in a plain eager step, and handing every other call to it."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import instrument
from instrument import registry
from instrument._native import speedups
from instrument.regions.frames import get_top
from instrument.regions.region import region_for

needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")


class Call:
    def __init__(self) -> None:
        self.running = self.guarded = False


class Hooks:
    def __init__(self, ticker: object) -> None:
        self._scaled = False
        self._ticker = ticker
        self.ticks: list[str] = []
        self.on_step = lambda: self.ticks.append("on_step")
        self._tick_outside = lambda: self.ticks.append("outside")


class Optimizer:
    """Records each step: its arguments, the region open and the guard's flags then."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, ...]] = []
        self.call = Call()

    def step(self, *args: Any, **kwargs: Any) -> str:
        self.steps.append((args, kwargs, get_top().node.path, self.call.running, self.call.guarded))
        return "stepped"


def made(name: str, own: Any = None, compiling: Any = lambda: None) -> tuple[Any, ...]:
    assert speedups is not None
    opt = Optimizer()
    hooks = Hooks(opt)
    region = region_for(name)
    python_calls: list[tuple[Any, ...]] = []

    def python(self: Any, *args: Any, **kwargs: Any) -> str:
        python_calls.append(args)
        return "python"

    guard = speedups.StepGuard(python, region, opt.call, hooks, own, compiling)
    return opt, hooks, region, types.MethodType(guard, opt), python_calls


@needs_c
def test_a_plain_step_is_timed_flagged_and_ticks() -> None:
    opt, hooks, _region, step, python_calls = made("sg-plain")
    assert step() == "stepped"
    assert opt.steps == [((), {}, "sg-plain", True, True)]
    assert (opt.call.running, opt.call.guarded) == (False, False)
    assert hooks.ticks == ["on_step"]
    assert python_calls == []
    assert registry.ROOT.children["sg-plain"].has_records()


@needs_c
def test_the_instances_own_step_is_called_and_only_the_ticker_ticks() -> None:
    calls: list[str] = []
    opt, hooks, _region, step, _ = made("sg-own", own=lambda: calls.append("own") or "own")
    hooks._ticker = object()
    assert step() == "own"
    assert calls == ["own"]
    assert opt.steps == []
    assert hooks.ticks == []


@needs_c
@pytest.mark.parametrize(
    "case", ["arguments", "compiled around it", "running", "scaled", "open", "disabled"]
)
def test_every_other_step_is_the_python_guards(case: str) -> None:
    compiling = (lambda: object()) if case == "compiled around it" else (lambda: None)
    opt, hooks, region, step, python_calls = made(f"sg-{case}", compiling=compiling)
    opt.call.running = case == "running"
    hooks._scaled = case == "scaled"
    if case == "disabled":
        instrument.disable()
    try:
        if case == "open":
            with region:
                assert step() == "python"
        else:
            assert (step(1) if case == "arguments" else step()) == "python"
    finally:
        instrument.enable()
    assert len(python_calls) == 1
    assert opt.steps == []
    assert hooks.ticks == []


@needs_c
def test_a_step_that_raises_closes_its_region_lowers_the_flags_and_does_not_tick() -> None:
    def failing() -> None:
        raise ValueError("step failed")

    opt, hooks, _region, step, _ = made("sg-raise", own=failing)
    with pytest.raises(ValueError, match="step failed"):
        step()
    assert (opt.call.running, opt.call.guarded) == (False, False)
    assert get_top().node is registry.ROOT
    assert registry.ROOT.children["sg-raise"].has_records()  # recorded, as a region that raised
    assert hooks.ticks == []


@needs_c
def test_a_tick_with_compiled_code_around_it_by_then_runs_outside() -> None:
    state = {"compiled": False}

    def own() -> str:
        state["compiled"] = True  # e.g. the step ran a compiled function's frames
        return "own"

    compiling = lambda: object() if state["compiled"] else None  # noqa: E731
    _opt, hooks, _region, step, _ = made("sg-outside", own=own, compiling=compiling)
    assert step() == "own"
    assert hooks.ticks == ["outside"]


def test_auto_guards_the_step_and_binds_like_a_function() -> None:
    """Under ``auto`` the optimizer's ``step`` is the guard bound to it; an LR scheduler
    made afterwards wraps it (torch's takes ``step.__func__`` and binds it again)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=None, sinks=[], collectives=False)
    try:
        if speedups is not None:
            assert isinstance(opt.step.__func__, speedups.StepGuard)
        assert opt.step.__func__.__get__(opt, type(opt)).__self__ is opt
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            scheduler.step()
        report = handle.reporter.flush()
        assert report["optimizer"].count == 3
        assert report.steps == 3
    finally:
        handle.remove()


@needs_c
def test_the_step_hooks_stand_aside_while_the_guard_runs() -> None:
    assert speedups is not None
    call, seen = Call(), []
    hook = speedups.StandAside(call, lambda *args, **kwargs: seen.append((args, kwargs)) or "ran")
    call.guarded = True
    assert hook(1, x=2) is None
    assert seen == []
    call.guarded = False
    assert hook(1, x=2) == "ran"
    assert seen == [((1,), {"x": 2})]


def test_a_step_past_the_guard_is_timed_by_the_hooks() -> None:
    """The class's ``step`` called directly (past the guard on the instance): the step
    hooks, not standing aside then, time it and end the iteration."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=None, sinks=[], collectives=False)
    try:
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            type(opt).step(opt)
        report = handle.reporter.flush()
        assert report["optimizer"].count == 2
        assert report.steps == 2
    finally:
        handle.remove()


def test_the_call_state_starts_clear_and_holds_what_the_hooks_set() -> None:
    """``_Call`` (C ``StepCall`` where built, the Python class otherwise): the flags and the
    nesting count the Python hooks set, read back as set."""
    from instrument.hooks.optim import _Call, _PyCall

    for cls in {_Call, _PyCall}:
        call = cls()
        assert (call.running, call.guarded, call.entered, call.nested) == (False, False, False, 0)
        call.running = call.guarded = call.entered = True
        call.nested += 2
        assert (call.running, call.guarded, call.entered, call.nested) == (True, True, True, 2)
        with pytest.raises(AttributeError):
            call.other = 1
