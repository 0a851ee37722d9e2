"""``auto``'s ``backward`` wrapper: with C, a ``BackwardCall`` doing what the Python wrapper
does when nothing is compiled around it, and handing every other call to it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import instrument
from instrument import registry
from instrument._native import speedups
from instrument.hooks import backward as backward_hooks
from instrument.regions.region import region_for

needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")


class Calls:
    """A callable that records its calls and the region frame open during each."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        from instrument.regions.frames import get_top

        self.calls.append((args, kwargs, get_top().node.path))
        return self.name


def made(compiling: Any = lambda: None, task: int = -1, name: str = "bc") -> tuple[Any, ...]:
    assert speedups is not None
    python, original = Calls("python"), Calls("original")
    region = region_for(name)
    namespace: dict[str, Any] = {}
    call = speedups.BackwardCall(python, region, original, compiling, lambda: task, namespace)
    return call, python, original, region, namespace


@needs_c
def test_the_common_call_times_the_original_and_sets_the_parent() -> None:
    call, python, original, _region, namespace = made(name="bc-common")
    with instrument.timed("outer"):
        assert call(1, x=2) == "original"
    assert original.calls == [((1,), {"x": 2}, "outer/bc-common")]
    assert python.calls == []
    assert namespace["_parent"] is registry.ROOT.children["outer"]
    assert registry.ROOT.children["outer"].children["bc-common"].has_records()


@needs_c
@pytest.mark.parametrize(
    "case", ["compiled around it", "inside the region", "inside autograd", "disabled"]
)
def test_every_other_call_is_the_python_wrappers_or_the_originals(case: str) -> None:
    compiling = (lambda: object()) if case == "compiled around it" else (lambda: None)
    task = 7 if case == "inside autograd" else -1
    call, python, original, region, namespace = made(compiling, task, name=f"bc-{case}")
    if case == "disabled":
        instrument.disable()
    try:
        if case == "inside the region":
            with region:
                assert call(3) == "original"
        else:
            assert call(3) == ("original" if case == "inside autograd" else "python")
    finally:
        instrument.enable()
    assert namespace == {}  # only the timed call sets the parent
    assert len(python.calls) + len(original.calls) == 1


@needs_c
def test_errors_propagate_and_leave_the_stack_clean() -> None:
    assert speedups is not None

    def failing(*args: Any) -> None:
        raise ValueError("in backward")

    def clock_fails() -> None:
        raise RuntimeError("callback")

    region = region_for("bc-error")
    call = speedups.BackwardCall(failing, region, failing, lambda: None, lambda: -1, {})
    with pytest.raises(ValueError, match="in backward"):
        call()
    from instrument.regions.frames import get_top

    assert get_top().node is registry.ROOT
    broken = speedups.BackwardCall(failing, region, failing, clock_fails, lambda: -1, {})
    with pytest.raises(RuntimeError, match="callback"):
        broken()
    odd_task = speedups.BackwardCall(failing, region, failing, lambda: None, lambda: "x", {})
    with pytest.raises(TypeError):
        odd_task()


def test_auto_times_backward_through_it_with_the_wrappers_face() -> None:
    model = torch.nn.Linear(2, 2)
    original = torch.autograd.backward
    handle = instrument.auto(model, every=None, sinks=[], collectives=False)
    try:
        wrapper = torch.autograd.backward
        if speedups is not None:
            assert isinstance(wrapper, speedups.BackwardCall)
        assert wrapper.__name__ == "backward"
        assert inspect.unwrap(wrapper) is original
        assert inspect.signature(wrapper) == inspect.signature(original)
        model(torch.ones(1, 2)).sum().backward()
        assert backward_hooks._parent is registry.ROOT
        report = handle.reporter.flush()
        assert report["backward"].count == 1
    finally:
        handle.remove()
    assert torch.autograd.backward is original
