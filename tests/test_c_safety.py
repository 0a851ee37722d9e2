"""No Python caller can crash the C accelerator, and both paths refuse the same things.

The adversarial calls live in tests/c_safety_probes.py and run in one subprocess per
section and path, so a segfault fails a test instead of killing pytest.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import instrument
from instrument import registry
from instrument._native import speedups

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "tests" / "c_safety_probes.py"
needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")
#: the probes that call into instrument._speedups directly (by their first name)
_C_NAMES = {
    "set_top",
    "bind",
    "bind_stack",
    "bind_thread_stack",
    "bucket",
    "NodeBase",
    "CallTimer",
    "Active",
    "bool",
    "Dispatch",
    "take_tree",
    "bind_steps",
    "StepCounter",
    "BackwardCall",
    "StepGuard",
    "StandAside",
    "StepCall",
}


def _run_probes(section: str, pure: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("INSTRUMENT_NO_EXTENSIONS", None)
    if pure:
        env["INSTRUMENT_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, str(PROBES), section],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"the probes died ({out.returncode}):\n{out.stderr[-3000:]}"
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    results = {line["probe"]: line["outcome"] for line in lines}
    assert "after" in results["recorded after the probes"], "regions stopped recording"
    return results


@functools.cache
def _probes(section: str) -> tuple[dict[str, str], dict[str, str]]:
    """The outcomes of one section of probes on the C path and on the pure-Python path."""
    return _run_probes(section, pure=False), _run_probes(section, pure=True)


def _kind(outcome: str) -> str:
    return "ok" if outcome.startswith("ok: ") else outcome.split(":", 1)[0]


@pytest.mark.slow  # two subprocesses: the C path and pure Python
@pytest.mark.timeout(300)
def test_deleting_a_field_is_refused_and_the_region_still_works() -> None:
    for results in _probes("fields"):
        assert results["del r.name; with r"] == (
            "AttributeError: instrument: the region field 'name' cannot be deleted "
            "(it is set once, at construction)"
        )
        assert results["region still works"] == "ok: 'entered and exited'"
        assert "x" in results["recorded after the probes"]


def _unqualified(said: str) -> str:
    """``said`` with ``'pkg.module.Type' object`` written ``'Type' object``."""
    return re.sub(r"'(?:\w+\.)+(\w+)' object", r"'\1' object", said)


@pytest.mark.slow  # two subprocesses: the C path and pure Python
@pytest.mark.timeout(300)
def test_field_rules_are_the_same_on_both_paths() -> None:
    c, pure = _probes("fields")
    fields = [p for p in c if p.startswith(("del ", "region.", "node.", "uninitialized"))]
    assert len(fields) == 29
    # Python 3.13 names a type by its qualified name in some attribute errors (a slot's,
    # "%T") and not in others: the same error, told two ways
    assert {p: _unqualified(c[p]) for p in fields} == {p: _unqualified(pure[p]) for p in fields}
    assert c["node.children = None"] == (
        "TypeError: instrument: the path node field 'children' must be a dict, got None"
    )
    assert c["region.level = 'a'"].startswith("TypeError: ")
    assert c["region.clock = 5"] == "ok: None"  # a clock is checked by timed(), not here


@pytest.mark.slow  # two subprocesses: the C path and pure Python
@pytest.mark.timeout(300)
def test_the_call_wrapper_takes_args_and_kwargs_as_a_call_would() -> None:
    c, pure = _probes("wrapper")
    calls = [p for p in c if p.startswith("wrapper ")]
    assert len(calls) == 7
    assert c["wrapper [1, 2], {}"] == "ok: ((1, 2), {})"
    assert c["wrapper iter([3]), {}"] == "ok: ((3,), {})"
    assert _kind(c["wrapper (), [1]"]) == "TypeError"
    for p in calls:
        assert _kind(c[p]) == _kind(pure[p]), p
        if _kind(c[p]) == "ok":
            assert c[p] == pure[p]


@pytest.mark.slow  # two subprocesses: the C path and pure Python
@pytest.mark.timeout(300)
def test_a_malformed_frame_raises_instead_of_crashing() -> None:
    c, pure = _probes("frames")
    frames = [p for p in c if p.startswith("frame variable")]
    assert len(frames) == 4
    for p in frames:
        # the pure path reads only frame.node of a parent, so it accepts a short tuple there
        assert c[p] == "RuntimeError: instrument: malformed region frame"
        assert _kind(pure[p]) != "ok" or "PathNode" in p, (p, pure[p])


@needs_c
@pytest.mark.timeout(300)
def test_every_c_entry_point_checks_its_arguments() -> None:
    c = _run_probes("c", pure=False)
    accepted = {
        "NodeBase().take()",
        "bool(Active(r))",
        "Dispatch({'x': 1}, len)('x')",
        "Dispatch({}, len)([1])",
    }
    probes = [p for p in c if p.split("(")[0] in _C_NAMES or p.startswith("_")]
    assert len(probes) >= 30
    for p in probes:
        assert (_kind(c[p]) == "ok") == (p in accepted), (p, c[p])
    assert c["set_top(5)"].startswith("TypeError: set_top() needs a region frame")
    assert c["_cpu_exit()"] == "TypeError: __exit__() takes 3 arguments (exc_type, exc, tb), got 0"


@pytest.mark.parametrize("make", ["node", "region"])
def test_gc_sees_the_type_of_an_instance_once(make: str) -> None:
    # A heap subclass's instance holds one reference to its type, which CPython's
    # subtype_traverse already visits: visiting it again in the C tp_traverse would make the
    # collector count it twice (a debug build aborts in gc.collect()).
    obj: object = registry.PathNode("probe", None) if make == "node" else instrument.timed("gc")
    assert gc.get_referents(obj).count(type(obj)) == 1
