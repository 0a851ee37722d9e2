"""auto()'s module forwards are the C timed call while nothing is compiled, and become
their Python twins — which Dynamo traces without a graph break — at the first compilation,
also after ``torch._dynamo.reset()`` and for installs that come later."""

from __future__ import annotations

import copy
import inspect
import types

import pytest
import torch
from models import TinyLM, lm_loss
from torch import nn

import instrument
from instrument.hooks import untraced
from instrument.regions import native

pytestmark = pytest.mark.skipif(native.timed_types is None, reason="needs the C extension")


def forwards(model: nn.Module) -> list[object]:
    return [vars(m)["forward"].__func__ for m in model.modules() if "forward" in vars(m)]


def is_c(func: object) -> bool:
    return type(func) is not types.FunctionType  # a wrapt proxy passes isinstance


def batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))


def test_forwards_are_c_until_something_compiles() -> None:
    model = TinyLM()
    with instrument.auto(model, every=None, sinks=[], collectives=False) as handle:
        assert forwards(model)
        assert all(is_c(f) for f in forwards(model))
        model(batch())

        @torch.compile(backend="eager", fullgraph=True)  # a C forward here would break it
        def logits(x: torch.Tensor) -> torch.Tensor:
            return model(x)

        logits(batch())
        assert not any(is_c(f) for f in forwards(model))  # the twins, for good
        model(batch(1))  # eager again: timed by the twin
        report = handle.reporter.flush()
    assert report["forward"].count == 2  # the compiled call is not a module call we see
    assert report["forward/encoder/layers.0"].count == 2
    assert not any("forward" in vars(m) for m in model.modules())
    other = TinyLM()
    with instrument.auto(other, every=None, sinks=[], collectives=False):
        assert not any(is_c(f) for f in forwards(other))  # installed after a compilation


def test_dynamo_reset_inside_auto_keeps_the_switch() -> None:
    model = TinyLM()
    with instrument.auto(model, every=None, sinks=[], collectives=False):
        torch._dynamo.reset()  # clears Dynamo's callbacks, ours included: registered again
        assert all(is_c(f) for f in forwards(model))

        # a compiled function, not a module: only the compile-start callback can switch
        @torch.compile(backend="eager", fullgraph=True)
        def logits(x: torch.Tensor) -> torch.Tensor:
            return model(x)

        logits(batch())
        assert not any(is_c(f) for f in forwards(model))
        explained = torch._dynamo.explain(model)(batch())
        assert explained.graph_break_count == 0
        assert not any(is_c(f) for f in forwards(model))


def test_the_callback_and_the_reset_patch_go_with_the_last_handle() -> None:
    from torch._dynamo.callback import callback_handler

    reset = torch._dynamo.reset
    first = instrument.auto(TinyLM(), every=None, sinks=[], collectives=False)
    second = instrument.auto(TinyLM(), every=None, sinks=[], collectives=False)
    assert untraced._on_compile_start in callback_handler.start_callbacks
    first.remove()
    assert untraced._on_compile_start in callback_handler.start_callbacks
    second.remove()
    assert untraced._on_compile_start not in callback_handler.start_callbacks
    assert torch._dynamo.reset is getattr(reset, "__wrapped__", reset)


def test_c_forward_keeps_signature_deepcopy_and_exceptions() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    tokens = batch()
    with instrument.auto(model, every=None, sinks=[], collectives=False) as handle:
        assert is_c(vars(model)["forward"].__func__)
        assert list(inspect.signature(model.forward).parameters) == ["tokens"]
        ema = copy.deepcopy(model)
        assert "forward" not in vars(ema)  # a copy runs untimed
        with torch.no_grad():
            for p in ema.parameters():
                p.mul_(0.5)
        assert not torch.equal(ema(tokens), model(tokens))
        with pytest.raises(IndexError):
            model(torch.full((1, 4), 10_000))  # out of the vocabulary: raised unchanged
        lm_loss(model, tokens)
        report = handle.reporter.flush()
    assert report["forward"].count == 3  # the model, the failed call, the loss
    assert report["forward/embed"].count == 3
