"""Adversarial calls into the region and path-node machinery, one per line of output.

Run as a script (``python tests/c_safety_probes.py [section ...]``) by
tests/test_c_safety.py, one subprocess per section so that a crash shows as one failing
test; prints one JSON object per probe:
``{"probe": label, "outcome": "ok: <repr>" or "<ExceptionType>: <message>"}``. The probes
marked C-only reach into ``instrument._speedups`` and run only when it is loaded.
"""

from __future__ import annotations

import contextvars
import gc
import json
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import instrument
from instrument import registry
from instrument._native import speedups
from instrument.regions import frames
from instrument.regions.region import CpuRegion


def probe(label: str, action: Callable[[], Any]) -> None:
    try:
        outcome = f"ok: {action()!r}"
    except Exception as exc:  # every probe reports what it raised, and the run goes on
        outcome = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"probe": label, "outcome": outcome}), flush=True)


def enter_exit(region: Any) -> str:
    with region:
        pass
    return "entered and exited"


def delete_name_then_enter() -> str:
    """``r = timed("x"); del r.name; with r: pass`` (must raise, never crash)."""
    r = instrument.timed("x")
    try:
        del r.name
    finally:
        enter_exit(r)
    return "deleted"


def field_probes() -> None:
    r = instrument.timed("fields")
    node = registry.ROOT
    probe("del r.name; with r", delete_name_then_enter)
    for field in ("name", "clock", "level", "_now"):
        probe(f"del region.{field}", lambda f=field: delattr(r, f))
    for field, value in [
        ("name", 3),
        ("name", None),
        ("level", "a"),
        ("level", -1),
        ("level", True),
        ("level", 2**70),
        ("_now", 3),
        ("clock", 5),
    ]:
        probe(f"region.{field} = {value!r}", lambda f=field, v=value: setattr(r, f, v))
    r.clock = None
    probe("region still works", lambda: enter_exit(r))
    for field in ("name", "path", "parent", "children", "mode", "level"):
        probe(f"del node.{field}", lambda f=field: delattr(node, f))
    for field, value in [
        ("children", None),
        ("children", [1]),
        ("parent", 3),
        ("name", b"x"),
        ("path", 1.5),
        ("mode", None),
        ("level", "a"),
    ]:
        probe(f"node.{field} = {value!r}", lambda f=field, v=value: setattr(node, f, v))
    blank = CpuRegion.__new__(CpuRegion)
    probe("uninitialized region: enter", blank.__enter__)
    probe("uninitialized region: exit", lambda: blank.__exit__(None, None, None))
    probe("uninitialized region: name", lambda: blank.name)


