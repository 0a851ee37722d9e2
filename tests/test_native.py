"""The C accelerator and the pure-Python path give the same numbers and pass the same tests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instrument import registry
from instrument._native import speedups
from instrument.stats import NBUCKETS, Accumulator, bucket_counts

needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")
ROOT = Path(__file__).resolve().parent.parent


def _values() -> list[int]:
    rng = random.Random(0)
    edges = [0, 1, 2, 3, 7, 8, 9, 1023, 1024, 1025, 2**40, 2**53]  # up to 104 days
    return edges + [min(int(rng.lognormvariate(10, 4)), 2**53) for _ in range(5000)]


@needs_c
def test_c_buckets_match_python_buckets() -> None:
    assert speedups is not None
    for v in _values():
        assert bucket_counts([v]) == {speedups.bucket(v): 1}, v
    assert speedups.NBUCKETS == NBUCKETS


@needs_c
def test_c_node_statistics_match_the_python_accumulator() -> None:
    assert speedups is not None
    values = _values()
    node = speedups.NodeBase()
    for v in values:
        node.add(v)
    acc = Accumulator()
    acc.add_batch(values)
    assert node.take() == acc.summary()  # the same floats, bit for bit
    assert node.take() is None  # take() resets
    node.add(-5)  # a clock that went backwards counts as zero, as in Python
    assert node.take() == (1, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@needs_c
@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=2**20),
            st.integers(min_value=0, max_value=2**53),
            st.integers(min_value=2**53, max_value=2**60),  # beyond exact doubles
        ),
        min_size=1,
        max_size=60,
    )
)
def test_c_summary_equals_the_python_summary_for_any_durations(values: list[int]) -> None:
    """Mean, std and percentiles computed in C equal Python's exact-integer arithmetic,
    beyond 2**53 and where n * sumsq overflows 128 bits too."""
    assert speedups is not None
    node = speedups.NodeBase()
    for v in values:
        node.add(v)
    acc = Accumulator()
    acc.add_batch(values)
    assert node.take() == acc.summary()


def test_pure_python_path_is_selected_by_the_environment_variable() -> None:
    code = "from instrument._native import speedups; print(speedups is None)"
    env = {**os.environ, "INSTRUMENT_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True", out.stderr


@needs_c
def test_registry_nodes_use_the_c_path_when_built() -> None:
    assert speedups is not None
    assert isinstance(registry.ROOT, speedups.NodeBase)


@pytest.mark.slow  # the core suite again, in a subprocess
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    speedups is None or os.environ.get("INSTRUMENT_NO_EXTENSIONS") == "1",
    reason="this run is already on the pure-Python path",
)
def test_core_suite_passes_on_the_pure_python_path() -> None:
    env = {**os.environ, "INSTRUMENT_NO_EXTENSIONS": "1"}
    tests = [
        "tests/test_region.py",
        "tests/test_registry.py",
        "tests/test_property.py",
        "tests/test_reporter.py",
        "tests/test_open_regions.py",
        "tests/test_cuda_seam.py",
        "tests/test_auto.py",
        "tests/test_stepcounter.py",
    ]
    both_tiers = ["-m", "slow or not slow"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *both_tiers, *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


@needs_c
def test_the_timed_wrapper_types_derive_from_wrapt_without_a_warning() -> None:
    """Python 3.12 and 3.13 warn, and 3.14 refuses, an immutable type over a mutable base
    (wrapt's): the C wrapper types are mutable, as their bases are."""
    import warnings

    import wrapt

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        types = speedups.timed_function_types(wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)
    assert [t.__name__ for t in types] == [
        "TimedFunctionWrapper",
        "TimedCallableWrapper",
        "TimedBoundFunctionWrapper",
    ]
