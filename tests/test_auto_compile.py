"""Compiling after auto(): the compiled call keeps its region, no graph break is added, and
a model hidden inside a compiled function is warned about, never silently dropped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from models import TinyLM, lm_loss
from torch import nn
from torch._dynamo.utils import counters

import instrument
from instrument.sinks import InMemory

VOCAB = 64
#: An optimizer step inside a compiled function under ``auto`` crashes torch 2.6's Dynamo
#: (a segfault in ``_maybe_set_eval_frame``): docs/compatibility.md.
CRASHES_TORCH_2_6 = pytest.mark.skipif(
    torch.__version__.startswith("2.6."), reason="crashes torch 2.6's Dynamo (segfault)"
)


def batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


def graphs(model: nn.Module, x: torch.Tensor) -> tuple[int, int, list[int]]:
    """Dynamo's graphs, graph breaks and ops per graph for ``model(x)``
    (``torch._dynamo.explain``; the raw ``counters["graph_break"]`` counts a break once per
    Python frame it passes through, so it is not a count of graphs split)."""
    torch._dynamo.reset()
    found = torch._dynamo.explain(model)(x)
    return found.graph_count, found.graph_break_count, [len(g.graph.nodes) for g in found.graphs]


class Breaking(nn.Module):
    """A model with one deliberate graph break (a print), to count breaks against."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        torch._dynamo.graph_break()
        return self.b(y)


@pytest.mark.parametrize("make", [TinyLM, Breaking], ids=["tinylm", "one-break"])
def test_instrumenting_adds_no_graph_break(make: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = make()
    x = batch() if make is TinyLM else torch.randn(2, 8)
    plain = graphs(model, x)
    with instrument.auto(model, sinks=[], collectives=False):
        timed = graphs(model, x)
    assert timed == plain
    assert plain[1] == (0 if make is TinyLM else 1)


@pytest.mark.parametrize("own_call", [True, False])
def test_torch_compile_after_auto_times_the_compiled_call_as_forward(
    own_call: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    if not own_call and "__call__" in vars(OptimizedModule):  # as torch 2.6: nn.Module's
        monkeypatch.delattr(OptimizedModule, "__call__")
    torch._dynamo.reset()
    call = vars(OptimizedModule).get("__call__")
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemory()
    with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False):
        compiled = torch.compile(model, backend="eager")
        for i in range(3):
            lm_loss(compiled, batch(i)).backward()
            opt.step()
            opt.zero_grad()
    report = sink.reports[0]
    assert report["forward"].count == 3
    assert not any(p.startswith("forward/") for p in report.paths())  # inside the graph
    assert report["forward"].total > 0
    assert vars(type(compiled)).get("__call__") is call  # put back as it was


def test_compiled_before_auto_on_the_inner_model_is_timed_too() -> None:
    """HF/Accelerate compile the model, then hand the callback the inner model."""
    torch._dynamo.reset()
    model = TinyLM()
    compiled = torch.compile(model, backend="eager")
    sink = InMemory()
    with instrument.auto(model, every=None, sinks=[sink], collectives=False) as handle:
        compiled(batch())
        report = handle.reporter.flush()
    assert report.paths() == ("forward",)


def test_model_compile_in_place_after_auto_is_timed_and_restored() -> None:
    torch._dynamo.reset()
    model = TinyLM()
    sink = InMemory()
    with instrument.auto(model, every=None, sinks=[sink], collectives=False) as handle:
        model.compile(backend="eager")
        model(batch())
        model(batch(1))
        report = handle.reporter.flush()
    assert report.paths() == ("forward",)
    assert report["forward"].count == 2
    assert getattr(model._compiled_call_impl, "__name__", "") != "call"  # ours is gone


def test_block_compiled_in_place_after_auto_keeps_its_path() -> None:
    torch._dynamo.reset()
    model = TinyLM()
    sink = InMemory()
    with instrument.auto(model, every=None, sinks=[sink], collectives=False) as handle:
        model.encoder.layers[0].compile(backend="eager")
        model(batch())
        report = handle.reporter.flush()
    paths = set(report.paths())
    assert "forward/encoder/layers.0" in paths
    assert not any(p.startswith("forward/encoder/layers.0/") for p in paths)
    assert "forward/encoder/layers.1/self_attn" in paths  # not compiled: still detailed


def test_model_inside_a_compiled_function_is_warned_about() -> None:
    torch._dynamo.reset()
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="eager")
    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return lm_loss(model, x)

    def train() -> None:
        for i in range(3):
            loss_of(batch(i)).backward()
            opt.step()
            opt.zero_grad()

    with (
        instrument.auto(model, opt, every=None, sinks=[], collectives=False),
        pytest.warns(RuntimeWarning, match=r"forward was not timed.*torch.compile\(model\)"),
    ):
        train()


def test_no_warning_when_forward_is_timed() -> None:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with instrument.auto(model, opt, every=None, sinks=[], collectives=False):
            for i in range(3):
                lm_loss(model, batch(i)).backward()
                opt.step()
                opt.zero_grad()


def test_no_warning_when_the_first_steps_ran_disabled() -> None:
    """Steps taken under ``instrument.disable()`` record nothing: they do not count towards
    the two steps after which an unseen forward is blamed on torch.compile."""
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with instrument.auto(model, opt, every=None, sinks=[], collectives=False) as handle:
            instrument.disable()
            try:
                for i in range(5):
                    if i == 3:
                        instrument.enable()
                    lm_loss(model, batch(i)).backward()
                    opt.step()
                    opt.zero_grad()
            finally:
                instrument.enable()
            report = handle.reporter.flush()
    assert report["forward"].count == 2


# -- a compiled optimizer step, a compiled train_step --------------------------------------


