"""A reporter's step counter: its state machine, the same on the C and the Python class."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import instrument
from instrument import _state, registry
from instrument._native import speedups
from instrument.stepcounter import StepCounter, _PyStepCounter

CLASSES = [_PyStepCounter] + ([speedups.StepCounter] if speedups is not None else [])
ids = ["python"] + (["c"] if speedups is not None else [])


class Clock:
    """A fake ``_state.now``: every read returns ``t``."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(_state, "now", fake)
    return fake


class Owner:
    """What a reporter gives a counter: ``on_counts`` and ``on_due`` that say they ran."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.counter: Any = None

    def on_counts(self) -> None:
        self.events.append(("counts", self.counter.pending))
        self.counter.pending = None

    def on_due(self) -> str:
        self.events.append(("due", self.counter.run_steps + self.counter.steps))
        return "report"


def made(cls: type, every: int | None, warmup: int) -> tuple[Any, Owner]:
    owner = Owner()
    owner.counter = cls(every, warmup, owner.on_counts, owner.on_due)
    return owner.counter, owner


def state(counter: Any) -> tuple[Any, ...]:
    return (
        counter.every,
        counter.warmup,
        counter.steps,
        counter.warm_steps,
        counter.counted_ns,
        counter.run_steps,
        counter.pending,
        counter.times.take(),
    )


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_a_step_is_its_time_since_the_last_warm_up_steps_apart(cls: type, clock: Clock) -> None:
    clock.t = 100
    counter, owner = made(cls, None, 2)
    for t in (110, 130, 160, 200):
        clock.t = t
        assert counter() is None
    assert (counter.steps, counter.warm_steps, counter.counted_ns) == (4, 2, 30 + 40)
    assert counter.times.take()[:2] == (4, 100)  # 10 + 20 + 30 + 40 ns, four steps
    assert owner.events == []


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_counts_of_a_warm_up_step_are_dropped_the_others_handed_on(cls: type, clock: Clock) -> None:
    counter, owner = made(cls, None, 1)
    counter.pending = [3, None]
    counter()  # warm-up: dropped
    assert counter.pending is None
    counter.pending = [5, 7]
    counter()
    assert owner.events == [("counts", [5, 7])]
    counter()  # none pending: on_counts not called
    assert len(owner.events) == 1


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_a_report_is_due_at_each_multiple_of_every_in_the_run(cls: type, clock: Clock) -> None:
    counter, owner = made(cls, 3, 0)
    results = [counter() for _ in range(7)]
    assert results == [None, None, "report", None, None, "report", None]
    assert owner.events == [("due", 3), ("due", 6)]
    assert counter.end_interval() == 7  # a flush of one's own after 7 steps of the run...
    assert (counter.steps, counter.run_steps) == (0, 7)
    assert [counter() for _ in range(2)] == [None, "report"]  # ...meets the others at 9
    counter.every = None
    assert [counter() for _ in range(6)] == [None] * 6


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_an_interval_ends_with_its_steps_joining_the_run(cls: type, clock: Clock) -> None:
    counter, _ = made(cls, None, 1)
    clock.t = 10
    counter()
    clock.t = 25
    counter()
    assert counter.end_interval() == 2
    assert (counter.steps, counter.warm_steps, counter.counted_ns, counter.run_steps) == (
        0,
        0,
        0,
        2,
    )
    clock.t = 45  # the last tick carries over: this step took 20 ns
    counter()
    assert counter.counted_ns == 20


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_a_step_marks_the_thread_that_steps(cls: type, clock: Clock) -> None:
    counter, _ = made(cls, None, 0)
    seen: list[int | None] = []

    def elsewhere() -> None:
        counter()
        seen.append(registry.stepping_thread)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [thread.ident]
    counter()
    assert registry.stepping_thread == threading.get_ident()


BAD = [
    ("every", 0, "ValueError: every must be a positive int (steps between flushes) or None, got 0"),
    ("every", True, "ValueError"),
    ("every", "5", "ValueError"),
    ("every", 2**63, "OverflowError: every must be at most 2**63 - 1, got 9223372036854775808"),
    ("warmup", -1, "ValueError: warmup must be an int >= 0, got -1"),
    ("warmup", None, "ValueError"),
    ("warmup", 2**64, "OverflowError"),
]


def _outcome(action: Any) -> str:
    try:
        return f"ok: {action()!r}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(("field", "value", "error"), BAD)
def test_bad_values_are_refused_alike_at_construction_and_assignment(
    field: str, value: Any, error: str
) -> None:
    for cls in CLASSES:
        args = {"every": None, "warmup": 0, field: value}
        built = _outcome(lambda c=cls, a=args: c(a["every"], a["warmup"], len, len))
        counter, _ = made(cls, None, 0)
        assigned = _outcome(lambda c=counter: setattr(c, field, value))
        assert built.startswith(error), (cls, built)
        assert assigned.startswith(error), (cls, assigned)
    outcomes = {_outcome(lambda c=cls: setattr(made(c, 1, 0)[0], field, value)) for c in CLASSES}
    assert len(outcomes) == 1, outcomes  # the same message on both


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_what_cannot_be_changed_is_refused(cls: type) -> None:
    counter, _ = made(cls, 1, 0)
    with pytest.raises(AttributeError, match="pending cannot be deleted"):
        del counter.pending
    for field in ("steps", "warm_steps", "counted_ns", "run_steps", "times"):
        with pytest.raises(AttributeError):
            setattr(counter, field, 1)
    with pytest.raises(TypeError, match="needs two callables"):
        cls(1, 0, None, len)
    with pytest.raises(TypeError):
        counter(1)  # a step takes no arguments


@pytest.mark.parametrize("cls", CLASSES, ids=ids)
def test_an_error_of_on_due_or_of_the_clock_propagates(cls: type, clock: Clock) -> None:
    def boom() -> None:
        raise KeyError("due")

    counter = cls(1, 0, len, boom)
    with pytest.raises(KeyError, match="due"):
        counter()
    assert counter.steps == 1  # the step was counted before the flush failed

    def bad_clock() -> str:
        return "later"

    clock_counter, _ = made(cls, 1, 0)
    _state.now = bad_clock  # type: ignore[assignment]
    with pytest.raises(TypeError):
        clock_counter()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.integers(0, 10**6)),
        st.tuples(st.just("pending"), st.integers(0, 9)),
        st.tuples(st.just("end"), st.just(0)),
        st.tuples(st.just("every"), st.one_of(st.none(), st.integers(1, 5))),
        st.tuples(st.just("warmup"), st.integers(0, 4)),
    ),
    max_size=60,
)


@pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")
@settings(max_examples=150, deadline=None)
@given(every=st.one_of(st.none(), st.integers(1, 6)), warmup=st.integers(0, 4), ops=OPS)
def test_any_sequence_leaves_both_classes_in_the_same_state(
    every: int | None, warmup: int, ops: list[tuple[str, Any]]
) -> None:
    fake = Clock()
    saved = _state.now
    _state.now = fake  # type: ignore[assignment]
    try:
        runs = []
        for cls in CLASSES:
            fake.t = 0
            counter, owner = made(cls, every, warmup)
            results = []
            for op, arg in ops:
                if op == "tick":
                    fake.t += arg
                    results.append(counter())
                elif op == "pending":
                    counter.pending = [arg, None]
                elif op == "end":
                    results.append(counter.end_interval())
                else:
                    setattr(counter, op, arg)
            runs.append((results, owner.events, state(counter)))
        assert runs[0] == runs[1]
    finally:
        _state.now = saved  # type: ignore[assignment]


def test_reporters_count_steps_with_the_c_class_where_built() -> None:
    reporter = instrument.Reporter(every=None, sinks=[])
    assert type(reporter.end_step) is StepCounter
    assert StepCounter is (speedups.StepCounter if speedups is not None else _PyStepCounter)
    reporter.close(flush=False)


def test_auto_ticks_a_step_of_a_subclass_or_set_on_the_instance() -> None:
    """``end_step`` is the counter only while ``step`` is ``Reporter.step``: a subclass's
    ``step`` (or one an integration sets on the instance) is what ``auto`` calls."""

    class Counting(instrument.Reporter):
        ticks = 0

        def step(self, samples: int | None = None, tokens: int | None = None) -> Any:
            Counting.ticks += 1
            return super().step(samples, tokens)

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reporter = Counting(every=None, sinks=[])
    seen: list[int] = []
    reporter.step = lambda *a, **k: seen.append(1)  # type: ignore[method-assign]
    assert reporter.end_step is reporter.step
    del reporter.step
    handle = instrument.auto(model, opt, reporter=reporter, collectives=False)
    try:
        for _ in range(3):
            model(torch.zeros(1, 2)).sum().backward()
            opt.step()
        assert Counting.ticks == 3
        assert reporter.steps == 3
    finally:
        handle.remove()
        reporter.close(flush=False)


def test_auto_ends_a_step_without_a_python_frame_of_the_reporter() -> None:
    """After the first steps, ``auto``'s optimizer step calls the step counter itself: on
    the C path no Python code of the reporter or the counter runs in a step that does not
    flush (a ``reporter.step`` tick ran three frames there)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = instrument.auto(model, opt, every=100, sinks=[], collectives=False)
    for _ in range(3):
        model(torch.zeros(1, 2)).sum().backward()
        opt.step()
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename.replace("\\", "/"))

    sys.setprofile(profile)
    try:
        opt.step()
    finally:
        sys.setprofile(None)
    handle.remove()
    assert handle.reporter.steps == 0  # closed (remove() flushed the 4 steps)
    reporter_code = {f for f in seen if f.endswith(("/instrument/reporter.py", "/stepcounter.py"))}
    if speedups is None:
        assert reporter_code  # the pure path runs the Python counter
    else:
        assert not reporter_code, reporter_code
