"""A timed function pickles by reference, as a plain function does, so process pools take
it (the C path in this process, the pure-Python path in a subprocess)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import instrument


@instrument.timed("square")
def square(x: int) -> int:
    return x * x


@instrument.timed
def numbers(n: int) -> Iterator[int]:
    yield from range(n)


def test_a_timed_function_pickles_by_reference() -> None:
    assert pickle.loads(pickle.dumps(square)) is square
    assert pickle.loads(pickle.dumps(numbers)) is numbers
    assert pickle.loads(pickle.dumps(square, protocol=0)) is square


@pytest.mark.timeout(60)
def test_a_process_pool_maps_a_timed_function() -> None:
    fork = multiprocessing.get_context("fork")
    with fork.Pool(2) as pool:
        assert pool.map(square, range(5)) == [0, 1, 4, 9, 16]
    with ProcessPoolExecutor(2, mp_context=fork) as executor:
        assert list(executor.map(square, range(5))) == [0, 1, 4, 9, 16]


def test_a_local_timed_function_fails_to_pickle_as_the_plain_one_does() -> None:
    def local(x: int) -> int:
        return x

    with pytest.raises(Exception, match="local") as plain:
        pickle.dumps(local)
    with pytest.raises(type(plain.value), match="local"):
        pickle.dumps(instrument.timed("local")(local))


@pytest.mark.timeout(120)
def test_the_pure_python_path_pickles_the_same(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(
        textwrap.dedent(
            """
            import instrument

            @instrument.timed("square")
            def square(x):
                return x * x
            """
        )
    )
    code = textwrap.dedent(
        """
        import multiprocessing, pickle, jobs
        from instrument._native import speedups
        assert speedups is None
        assert pickle.loads(pickle.dumps(jobs.square)) is jobs.square
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print(pool.map(jobs.square, range(4)))
        """
    )
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "INSTRUMENT_NO_EXTENSIONS": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 4, 9]"
