"""What ``instrument.auto`` adds: per module call, and to whole training steps.

- ``module-call``: one ``nn.Identity`` call (grad off) with no hooks (the floor), with a
  hand-written pair of forward pre/post hooks that read ``perf_counter_ns`` and append to a
  list (the baseline), with ``auto``'s hooks, and with Lightning's record-function hooks
  (``RegisterRecordFunction``, what its PyTorchProfiler adds per module); all interleaved
  in the same rounds (``paired``).
- ``mlp-step`` and ``transformer-step``: a whole training step (forward, loss, backward,
  optimizer step, zero_grad) uninstrumented (the baseline), under ``auto`` (reporting every
  50 steps to no sink), under a running ``torch.profiler``, and under Lightning's
  record-function hooks inside a running profiler (Lightning's PyTorchProfiler).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
import torch
from models import TinyLM, mlp_step
from paired import Contender
from torch import nn

import instrument
from instrument.diagnosis import Diagnosis

if TYPE_CHECKING:
    from conftest import Measure, Paired

CALLS = 1000  # module calls per round
STEPS = 10  # training steps per round


def lightning_hooks(model: nn.Module) -> AbstractContextManager[Any]:
    profilers = pytest.importorskip("pytorch_lightning.profilers.pytorch")
    return profilers.RegisterRecordFunction(model)  # type: ignore[no-any-return]


def cpu_profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


# -- one module call ----------------------------------------------------------------------


def module_calls(module: nn.Module) -> Callable[[], None]:
    x = torch.zeros(1)

    def run() -> None:
        with torch.no_grad():
            for _ in range(CALLS):
                module(x)

    return run


def _hand_hooked() -> tuple[nn.Module, list[int]]:
    """An ``nn.Identity`` with the baseline's hooks: two clock reads and an append into a
    list made once."""
    module = nn.Identity()
    starts: dict[nn.Module, int] = {}
    times: list[int] = []

    def pre(mod: nn.Module, args: Any) -> None:
        starts[mod] = perf_counter_ns()

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        times.append(perf_counter_ns() - starts[mod])

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)
    return module, times


@pytest.mark.benchmark(group="module-call")
def test_module_call(paired: Paired) -> None:
    """One module call: no hooks, hand-written hooks, ``auto``, Lightning's hooks — each on
    its own ``nn.Identity``, interleaved in the same rounds."""
    hand, times = _hand_hooked()
    auto_module = nn.Identity()
    instrument.configure(clock="cpu")
    handle = instrument.auto(auto_module, every=None, sinks=[], collectives=False)
    lightning = nn.Sequential(nn.Identity())
    with lightning_hooks(lightning) if _has_lightning() else nullcontext():
        contenders = [
            Contender(
                "hand-written pre/post hooks", module_calls(hand), times.clear, CALLS, baseline=True
            ),
            Contender("no hooks (floor)", module_calls(nn.Identity()), None, CALLS, floor=True),
            Contender("instrument.auto", module_calls(auto_module), handle.reporter.flush, CALLS),
        ]
        if _has_lightning():
            contenders.append(
                Contender(
                    "Lightning RegisterRecordFunction (no profiler running)",
                    module_calls(lightning[0]),
                    None,
                    CALLS,
                    peer=True,
                )
            )
        paired(contenders)
    assert len(times) == CALLS
    handle.remove()


def _has_lightning() -> bool:
    try:
        import pytorch_lightning.profilers.pytorch  # noqa: F401
    except ImportError:
        return False
    return True


# -- whole steps --------------------------------------------------------------------------


Setup = tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]


def mlp_setup(optimizer: type[torch.optim.Optimizer] = torch.optim.SGD) -> Setup:
    """A tiny MLP step: 4 module calls, backward, the update, zero_grad."""
    return mlp_step((32, 64, 10), optimizer)


def lm_setup() -> Setup:
    torch.manual_seed(0)
    model = TinyLM(vocab=256, d=64, layers=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (8, 32))

    def step() -> None:
        logits = model(tokens)
        nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step


SETUPS = {"mlp": mlp_setup, "transformer": lm_setup}


def steps(
    step: Callable[[], None], around: Callable[[], AbstractContextManager[Any]]
) -> Callable[[], None]:
    def run() -> None:
        with around():
            for _ in range(STEPS):
                step()

    return run


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
class TestTrainingStep:
    def _measure(
        self, measure: Measure, kind: str, label: str, fn: Callable[[], None], **kw: Any
    ) -> None:
        rounds = 200 if kind == "mlp" else 40
        measure(fn, label=label, inner=STEPS, rounds=rounds, warmup_rounds=5, **kw)

    def test_uninstrumented(self, benchmark: Any, measure: Measure, kind: str) -> None:
        benchmark.group = f"{kind}-step"
        _model, _opt, step = SETUPS[kind]()
        self._measure(measure, kind, "uninstrumented", steps(step, nullcontext), baseline=True)

    def test_instrument_auto(self, benchmark: Any, measure: Measure, kind: str) -> None:
        benchmark.group = f"{kind}-step"
        model, opt, step = SETUPS[kind]()
        instrument.configure(clock="cpu")
        handle = instrument.auto(model, opt, every=50, sinks=[])
        self._measure(measure, kind, "instrument.auto (every=50)", steps(step, nullcontext))
        handle.remove()

    def test_torch_profiler(self, benchmark: Any, measure: Measure, kind: str) -> None:
        benchmark.group = f"{kind}-step"
        _model, _opt, step = SETUPS[kind]()
        self._measure(measure, kind, "torch.profiler (CPU activity)", steps(step, cpu_profiler))

    def test_lightning_pytorch_profiler(self, benchmark: Any, measure: Measure, kind: str) -> None:
        benchmark.group = f"{kind}-step"
        model, _opt, step = SETUPS[kind]()
        with lightning_hooks(model):
            self._measure(
                measure,
                kind,
                "Lightning record-function hooks + torch.profiler",
                steps(step, cpu_profiler),
            )


# -- paired: instrumented and uninstrumented steps alternate in the same rounds -------------


@pytest.mark.benchmark(group="paired-step")
@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_paired_step_ratio(benchmark: Any, kind: str) -> None:
    """Whole-step ratios are within this machine's noise when measured as separate
    benchmarks (the later one runs on a warmer, more fragmented heap). Here each round
    times ``STEPS`` uninstrumented and ``STEPS`` instrumented steps back to back, in
    alternating order, and the ratio is taken per round: its median is the figure."""
    model, opt, step = SETUPS[kind]()
    instrument.configure(clock="cpu")
    rounds = 60 if kind == "mlp" else 40

    def timed_steps() -> int:
        start = perf_counter_ns()
        for _ in range(STEPS):
            step()
        return perf_counter_ns() - start

    def instrumented() -> int:
        handle = instrument.auto(model, opt, every=50, sinks=[])
        try:
            return timed_steps()
        finally:
            handle.remove()

    for _ in range(3):  # warm both paths
        timed_steps()
        instrumented()
    base: list[int] = []
    inst: list[int] = []
    for r in range(rounds):
        if r % 2:
            inst.append(instrumented())
            base.append(timed_steps())
        else:
            base.append(timed_steps())
            inst.append(instrumented())
    ratios = sorted(i / b for i, b in zip(inst, base, strict=True))
    median = ratios[len(ratios) // 2]
    benchmark.extra_info.update(
        label=f"{kind} step: instrument.auto / uninstrumented, paired",
        inner=STEPS,
        paired_median=median,
        paired_min_ratio=min(inst) / min(base),
        base_min_ns=min(base) / STEPS,
        note=f"median of {rounds} per-round ratios",
    )
    benchmark.pedantic(step, rounds=1, iterations=1)  # keeps it a benchmark (skipped by default)


# -- paired: auto's cost per step against hand-written hooks ------------------------------

#: Steps of each kind per round of the auto-step group: one report per round (``every=50``).
REPORT_EVERY = 50
#: Steps after a report (or after another row's steps) that still pay for what it evicted
#: from the CPU's caches: on the 2-core AMD VM the first step after an ``auto`` report costs
#: +60 to +100 µs over 0.2 ms, the tenth about +2 µs. These steps are charged to the report
#: (:func:`test_auto_report_on_the_step_model`), not to the steps between reports.
AFTER_REPORT = 10
#: Rounds of the auto-step group (about 0.3 ms a step: 15 s in all); fewer leave the median
#: of per-round differences moving by ±0.1 between runs.
ROUNDS, WARMUP_ROUNDS = 180, 2


def mlp_adamw_setup() -> Setup:
    """The MLP step with AdamW."""
    return mlp_setup(torch.optim.AdamW)


def hand_hooks(model: nn.Module, opt: torch.optim.Optimizer) -> list[int]:
    """The baseline: forward pre/post hooks on every module and step pre/post hooks on the
    optimizer, each pair reading ``perf_counter_ns`` twice and appending to a list made once."""
    starts: dict[object, int] = {}
    times: list[int] = []

    def start(owner: object, *args: Any) -> None:
        starts[owner] = perf_counter_ns()

    def stop(owner: object, *args: Any) -> None:
        times.append(perf_counter_ns() - starts[owner])

    for module in model.modules():
        module.register_forward_pre_hook(start)
        module.register_forward_hook(stop)
    opt.register_step_pre_hook(start)
    opt.register_step_post_hook(stop)
    return times


class LeanAuto:
    """The leanest hand-written equivalent of what ``auto`` does in this step, a reference
    row: a Python wrapper on every module's instance ``forward``, on
    ``torch.autograd.backward`` and on the optimizer's ``step`` and ``zero_grad``, each
    reading ``perf_counter_ns`` twice and appending ``(name, ns)`` to a list made once; every
    ``REPORT_EVERY`` optimizer steps a report to no sink: the list summed into count and total
    per name, then cleared. No nesting, no statistics, memory or throughput."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        self.times: list[tuple[str, int]] = []
        self.totals: dict[str, tuple[int, int]] = {}
        self.steps = steps  # optimizer steps so far (its reports fall on multiples of 50)
        self.reports = 0
        for name, module in model.named_modules():
            module.forward = self._timed(name or "model", module.forward)  # type: ignore[method-assign]
        torch.autograd.backward = self._timed("backward", torch.autograd.backward)
        step = opt.step
        opt.zero_grad = self._timed("zero_grad", opt.zero_grad)  # type: ignore[method-assign]
        append = self.times.append

        def timed_step(*args: Any, **kwargs: Any) -> Any:  # _timed's body + the tick, one frame
            start = perf_counter_ns()
            result = step(*args, **kwargs)
            append(("optimizer", perf_counter_ns() - start))
            self.steps += 1
            if self.steps % REPORT_EVERY == 0:
                self.report()
            return result

        opt.step = timed_step  # type: ignore[method-assign]

    def _timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        append = self.times.append

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = perf_counter_ns()
            result = call(*args, **kwargs)
            append((name, perf_counter_ns() - start))
            return result

        return timed

    def report(self) -> None:
        totals = self.totals
        for name, ns in self.times:
            count, total = totals.get(name, (0, 0))
            totals[name] = (count + 1, total + ns)
        self.times.clear()
        self.reports += 1