@CRASHES_TORCH_2_6
def test_a_compiled_optimizer_step_is_timed_and_ends_the_iteration() -> None:
    """PyTorch's recipe for compiling the optimizer (a compiled function calling
    ``opt.step()``): Dynamo traced the step hooks, so nothing was reported at all."""
    torch._dynamo.reset()
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sink = InMemory()

    @torch.compile(backend="eager")
    def step() -> None:
        opt.step()

    counters.clear()
    with instrument.auto(model, opt, every=2, sinks=[sink], collectives=False):
        for i in range(4):
            lm_loss(model, batch(i)).backward()
            step()
            opt.zero_grad()
    # the hooks break the graph once, where they run; making their eager versions while
    # tracing (or between graphs) was a second break, a compile attempt of our helper
    assert not [why for why in counters["graph_break"] if "`disable`" in why]
    assert [r.steps for r in sink.reports] == [2, 2]
    for report in sink.reports:
        assert report["optimizer"].count == 2
        assert report["forward"].count == 2
        assert not any(p.startswith("optimizer/") for p in report.paths())
    assert sink.reports[1]["optimizer"].total > 0


@CRASHES_TORCH_2_6
@pytest.mark.parametrize(
    "inlined",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["loss.backward", "autograd.backward"],
)
def test_a_compiled_train_step_times_backward_and_the_optimizer(inlined: bool) -> None:
    """``loss.backward()`` inside a compiled function runs between its graphs: Dynamo
    compiled the backward wrapper itself (and warned it cannot trace instrument's C call),
    so ``backward`` went missing. ``torch.autograd.backward(loss)`` there (and, on torch
    2.11, ``loss.backward()``) is inlined by Dynamo instead: the wrapper must break the
    graph itself, before its C call."""
    torch._dynamo.reset()
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemory()

    @torch.compile(backend="eager")
    def train_step(x: torch.Tensor) -> None:
        loss = lm_loss(model, x)
        if inlined:
            torch.autograd.backward(loss)
        else:
            loss.backward()
        opt.step()
        opt.zero_grad()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with instrument.auto(model, opt, every=3, sinks=[sink], collectives=False):
            for i in range(6):
                train_step(batch(i))
    assert not [w for w in seen if "does not know how to trace" in str(w.message)]
    assert any("forward was not timed" in str(w.message) for w in seen)  # inside the graph
    report = sink.reports[-1]
    assert report.steps == 3
    assert report["backward"].count == 3
    assert report["optimizer"].count == 3
    assert report["zero_grad"].count == 3
    assert report["backward"].total > 0


@pytest.mark.slow  # compiles in a subprocess
def test_first_compilation_after_auto_leaves_no_warning_at_remove(tmp_path: Path) -> None:
    """Dynamo wraps ``nn.Module.__setstate__`` at the first compilation of a process; when
    that came after auto(), remove() warned that someone replaced instrument's patch."""
    script = tmp_path / "first_compile.py"
    script.write_text(
        textwrap.dedent(
            """
            import warnings
            import torch, instrument
            from torch import nn
            # torch's own notice on Python 3.13.0 is no warning of instrument's
            warnings.filterwarnings("ignore", "Guards may run slower", RuntimeWarning)
            model = nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with instrument.auto(model, opt, every=None, sinks=[], collectives=False):
                compiled = torch.compile(model, backend="eager")
                compiled(torch.randn(2, 4)).sum().backward()
                opt.step()
            import copy
            copy.deepcopy(model)  # the patch left inside Dynamo's does nothing
            assert "forward" not in vars(model)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_per_module_backward_hooks_come_off_a_module_compiled_after_auto() -> None:
    """``backward="modules"`` puts full backward hooks on every module; Dynamo breaks the
    graph at each ("Module-level backwards hooks require compiled autograd") and, at its
    recompile limit, ran the model eagerly: compiling after auto lost the compilation."""
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemory()
    with instrument.auto(
        model, opt, every=None, sinks=[sink], collectives=False, backward="modules"
    ) as handle:
        compiled = torch.compile(model, backend="eager")
        with pytest.warns(RuntimeWarning, match=r"runs compiled, so its modules have no"):
            lm_loss(compiled, batch(0)).backward()
        opt.step()
        graph_count, breaks, _ = graphs(compiled, batch(1))
        lm_loss(compiled, batch(2)).backward()
        opt.step()
        report = handle.reporter.flush()
    assert (graph_count, breaks) == (1, 0)
    assert report["backward"].count == 2
    assert not any(p.startswith("backward/") for p in report.paths())


def test_a_forward_replaced_by_its_compiled_self_is_named_in_the_warning() -> None:
    """``model.forward = torch.compile(model.forward)``: before auto it is timed (auto wraps
    the compiled function); after auto Dynamo may trace through the timed forward (here,
    once such a forward was compiled before), so nothing records — and the warning names
    that replacement, not a compiled train_step."""
    for replaced_after in (False, True):
        torch._dynamo.reset()
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if not replaced_after:
            model.forward = torch.compile(model.forward, backend="eager")  # type: ignore[method-assign]
        with (
            instrument.auto(model, opt, every=None, sinks=[], collectives=False) as handle,
            warnings.catch_warnings(record=True) as seen,
        ):
            warnings.simplefilter("always")
            if replaced_after:
                model.forward = torch.compile(model.forward, backend="eager")  # type: ignore[method-assign]
            for i in range(3):
                lm_loss(model, batch(i)).backward()
                opt.step()
                opt.zero_grad()
            timed = "forward" in handle.reporter.flush()
        named = [w for w in seen if "replaced by torch.compile(model.forward)" in str(w.message)]
        if not replaced_after:
            assert timed
        assert bool(named) is not timed  # whenever it records nothing, it says why
        if named:
            assert named[0].filename == __file__  # at the loop's opt.step()