def wrapper_probes() -> None:
    @instrument.timed("wrapped")
    def f(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    call = f._self_wrapper
    plain = f.__wrapped__
    for label, args, kwargs in [
        ("[1, 2], {}", [1, 2], {}),
        ("(1,), mappingproxy", (1,), types.MappingProxyType({"a": 1})),
        ("iter([3]), {}", iter([3]), {}),
        ("[1, 2], None", [1, 2], None),
        ("(), [1]", (), [1]),
        ("5, {}", 5, {}),
        ("None, None", None, None),
    ]:
        probe(f"wrapper {label}", lambda a=args, k=kwargs: call(plain, None, a, k))


def junk_frame_probes() -> None:
    r = instrument.timed("frames")
    for junk in (5, (1, 2, 3, 4, 5), (registry.ROOT, 0), None):

        def in_task(j: Any = junk) -> str:
            frames._frame.set(j)
            return enter_exit(r)

        probe(
            f"frame variable = {junk!r} in a task: enter",
            lambda t=in_task: contextvars.copy_context().run(t),
        )


def c_only_probes() -> None:
    assert speedups is not None
    r = instrument.timed("c-only")
    blank_frame = frames.Frame(speedups.NodeBase(), 0, None, None, None)
    base = speedups.RegionBase
    probe("set_top(5)", lambda: speedups.set_top(5))
    probe("set_top(None)", lambda: speedups.set_top(None))
    probe("set_top((1, 2, 3, 4, 5))", lambda: speedups.set_top((1, 2, 3, 4, 5)))
    probe(
        "set_top(blank node frame)",
        lambda: speedups.set_top(blank_frame),
    )
    probe("_cpu_exit()", lambda: base._cpu_exit(r))
    probe("_cpu_exit(1)", lambda: base._cpu_exit(r, 1))
    probe("_cpu_exit(1, 2, 3, 4)", lambda: base._cpu_exit(r, 1, 2, 3, 4))
    probe("_skip_exit()", lambda: base._skip_exit(r))
    probe("_cpu_enter(5)", lambda: base._cpu_enter(5))
    probe("_cpu_exit on a plain RegionBase", lambda: base._cpu_exit(base(), None, None, None))
    probe("_cpu_enter on a plain RegionBase", lambda: base._cpu_enter(base()))
    var = frames._frame
    probe("bind_stack(junk)", lambda: speedups.bind_stack(1, 2))
    probe("bind_stack(frame var, junk frame)", lambda: speedups.bind_stack(var, (1, 2, 3, 4, 5)))
    probe("bind_stack(frame var, blank node)", lambda: speedups.bind_stack(var, blank_frame))
    probe("bind_stack()", lambda: speedups.bind_stack())
    probe("bind(junk)", lambda: speedups.bind(1, 2, 3, 4))
    probe("bind(clock, junk classes)", lambda: speedups.bind(time.perf_counter_ns, int, int, len))
    probe("bind(not callable)", lambda: speedups.bind(3, type(r), type(r), len))
    probe(
        "bind(coroutine timer not callable)",
        lambda: speedups.bind(time.perf_counter_ns, type(r), type(r), 3),
    )
    probe("bind(three arguments)", lambda: speedups.bind(time.perf_counter_ns, type(r), type(r)))
    probe("bind()", lambda: speedups.bind())
    probe("bind_thread_stack()", lambda: speedups.bind_thread_stack())
    probe("bucket('x')", lambda: speedups.bucket("x"))
    probe("bucket(2**80)", lambda: speedups.bucket(2**80))
    probe("NodeBase().add('x')", lambda: speedups.NodeBase().add("x"))
    probe("NodeBase().add(2**80)", lambda: speedups.NodeBase().add(2**80))
    probe("NodeBase().take()", lambda: speedups.NodeBase().take())
    probe("take_tree(5, 0, None, None)", lambda: speedups.take_tree(5, 0, None, None))
    probe(
        "take_tree(node, 'x', None, None)",
        lambda: speedups.take_tree(blank_frame.node, "x", None, None),
    )
    probe(
        "take_tree(node, 0, [1], None)", lambda: speedups.take_tree(blank_frame.node, 0, [1], None)
    )
    probe("take_tree(node, 0, None, 5)", lambda: speedups.take_tree(blank_frame.node, 0, None, 5))
    probe(
        "take_tree(node, 0, None, None, 5)",
        lambda: speedups.take_tree(blank_frame.node, 0, None, None, 5),
    )
    probe(
        "take_tree(node, 0, None, None, {node: 5})",
        lambda: speedups.take_tree(blank_frame.node, 0, None, None, {blank_frame.node: 5}),
    )
    probe("NodeBase().drain_into(5)", lambda: speedups.NodeBase().drain_into(5))
    probe("NodeBase().drain_into([5])", lambda: speedups.NodeBase().drain_into([5]))
    probe("NodeBase().drain_into()", lambda: speedups.NodeBase().drain_into())
    node = speedups.NodeBase()
    node.add(3)
    probe("node.drain_into([node])", lambda: node.drain_into([node]))
    probe("node.drain_into((node,))", lambda: node.drain_into((node,)))
    probe("NodeBase().name", lambda: speedups.NodeBase().name)
    probe("NodeBase().level = 2**80", lambda: setattr(speedups.NodeBase(), "level", 2**80))
    probe("CallTimer()", lambda: speedups.CallTimer())
    probe("CallTimer(5)", lambda: speedups.CallTimer(5))
    probe("CallTimer(r)(1)", lambda: speedups.CallTimer(r)(1))
    probe(
        "CallTimer(r)(len, None, (1,), {}, x=1)",
        lambda: speedups.CallTimer(r)(len, None, (1,), {}, x=1),
    )
    probe("CallTimer(r)(5, None, (), {})", lambda: speedups.CallTimer(r)(5, None, (), {}))
    probe("CallTimer(blank region)", lambda: speedups.CallTimer(base())(len, None, ([],), {}))
    probe("Active(5)", lambda: speedups.Active(5))
    probe("bool(Active(r))", lambda: bool(speedups.Active(r)))
    probe("Dispatch(5, 5)", lambda: speedups.Dispatch(5, 5))
    probe("Dispatch({}, 5)('x')", lambda: speedups.Dispatch({}, 5)("x"))
    probe("Dispatch({'x': 1}, len)('x')", lambda: speedups.Dispatch({"x": 1}, len)("x"))
    probe("Dispatch({}, len)([1])", lambda: speedups.Dispatch({}, len)([1]))
    steps = speedups.StepCounter
    probe("bind_steps(1, 2)", lambda: speedups.bind_steps(1, 2))
    probe("StepCounter()", lambda: steps())
    probe("StepCounter(0, 0, len, len)", lambda: steps(0, 0, len, len))
    probe("StepCounter(None, 0, 5, len)", lambda: steps(None, 0, 5, len))
    probe("StepCounter(None, 0, len, len)(1)", lambda: steps(None, 0, len, len)(1))
    probe("StepCounter(uninitialized)()", lambda: steps.__new__(steps)())
    probe("StepCounter(uninitialized).times", lambda: steps.__new__(steps).times)
    probe("StepCounter(...).warmup = 'x'", lambda: setattr(steps(1, 0, len, len), "warmup", "x"))
    probe("BackwardCall()", lambda: speedups.BackwardCall())
    probe(
        "BackwardCall(len, 5, len, len, len, {})",
        lambda: speedups.BackwardCall(len, 5, len, len, len, {}),
    )
    probe(
        "BackwardCall(len, r, len, len, len, [])",
        lambda: speedups.BackwardCall(len, r, len, len, len, []),
    )
    probe(
        "BackwardCall(len, r, len, none, 'x', {})()",
        lambda: speedups.BackwardCall(len, r, len, lambda: None, lambda: "x", {})(),
    )
    guard = speedups.StepGuard
    none = lambda: None  # noqa: E731
    probe("StepGuard()", lambda: guard())
    probe("StepGuard(len, 5, 1, 2, None, len)", lambda: guard(len, 5, 1, 2, None, len))
    probe("StepGuard(len, r, 1, 2, 3, len)", lambda: guard(len, r, 1, 2, 3, len))
    probe("StepGuard(len, r, 1, 2, None, len)(5)", lambda: guard(len, r, 1, 2, None, len)(5))
    probe("StepGuard(len, r, 1, 2, None, none)(5)", lambda: guard(len, r, 1, 2, None, none)(5))
    probe("StepGuard(len, r, 1, 2, None, none)()", lambda: guard(len, r, 1, 2, None, none)())
    probe("StepCall().running = 1", lambda: setattr(speedups.StepCall(), "running", 1))
    probe("StepCall().nested = 'x'", lambda: setattr(speedups.StepCall(), "nested", "x"))
    probe("StepCall(5)", lambda: speedups.StepCall(5))
    probe("StandAside()", lambda: speedups.StandAside())
    probe("StandAside(5, 5)", lambda: speedups.StandAside(5, 5))
    probe("StandAside(5, len)(1)", lambda: speedups.StandAside(5, len)(1))
    probe(
        "BackwardCall(..., namespace=x)(1, k=2)",
        lambda: speedups.BackwardCall(len, r, len, len, len, {}, namespace={}),
    )


SECTIONS = {
    "fields": field_probes,
    "wrapper": wrapper_probes,
    "frames": junk_frame_probes,
    "c": c_only_probes,
}


def main(sections: list[str]) -> None:
    """Run the named sections (all by default), then check that regions still record."""
    for name in sections or list(SECTIONS):
        if name != "c" or speedups is not None:
            SECTIONS[name]()
    gc.collect()
    with instrument.timed("after"):
        pass
    print(
        json.dumps(
            {"probe": "recorded after the probes", "outcome": sorted(registry.ROOT.children)}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