class Instrumentation:
    """What a row of the auto-step group changes on the one model and optimizer, captured
    once and put back before each of the row's steps: every module's instance ``forward``
    and forward-hook dicts, the optimizer's step-hook dicts and instance ``zero_grad`` and
    ``step``, and ``torch.autograd.backward``. Nothing else that ``auto`` patches runs in
    this step."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self._opt = opt
        self._modules = [
            (m, vars(m).get("forward"), m._forward_pre_hooks, m._forward_hooks)
            for m in model.modules()
        ]
        self._optimizer = (
            opt._optimizer_step_pre_hooks,
            opt._optimizer_step_post_hooks,
            vars(opt).get("zero_grad"),
            vars(opt).get("step"),  # auto's guard (an exception inside step closes it)
        )
        self._backward = torch.autograd.backward

    def apply(self) -> None:
        for module, forward, pre, post in self._modules:
            _set_own(module, "forward", forward)
            module._forward_pre_hooks, module._forward_hooks = pre, post
        pre_hooks, post_hooks, zero_grad, step = self._optimizer
        self._opt._optimizer_step_pre_hooks = pre_hooks
        self._opt._optimizer_step_post_hooks = post_hooks
        _set_own(self._opt, "zero_grad", zero_grad)
        _set_own(self._opt, "step", step)
        torch.autograd.backward = self._backward


def _set_own(owner: object, attr: str, value: object) -> None:
    if value is None:
        vars(owner).pop(attr, None)
    else:
        vars(owner)[attr] = value


def _fresh_hook_dicts(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """New empty hook dicts, so that the next row's hooks do not land in the last one's."""
    for module in model.modules():
        module._forward_pre_hooks, module._forward_hooks = OrderedDict(), OrderedDict()
    opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks = OrderedDict(), OrderedDict()


@pytest.mark.benchmark(group="auto-step")
def test_auto_step_against_hand_written_hooks(paired: Paired) -> None:
    """What ``auto`` adds to a tiny MLP step between its reports (one to no sink every 50
    steps, diagnosed) against what hand-written module and optimizer hooks add, both above
    the uninstrumented step, in steady state: each round gives each row one turn of 50 steps
    in a row, the first ``AFTER_REPORT`` of them untimed (right after another row's steps, or
    a report, a step pays for what they evicted from the caches), timed in this thread's CPU
    time (a round is preempted many times on a busy machine). ``auto``'s report, and the
    lean row's, fall on the turn's first step: the 40 timed steps are those between
    reports, and the report's cost with its effect on the steps after it is
    :func:`test_auto_report_on_the_step_model`'s.
    All three rows train ONE model and optimizer — two identical models differ by 2-7 µs a
    step, as much as the costs compared — with ``auto`` installed once and each row's hooks
    put in place before each of its steps (:class:`Instrumentation`). One intra-op thread:
    these ops are far too small to share, and spinning workers on a busy 2-core machine only
    add noise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _auto_step_rounds(paired)
    finally:
        torch.set_num_threads(threads)


