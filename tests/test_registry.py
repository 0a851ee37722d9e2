"""The registry under threads, flushes racing with records, and fork."""

from __future__ import annotations

import os
import sys
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

import instrument
from instrument import registry
from instrument._native import speedups
from instrument.testing import FakeClock


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_threads_counts_add_up_while_flushing(
    fast_switching: None, reporter: instrument.Reporter
) -> None:
    n_threads, calls = 4, 3000
    start = threading.Barrier(n_threads + 1)

    @instrument.timed("work")
    def work() -> None:
        pass

    def run(i: int) -> None:
        start.wait()
        for _ in range(calls):
            with instrument.timed(f"thread{i}"):
                work()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    start.wait()
    reports = []
    while any(t.is_alive() for t in threads):
        reports.append(reporter.flush())
    for t in threads:
        t.join()
    reports.append(reporter.flush())
    reports.append(reporter.flush())  # picks up any record that raced the previous swap

    totals: dict[str, int] = {}
    for report in reports:
        for node in report.nodes:
            totals[node.path] = totals.get(node.path, 0) + node.count
    assert totals == {
        **{f"thread{i}": calls for i in range(n_threads)},
        **{f"thread{i}/work": calls for i in range(n_threads)},
    }
    assert len(reports) > 2  # flushes really did race the threads


def test_paths_never_cross_threads(reporter: instrument.Reporter) -> None:
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with instrument.timed("other"):
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with instrument.timed("main"):
        t.start()
        inside.wait(5)
        with instrument.timed("child"):
            pass
        release.set()
        t.join()
    assert set(reporter.flush().paths()) == {"main", "main/child", "other"}


def test_stats_of_finished_threads_are_kept_until_flush(reporter: instrument.Reporter) -> None:
    def run() -> None:
        for _ in range(10):
            with instrument.timed("short-lived"):
                pass

    t = threading.Thread(target=run)
    t.start()
    t.join()
    del t
    assert reporter.flush()["short-lived"].count == 10
    assert "short-lived" not in reporter.flush()


def test_memory_is_bounded_by_paths_not_calls(reporter: instrument.Reporter) -> None:
    # host clock: a device clock keeps one pending event pair per call until the flush
    instrument.configure(clock="cpu")

    def record(n: int) -> None:
        for _ in range(n):
            with instrument.timed("hot"):
                pass

    record(registry.CHUNK + 1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        record(registry.CHUNK * 10)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # at most one buffer of CHUNK ints (pure Python); nothing per call with the C path
    assert grown < 64 * registry.CHUNK
    assert reporter.flush()["hot"].count == registry.CHUNK * 11 + 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_empty(reporter: instrument.Reporter) -> None:
    with instrument.timed("parent"):
        pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            with instrument.timed("child"):
                pass
            paths = instrument.Reporter(every=None).flush().paths()
            os.write(write, repr(paths).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_paths = f.read()
    os.waitpid(pid, 0)
    assert child_paths == "('child',)"
    assert reporter.flush().paths() == ("parent",)


@pytest.mark.skipif(speedups is not None, reason="the C path records in place, with no buffer")
def test_a_record_appended_after_a_flush_swapped_its_buffer_lands_in_the_next_report(
    clock: FakeClock, reporter: instrument.Reporter
) -> None:
    """The pure-Python hot path loads ``node.buf`` and then appends; a flush in between
    swaps the buffer out. The append still lands — in the next report, never nowhere."""
    with instrument.timed("x"):
        clock.advance(1.0)
    node = registry.ROOT.children["x"]
    held = node.buf  # what a recording thread holds when the flush swaps it
    first = reporter.flush()
    held.append(2_000_000_000)  # that thread's append, after the swap
    second = reporter.flush()
    assert (first["x"].count, first["x"].total) == (1, 1.0)
    assert (second["x"].count, second["x"].total) == (1, 2.0)
    assert reporter.flush().get("x") is None  # and only once
