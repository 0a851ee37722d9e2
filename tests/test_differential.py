"""The C accelerator and the pure-Python path record the same thing for the same program.

Hypothesis writes random programs (``tests/differential_programs.py`` describes their
operations): nested regions entered by ``with``, decorator and ``Timer``; exceptions raised
inside them; threads; asyncio tasks, including tasks created in one region and first run in
another; decorated generators kept open across ``yield``; greenlets switching in the middle
of regions; copied contexts; flushes in between. Two long-lived worker processes run each
program, one with the C accelerator and one with ``INSTRUMENT_NO_EXTENSIONS=1``, on a fake
clock, and the test compares every flush's paths, counts, totals, minimums, maximums and
open flags exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instrument._native import speedups

pytest.importorskip("greenlet")
pytestmark = pytest.mark.skipif(speedups is None, reason="the C accelerator is not built")

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "differential_programs.py"

names = st.sampled_from(["a", "b", "c"])
leaves = st.sampled_from(
    [["tick"], ["flush"], ["boom"], ["await"], ["yield"], ["resume"], ["runloop"], ["disable"],
     ["enable"]]
)  # fmt: skip


def _extend(children: st.SearchStrategy[list[Any]]) -> st.SearchStrategy[list[Any]]:
    body = st.lists(children, max_size=4)
    return st.one_of(
        st.builds(
            lambda n, v, b: ["region", n, v, b],
            names,
            st.sampled_from(["with", "decorator", "timer"]),
            body,
        ),
        st.builds(lambda b: ["catch", b], body),
        st.builds(lambda b: ["thread", b], body),
        st.builds(lambda b: ["copy", b], body),
        st.builds(lambda b: ["task", b], body),
        st.builds(lambda b: ["greenlet", b], body),
        st.builds(lambda n, s, i, o: ["gen", n, s, i, o], names, st.integers(0, 3), body, body),
    )


programs = st.lists(st.recursive(leaves, _extend, max_leaves=16), max_size=6)


def _env(pure: bool, generic: bool = False) -> dict[str, str]:
    """The environment of a worker: the C path (with or without its context-layout reads)
    or the pure-Python one."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("INSTRUMENT_NO_EXTENSIONS", None)
    env.pop("INSTRUMENT_GENERIC_CONTEXT", None)
    if pure:
        env["INSTRUMENT_NO_EXTENSIONS"] = "1"
    if generic:
        env["INSTRUMENT_GENERIC_CONTEXT"] = "1"
    return env


class Worker:
    """A process running programs on one path, one JSON line in and out per program."""

    def __init__(self, pure: bool, generic: bool = False) -> None:
        env = _env(pure, generic)
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, program: list[Any]) -> Any:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(program) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"worker died (exit {self.process.poll()}) on {program!r}"
        return json.loads(line)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[Worker, Worker]]:
    native, pure = Worker(pure=False), Worker(pure=True)
    yield native, pure
    native.close()
    pure.close()


def _same_reports(workers: tuple[Worker, Worker], program: list[Any]) -> None:
    native, pure = workers
    assert native.run(program) == pure.run(program), program


#: Programs in the slow tier's run: ``INSTRUMENT_DIFFERENTIAL_EXAMPLES=2000`` for a thorough one.
EXAMPLES = int(os.environ.get("INSTRUMENT_DIFFERENTIAL_EXAMPLES", "60"))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs)
def test_c_and_pure_python_record_the_same(
    workers: tuple[Worker, Worker], program: list[Any]
) -> None:
    _same_reports(workers, program)


@pytest.mark.slow
@pytest.mark.timeout(max(300, EXAMPLES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs)
def test_c_and_pure_python_record_the_same_in_many_programs(
    workers: tuple[Worker, Worker], program: list[Any]
) -> None:
    _same_reports(workers, program)


@pytest.mark.parametrize(
    "program",
    [
        # greenlets switching inside regions
        [
            ["greenlet", [["region", "a", "with", [["yield"], ["region", "b", "with", []]]]]],
            ["greenlet", [["region", "c", "with", [["yield"], ["region", "b", "with", []]]]]],
            ["resume"],
        ],
        # a task created in region a, first run inside region b
        [
            ["region", "a", "with", [["task", [["region", "c", "with", []]]]]],
            ["region", "b", "with", [["runloop"]]],
        ],
        # a decorated generator open across yield while the consumer opens regions
        [["gen", "a", 3, [["tick"]], [["region", "b", "decorator", [["tick"]]]]]],
        # a generator made while instrument is disabled, resumed after it is enabled again
        [["disable"], ["gen", "a", 3, [["tick"]], [["enable"], ["tick"]]]],
        # ... and the other way round
        [["gen", "a", 3, [["tick"]], [["disable"], ["tick"]]], ["enable"]],
        # an exception leaving a region, then a copied context flushing inside a timer
        [
            [
                "region",
                "a",
                "timer",
                [
                    ["catch", [["region", "b", "with", [["boom"]]]]],
                    ["copy", [["region", "c", "with", [["flush"]]]]],
                ],
            ]
        ],
    ],
)
def test_known_differences_are_gone(workers: tuple[Worker, Worker], program: list[Any]) -> None:
    _same_reports(workers, program)


@pytest.fixture(scope="module")
def generic_workers() -> Iterator[tuple[Worker, Worker]]:
    generic, pure = Worker(pure=False, generic=True), Worker(pure=True)
    yield generic, pure
    generic.close()
    pure.close()


HOLDER_TYPE = """
import instrument
from instrument.regions import frames
with instrument.timed("r"):
    print(type(frames._frame.get()).__name__)
"""


@pytest.mark.parametrize("generic", [False, True])
def test_the_generic_c_path_keeps_no_holders(generic: bool) -> None:
    # INSTRUMENT_GENERIC_CONTEXT=1 runs the C path as on a Python whose context layout it
    # does not know: every transition sets the variable to the frame itself
    out = subprocess.run(
        [sys.executable, "-c", HOLDER_TYPE],
        env=_env(pure=False, generic=generic),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    holders = bool(speedups is not None and speedups.CONTEXT_LAYOUT_KNOWN) and not generic
    assert out == ("StackHolder" if holders else "Frame")


@pytest.mark.slow  # two worker processes; the generic path keeps no holders in the default tier
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs)
def test_the_generic_c_path_and_pure_python_record_the_same(
    generic_workers: tuple[Worker, Worker], program: list[Any]
) -> None:
    _same_reports(generic_workers, program)