class Rows(NamedTuple):
    """The auto-step group's one model: its step, each row's instrumentation, the hand-written
    hooks' list of times, the ``auto`` handle (installed; its state in place) and the lean
    equivalent of ``auto`` (its wrappers captured in ``lean``)."""

    step: Callable[[], None]
    uninstrumented: Instrumentation
    hand: Instrumentation
    auto: Instrumentation
    times: list[int]
    handle: instrument.AutoHandle
    lean: Instrumentation
    lean_auto: LeanAuto


#: ``auto``'s steps since its last report when each of its turns starts: the report falls on
#: the turn's first step, untimed, so its 40 timed steps run between reports (a report's
#: cost, with its effect on the steps after it, is :func:`test_auto_report_on_the_step_model`'s).
REPORT_PHASE = REPORT_EVERY - 1


def one_model_rows() -> Rows:
    """The tiny MLP with AdamW, and the rows' instrumentation captured on it."""
    model, opt, step = mlp_adamw_setup()
    uninstrumented = Instrumentation(model, opt)
    lean_auto = LeanAuto(model, opt, steps=REPORT_PHASE)
    lean = Instrumentation(model, opt)
    uninstrumented.apply()
    _fresh_hook_dicts(model, opt)
    times = hand_hooks(model, opt)
    hand = Instrumentation(model, opt)
    _fresh_hook_dicts(model, opt)
    instrument.configure(clock="cpu")
    handle = instrument.auto(model, opt, every=REPORT_EVERY, sinks=[])
    auto = Instrumentation(model, opt)
    return Rows(step, uninstrumented, hand, auto, times, handle, lean, lean_auto)


