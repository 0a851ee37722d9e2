"""Random nested regions, with exceptions, against a simple reference model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import instrument
from instrument.testing import FakeClock, capture_reports, use_clock

names = st.sampled_from(["a", "b", "c", "data", "fwd"])
micros = st.integers(min_value=0, max_value=5_000)
Block = tuple[str, int, list[Any], int, bool]

blocks = st.recursive(
    st.tuples(names, micros, st.just([]), micros, st.booleans()),
    lambda inner: st.tuples(names, micros, st.lists(inner, max_size=3), micros, st.booleans()),
    max_leaves=15,
)


class Boom(Exception):
    pass


def run(block: Block, clock: FakeClock, as_decorator: bool) -> None:
    name, pre, children, post, raises = block

    def body() -> None:
        clock.advance(pre * 1e-6)
        for child in children:
            try:
                run(child, clock, not as_decorator)
            except Boom:
                pass
        if raises:
            raise Boom(name)
        clock.advance(post * 1e-6)

    if as_decorator:
        instrument.timed(name)(body)()
    else:
        with instrument.timed(name):
            body()


def expected(block: Block, prefix: str, out: dict[str, list[int]]) -> int:
    name, pre, children, post, raises = block
    path = f"{prefix}/{name}" if prefix else name
    duration = pre + sum(expected(c, path, out) for c in children) + (0 if raises else post)
    count_total = out.setdefault(path, [0, 0])
    count_total[0] += 1
    count_total[1] += duration
    return duration


def check_nesting(program: list[Block], decorators: bool) -> None:
    clock = FakeClock()
    model: dict[str, list[int]] = {}
    with use_clock(clock), capture_reports() as reports:
        for block in program:
            try:
                run(block, clock, decorators)
            except Boom:
                pass
            expected(block, "", model)
        assert instrument.current_path() == ""
    report = reports[-1]
    assert set(report.paths()) == set(model)
    for path, (count, total_us) in model.items():
        node = report[path]
        assert node.count == count
        assert round(node.total * 1e6) == total_us
        kids = sum(model[p][1] for p in model if p.rpartition("/")[0] == path)
        assert round(node.self * 1e6) == total_us - kids


programs = given(st.lists(blocks, min_size=1, max_size=4), st.booleans())


@settings(max_examples=25, deadline=None)
@programs
def test_random_nesting_matches_reference(program: list[Block], decorators: bool) -> None:
    check_nesting(program, decorators)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@programs
def test_random_nesting_matches_reference_in_many_programs(
    program: list[Block], decorators: bool
) -> None:
    check_nesting(program, decorators)
