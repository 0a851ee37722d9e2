"""Where the time of ``with instrument.timed("x")`` goes, against two ``perf_counter_ns`` reads.

    python tools/with_floor.py [--rounds 400]

Builds ``tools/with_floor.c`` (a context manager whose ``__enter__``/``__exit__`` are bound
once, like instrument's C regions, doing nothing or reading ``CLOCK_MONOTONIC`` at enter and
exit) in a temporary directory, then times, in paired rounds (``tests/benchmarks/paired.py``;
every row in each round, the order rotating), each row's cost above an empty loop:

- two ``perf_counter_ns()`` reads: the baseline of the clock-pair target;
- ``with`` a bound-once no-op C context manager: the ``with`` statement itself;
- the same reading the clock twice in C: the floor of any ``with`` region on this clock;
- that floor behind ``instrument``'s ``Dispatch`` (``timed("x")``'s lookup);
- ``with region`` (an instrument region looked up once) and ``with instrument.timed("x")``.

The ratios are the median of per-round added costs over the baseline's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter_ns
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
N = 512  # operations per round, as the clock-pair benchmark


def build_probe() -> Any:
    """Compile tools/with_floor.c and import it."""
    from setuptools import Extension, setup

    out = Path(tempfile.mkdtemp(prefix="with_floor"))
    ext = Extension("with_floor", [str(ROOT / "tools" / "with_floor.c")])
    setup(
        name="with_floor",
        ext_modules=[ext],
        script_args=["-q", "build_ext", "--build-lib", str(out), "--build-temp", str(out)],
    )
    path = next(out.glob("with_floor*.so"))
    spec = importlib.util.spec_from_file_location("with_floor", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    rounds = parser.parse_args().rounds
    sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from paired import Contender, run_paired

    import instrument
    import instrument.testing
    from instrument._native import speedups

    probe = build_probe()
    noop, clocked = probe.Floor(False), probe.Floor(True)
    timed = instrument.timed
    region = timed("x")
    lookup = speedups.Dispatch({"x": clocked}, timed) if speedups is not None else None

    def pairs() -> None:
        for _ in range(N):
            perf_counter_ns()
            perf_counter_ns()

    def empty() -> None:
        for _ in range(N):
            pass

    def with_noop() -> None:
        for _ in range(N):
            with noop:
                pass

    def with_clocked() -> None:
        for _ in range(N):
            with clocked:
                pass

    def with_lookup() -> None:
        assert lookup is not None
        for _ in range(N):
            with lookup("x"):
                pass

    def with_region() -> None:
        for _ in range(N):
            with region:
                pass

    def with_timed() -> None:
        for _ in range(N):
            with timed("x"):
                pass

    def timed_alone() -> None:
        for _ in range(N):
            timed("x")

    def cpu() -> None:
        instrument.testing.reset()
        instrument.configure(clock="cpu")

    rows = [
        Contender("two perf_counter_ns reads", pairs, None, N, baseline=True, above="empty"),
        Contender("with: bound-once no-op C CM", with_noop, None, N, above="empty"),
        Contender("with: + two C clock reads (floor)", with_clocked, None, N, above="empty"),
        Contender("with d('x'): floor + timed()'s lookup", with_lookup, None, N, above="empty"),
        Contender("with region (looked up once)", with_region, cpu, N, above="empty"),
        Contender('with instrument.timed("x")', with_timed, cpu, N, above="empty"),
        Contender('instrument.timed("x") alone', timed_alone, None, N, above="empty"),
        Contender("empty", empty, None, N),
    ]
    if lookup is None:
        rows = [r for r in rows if r.fn is not with_lookup]
    _, per = run_paired(rows, rounds=rounds)
    base = [a - b for a, b in zip(per[rows[0].label], per["empty"], strict=True)]
    print(f"{'row':42s} {'added ns (median)':>18s} {'ratio to the pair':>18s}")
    for row in rows[:-1]:
        added = [a - b for a, b in zip(per[row.label], per["empty"], strict=True)]
        ratio = statistics.median(added) / statistics.median(base)
        print(f"{row.label:42s} {statistics.median(added):18.1f} {ratio:18.2f}")
    print(f"C accelerator: {'on' if speedups is not None else 'off'}; {rounds} rounds of {N}")


if __name__ == "__main__":
    main()