def reach_report_phase(step: Callable[[], None], reporter: instrument.Reporter) -> None:
    """Step (``auto`` in place) until ``auto``'s reporter is ``REPORT_PHASE`` steps past its
    last report: at most one interval, or ``AssertionError`` (its steps do not tick it)."""
    for _ in range(REPORT_EVERY):
        if reporter.steps == REPORT_PHASE:
            break
        step()
    assert reporter.steps == REPORT_PHASE, "auto's steps do not tick its reporter"


def _auto_step_rounds(paired: Paired) -> None:
    step, uninstrumented, hand, timed, times, handle, lean, lean_auto = one_model_rows()
    model = handle.model
    assert model is not None
    timed.apply()
    reach_report_phase(step, handle.reporter)
    try:
        paired(
            [
                Contender(
                    "hand-written module and optimizer hooks",
                    step,
                    hand.apply,
                    1,
                    baseline=True,
                    above="uninstrumented",
                ),
                Contender(
                    "instrument.auto between reports (every=50)",
                    step,
                    timed.apply,
                    1,
                    above="uninstrumented",
                ),
                Contender(
                    "lean hand-written equivalent of auto (reference)",
                    step,
                    lean.apply,
                    1,
                    above="uninstrumented",
                    note="what auto times, each a Python wrapper with two clock reads; every 50 "
                    "steps the list summed per name (LeanAuto)",
                ),
                Contender("uninstrumented", step, uninstrumented.apply, 1),
            ],
            rounds=ROUNDS,
            warmup_rounds=WARMUP_ROUNDS,
            clock=thread_time_ns,
            block=REPORT_EVERY - AFTER_REPORT,
            settle=AFTER_REPORT,
        )
        phase = handle.reporter.steps  # (removing the handle flushes what is left)
    finally:
        timed.apply()
        handle.remove()
    assert phase == REPORT_PHASE  # 50 steps a turn: one report at every turn's first step
    rounds = ROUNDS + WARMUP_ROUNDS
    assert len(times) == REPORT_EVERY * rounds * 5  # 4 module calls and one optimizer step each
    assert lean_auto.reports == rounds  # the lean row reported once a turn too
    assert lean_auto.totals["optimizer"][0] == REPORT_EVERY * rounds - REPORT_PHASE
    assert not any("forward" in vars(m) for m in model.modules())  # auto took its own off


#: Top-level paths recorded in each interval of the report rows' second block.
EXTRA_PATHS = 200
#: Reports of each kind (diagnosed or not; the model's own paths, or with the extra ones).
REPORT_ROUNDS = 150


@pytest.mark.benchmark(group="auto-step")
def test_auto_report_on_the_step_model(benchmark: Any) -> None:
    """What one of ``auto``'s reports costs on the auto-step group's model (the tiny MLP with
    AdamW, 50 steps an interval; memory on, no sink), in this thread's CPU time: the report
    itself, where it runs (in the training loop, its code cold), and with what it costs the
    steps after it: each interval times its ``AFTER_REPORT`` last steps (the steadiest,
    furthest from the last report), then the report and as many steps after it; the
    difference is the report's cost with its effect on those steps. Intervals alternate
    between a report alone and a report diagnosed (:meth:`Diagnosis.add
    <instrument.diagnosis.Diagnosis.add>` on it, as ``auto``'s reporter does by default), so
    the two are measured in the same rounds and their difference is the diagnosis's part.
    First ``REPORT_ROUNDS`` intervals of each kind with the model's own paths only, then as
    many that also record ``EXTRA_PATHS`` top-level paths: the two give a fixed cost per
    report plus a cost per path; ``value_ns`` is the fixed part of the report itself, the
    figure the target is checked against (the others are ``more_rows``). The blocks run one
    after the other: a path recorded in one report is walked by the next ones too (until it
    is released, idle), so alternating them would charge the fixed part with 200 idle
    paths."""
    model, opt, step = mlp_adamw_setup()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    instrument.configure(clock="cpu")
    handle = instrument.auto(model, opt, every=None, sinks=[], diagnose=False)
    flush = handle.reporter.flush
    diagnosis = Diagnosis()
    names = [f"extra.{i}" for i in range(EXTRA_PATHS)]
    kinds = [(d, e) for d in (False, True) for e in (False, True)]
    #: ns per report, by (diagnosed, with the extra paths): itself, and with the steps after
    itself: dict[tuple[bool, bool], list[int]] = {kind: [] for kind in kinds}
    spent: dict[tuple[bool, bool], list[int]] = {kind: [] for kind in kinds}
    paths = [0, 0]
    findings = 0

    def steps(n: int) -> None:
        for _ in range(n):
            step()

    try:
        steps(REPORT_EVERY)
        diagnosis.add(flush())  # first-use costs
        for r in range(4 * REPORT_ROUNDS):
            extra, diagnose = r >= 2 * REPORT_ROUNDS, r % 2 == 1
            for name in names if extra else ():
                with instrument.timed(name):
                    pass
            steps(REPORT_EVERY - 2 * AFTER_REPORT)
            t0 = thread_time_ns()
            steps(AFTER_REPORT)
            t1 = thread_time_ns()
            report = flush()
            if diagnose:
                findings += len(diagnosis.add(report))
            reported = thread_time_ns()
            steps(AFTER_REPORT)
            t2 = thread_time_ns()
            itself[diagnose, extra].append(reported - t1)
            spent[diagnose, extra].append((t2 - t1) - (t1 - t0))
            paths[extra] = len(report.nodes)
    finally:
        handle.remove()
        torch.set_num_threads(threads)
        instrument.configure(clock="auto")
    assert paths[1] == paths[0] + EXTRA_PATHS
    assert findings >= 2 * REPORT_ROUNDS  # every diagnosed report had a verdict

    def fixed_and_per_path(
        times: dict[tuple[bool, bool], list[int]], diagnose: bool
    ) -> tuple[float, float]:
        own, more = times[diagnose, False], times[diagnose, True]
        per_path = max(statistics.median(more) - statistics.median(own), 0) / EXTRA_PATHS
        return statistics.median(own) - per_path * paths[0], per_path

    alone, diagnosed = fixed_and_per_path(itself, False), fixed_and_per_path(itself, True)
    rows = (
        ("auto report without diagnosis: fixed part", alone),
        (
            "the diagnosis of an auto report (diagnosed less undiagnosed): fixed part",
            (diagnosed[0] - alone[0], diagnosed[1] - alone[1]),
        ),
        (
            "auto report without diagnosis, with its effect on the next steps: fixed part",
            fixed_and_per_path(spent, False),
        ),
        (
            "auto report diagnosed, with its effect on the next steps: fixed part",
            fixed_and_per_path(spent, True),
        ),
    )

    def note(fixed: float, per_path: float) -> str:
        return f"fixed {fixed / 1e3:.0f} µs + {per_path / 1e3:.2f} µs per path"

    benchmark.extra_info.update(
        label=rows[0][0],
        inner=1,
        value_ns=alone[0],
        per_path_ns=alone[1],
        paths=paths,
        note=f"median of {REPORT_ROUNDS} reports at {paths[0]} paths and {REPORT_ROUNDS} at "
        f"{paths[1]}, each kind; {note(*alone)}",
        more_rows=[
            {"label": label, "value_ns": figures[0], "note": note(*figures)}
            for label, figures in rows[1:]
        ],
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # keeps it a benchmark
